#include "engine/intake.h"

#include <filesystem>

#include "chat/model_chat.h"
#include "core/error.h"
#include "gguf/gguf.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

namespace tandem {

Intake::Intake(const Model& model, int32_t max_context)
    : tok_(model.tokenizer()), max_context_(max_context), model_path_(model.file().path()),
      model_name_(std::filesystem::path(model.file().path()).filename().string()) {
  try {
    chat_ = chat_template_for(model.file());
  } catch (const Error& e) {
    // The reason names the file; clients see only its name, not where it lives.
    std::string why = e.what();
    const std::string& path = model.file().path();
    if (!path.empty())
      for (size_t at = why.find(path); at != std::string::npos; at = why.find(path, at + model_name_.size()))
        why.replace(at, path.size(), model_name_);
    chat_error_ = why;
  }
}

int32_t Intake::n_vocab() const { return tok_.n_vocab(); }

std::vector<int32_t> Intake::prompt(std::string_view text) const { return tok_.encode(text, true, true); }

ChatPrompt Intake::chat(const std::vector<ChatMessage>& messages, const std::string& system) const {
  if (!chat_) fail(ErrorKind::kUnsupported, "chat is not available for this model: {}", chat_error_);
  std::vector<ChatMessage> msgs;
  if (!system.empty()) msgs.push_back({"system", system});
  msgs.insert(msgs.end(), messages.begin(), messages.end());
  const RenderedChat r = chat_->render(msgs, true);
  return {tok_.encode(r.text, true, true, r.content), chat_->stop_strings()};
}

int64_t Intake::min_tokens(size_t bytes) const {
  const size_t per = tok_.max_token_bytes();
  return static_cast<int64_t>((bytes + per - 1) / per);
}

std::vector<int32_t> Intake::tokenize(std::string_view text, bool add_special, bool parse_special) const {
  return tok_.encode(text, add_special, parse_special);
}

std::string Intake::detokenize(const std::vector<int32_t>& ids) const { return tok_.decode(ids); }

std::string Intake::spell(const std::vector<int32_t>& ids, std::vector<size_t>* offsets) const {
  return tok_.spell(ids, offsets);
}

size_t Intake::text_bytes(int32_t id) const { return tok_.token_to_piece(id, false).size(); }

std::string Intake::piece(int32_t id) const { return tok_.token_to_piece(id, true); }

bool Intake::is_eog(int32_t id) const { return tok_.is_eog(id); }

}  // namespace tandem

// What a request's words become before the scheduler sees them: token ids
// from a prompt, or from a conversation in the model's chat format; and the
// way back from ids to text. The front ends (CLI, server) go through here
// rather than to the tokenizer and the model file.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "chat/chat_template.h"

namespace tandem {

class Model;
class Tokenizer;

struct ChatPrompt {
  std::vector<int32_t> tokens;
  std::vector<std::string> stop;  // strings that end the assistant's turn
};

class Intake {
 public:
  Intake(const Model& model, int32_t max_context);

  int32_t max_context() const { return max_context_; }
  int32_t n_vocab() const;
  // The model file's name (no directory: it is shown to clients).
  const std::string& model_name() const { return model_name_; }
  const std::string& model_path() const { return model_path_; }  // for matching names, never shown

  // A completion prompt: BOS as the vocabulary says, and text spelling a
  // control token ("<start_of_turn>") becomes that token, as llama.cpp's
  // completion endpoint does.
  std::vector<int32_t> prompt(std::string_view text) const;
  // A conversation in the model's chat format. The markup's control tokens
  // are tokens; the messages' content is always text, so a message cannot
  // open or close a turn. Throws Error(kUnsupported) when the model has no
  // chat format (chat_error() says why).
  ChatPrompt chat(const std::vector<ChatMessage>& messages, const std::string& system = "") const;
  bool has_chat() const { return chat_.has_value(); }
  // The model's chat format; null when it has none.
  const ChatTemplate* chat_template() const { return chat_ ? &*chat_ : nullptr; }
  const std::string& chat_error() const { return chat_error_; }

  // A lower bound on the tokens of a text of `bytes` bytes (no token stands
  // for more than the longest piece), so a text far too long for the context
  // is refused without being tokenized.
  int64_t min_tokens(size_t bytes) const;

  std::vector<int32_t> tokenize(std::string_view text, bool add_special, bool parse_special) const;
  std::string detokenize(const std::vector<int32_t>& ids) const;
  // The text ids spell back (Tokenizer::spell), with where each token starts.
  std::string spell(const std::vector<int32_t>& ids, std::vector<size_t>* offsets = nullptr) const;
  // Bytes one generated token adds to the text (control tokens add none).
  size_t text_bytes(int32_t id) const;
  // One token's raw bytes (may be part of a UTF-8 character; control tokens
  // spelled out).
  std::string piece(int32_t id) const;
  bool is_eog(int32_t id) const;

  const Tokenizer& tokenizer() const { return tok_; }

 private:
  const Tokenizer& tok_;
  int32_t max_context_;
  std::string model_path_;
  std::string model_name_;
  std::optional<ChatTemplate> chat_;
  std::string chat_error_;
};

}  // namespace tandem

// Chat formats. The model's tokenizer.chat_template (Jinja) is not executed;
// like llama.cpp's built-in templates, we recognise the family by its markers
// and render that family's format ourselves.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace tandem {

struct ChatMessage {
  std::string role;  // "system", "user", "assistant"
  std::string content;
};

enum class ChatFamily { kGemma, kLlama2, kLlama3, kChatML, kMistral };

class ChatTemplate {
 public:
  // Recognises the family from the template text. Throws
  // tandem::Error(kUnsupported) quoting the start of a template it does not know.
  static ChatTemplate detect(std::string_view template_text);
  static ChatTemplate from_family(ChatFamily f);

  ChatFamily family() const { return family_; }
  std::string_view name() const;  // "gemma", "llama2", "llama3", "chatml", "mistral"
  // The prompt text. Includes the BOS text only where the family's template
  // writes it literally (it is left to the tokenizer's add_bos otherwise).
  // add_generation_prompt: end with the opening of the assistant's turn.
  std::string apply(const std::vector<ChatMessage>& msgs, bool add_generation_prompt) const;
  // Strings that end the assistant's turn when they appear in generated text
  // (for models whose end-of-turn is not a special token).
  std::vector<std::string> stop_strings() const;

 private:
  explicit ChatTemplate(ChatFamily f) : family_(f) {}
  ChatFamily family_;
};

}  // namespace tandem

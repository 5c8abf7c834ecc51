// Chat formats. The model's tokenizer.chat_template (Jinja) is not executed;
// like llama.cpp's built-in templates (llm_chat_detect_template /
// llm_chat_apply_template), we recognise the family by its markers and render
// that family's format ourselves, byte for byte as llama.cpp's
// llama_chat_apply_template does. Within a family, the variants llama.cpp
// tells apart (llama2 with/without <<SYS>>, stripped, BOS inside history;
// mistral v1/v3/v3-tekken/v7/v7-tekken) are rendered as llama.cpp renders them.
// from_family(kMistral) is mistral-v3 (Mistral-7B-Instruct-v0.3's format,
// "[INST] user[/INST] answer</s>"); from_family(kLlama2) is llama2-sys-strip,
// which is what llama.cpp detects for Meta's own Llama-2-chat template.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace tandem {

struct ChatMessage {
  std::string role;  // "system", "user", "assistant"
  std::string content;
};

// A rendered conversation: the prompt text, and the byte ranges of it that
// are message content. Content is tokenized as text: a user who types
// "<end_of_turn>" gets those characters, not the control token, so no message
// can forge a turn.
struct RenderedChat {
  std::string text;
  std::vector<std::pair<size_t, size_t>> content;  // (offset, length)
};

// kGptOss: OpenAI's harmony format (gpt-oss), as llama.cpp's built-in "gpt-oss"
// renders it: "<|start|>role<|message|>content<|end|>", an assistant turn
// closed by "<|return|>", no channels and no system preamble.
enum class ChatFamily { kGemma, kLlama2, kLlama3, kChatML, kMistral, kGptOss };

class ChatTemplate {
 public:
  // Recognises the family from the template text, or from a name as llama.cpp
  // knows it (see variant(); "llama2" is its plain variant without <<SYS>>),
  // or "mistral" for from_family(kMistral). Throws tandem::Error(kUnsupported) quoting the start of a
  // template it does not know, or naming the format llama.cpp would have used.
  static ChatTemplate detect(std::string_view template_text);
  static ChatTemplate from_family(ChatFamily f);

  ChatFamily family() const { return family_; }
  std::string_view name() const;  // "gemma", "llama2", "llama3", "chatml", "mistral", "gpt-oss"
  // llama.cpp's name for the exact rendering, e.g. "llama2-sys-strip", "mistral-v3".
  std::string_view variant() const;
  // The prompt text. Includes the BOS text only where the family's template
  // writes it literally (it is left to the tokenizer's add_bos otherwise).
  // add_generation_prompt: end with the opening of the assistant's turn
  // (llama2 and mistral formats always end a user turn with [/INST], which is
  // that opening, so there it changes nothing, as in llama.cpp).
  // Roles must be "system", "user" or "assistant" (else kInvalidArgument).
  std::string apply(const std::vector<ChatMessage>& msgs, bool add_generation_prompt) const;
  // The same text, with the content ranges marked.
  RenderedChat render(const std::vector<ChatMessage>& msgs, bool add_generation_prompt) const;
  // Strings that end the assistant's turn when they appear in generated text
  // (for models whose end-of-turn is not a special token).
  std::vector<std::string> stop_strings() const;

 private:
  enum class Variant : uint8_t {
    kGemma, kLlama3, kChatML,
    kLlama2, kLlama2Sys, kLlama2SysBos, kLlama2SysStrip,
    kMistralV1, kMistralV3, kMistralV3Tekken, kMistralV7, kMistralV7Tekken,
    kGptOss,
  };
  static ChatFamily family_of(Variant v);
  explicit ChatTemplate(Variant v) : family_(family_of(v)), variant_(v) {}
  ChatFamily family_;
  Variant variant_;
};

}  // namespace tandem

#include "chat/chat_template.h"

#include <array>
#include <utility>

#include "core/error.h"

namespace tandem {

namespace {

bool contains(std::string_view s, std::string_view what) { return s.find(what) != std::string_view::npos; }

// llama.cpp trims with the C locale's isspace, not Unicode whitespace.
bool is_c_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r'; }

std::string_view trim(std::string_view s) {
  while (!s.empty() && is_c_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_c_space(s.back())) s.remove_suffix(1);
  return s;
}

// The start of a template for an error message: control characters escaped,
// cut at a UTF-8 character boundary.
std::string quote_start(std::string_view t) {
  constexpr size_t kMax = 60;
  size_t n = std::min(t.size(), kMax);
  while (n > 0 && n < t.size() && (static_cast<unsigned char>(t[n]) & 0xC0) == 0x80) --n;
  std::string out = "\"";
  for (char c : t.substr(0, n)) {
    if (c == '\n') out += "\\n";
    else if (c == '\t') out += "\\t";
    else if (c == '"') out += "\\\"";
    else if (static_cast<unsigned char>(c) < 0x20) out += fmt::format("\\x{:02x}", static_cast<unsigned char>(c));
    else out += c;
  }
  out += n < t.size() ? "...\"" : "\"";
  return out;
}

enum class Role { kSystem, kUser, kAssistant };

// The rendered text, and where message content went into it.
struct Renderer {
  RenderedChat result;
  Renderer& operator+=(std::string_view markup) {
    result.text += markup;
    return *this;
  }
  void content(std::string_view text) {
    if (text.empty()) return;
    result.content.push_back({result.text.size(), text.size()});
    result.text += text;
  }
};

Role parse_role(const ChatMessage& m, size_t index) {
  if (m.role == "system") return Role::kSystem;
  if (m.role == "user") return Role::kUser;
  if (m.role == "assistant") return Role::kAssistant;
  // Llama 3's turn for a tool's result (chat/tool_format writes it only for that family).
  if (m.role == "ipython") return Role::kUser;
  fail(ErrorKind::kInvalidArgument, "chat message {}: unknown role '{}' (expected system, user or assistant)", index,
       m.role);
}

// Formats llama.cpp recognises ahead of llama3's markers, in its order, with
// the names it gives them. A template matching one of these is not ours even
// if it also happens to contain one of our markers.
struct OtherFormat {
  std::string_view a, b;  // both must occur; empty b: a alone suffices
  std::string_view name;
  std::string_view c = {};  // a third marker that must occur too, where llama.cpp asks for one
};
constexpr std::array kBeforeGemma = {
    OtherFormat{"<|assistant|>", "<|end|>", "phi3"},
    OtherFormat{"[gMASK]<sop>", "", "chatglm4"},
    OtherFormat{"<|assistant|>", "<|user|>", "falcon3/glmedge/exaone-moe"},
    OtherFormat{"<|{{ item['role'] }}|>", "<|begin_of_image|>", "glmedge"},
    OtherFormat{"<|user|>", "<|endoftext|>", "zephyr"},
    OtherFormat{"bos_token + message['role']", "", "monarch"},
};
constexpr std::array kBeforeLlama3 = {
    OtherFormat{"'\\n\\nAssistant: ' + eos_token", "", "orion"},
    OtherFormat{"GPT4 Correct ", "", "openchat"},
    OtherFormat{"USER: ", "ASSISTANT: ", "vicuna"},
    OtherFormat{"### Instruction:", "<|EOT|>", "deepseek"},
    OtherFormat{"<|START_OF_TURN_TOKEN|>", "<|USER_TOKEN|>", "command-r"},
};

constexpr std::array kBeforeGptOss = {
    OtherFormat{"[gMASK]sop", "", "chatglm3"},
    OtherFormat{"<\xE7\x94\xA8\xE6\x88\xB7>", "", "minicpm"},  // <用户>
    OtherFormat{"'Assistant: ' + message['content'] + eos_token", "", "deepseek2"},
    // <｜Assistant｜>, <｜User｜>, <｜end▁of▁sentence｜>
    OtherFormat{"<\xEF\xBD\x9C" "Assistant\xEF\xBD\x9C>", "<\xEF\xBD\x9C" "User\xEF\xBD\x9C>", "deepseek3",
                "<\xEF\xBD\x9C" "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>"},
    OtherFormat{"[|system|]", "[|assistant|]", "exaone", "[|endofturn|]"},
    OtherFormat{"rwkv-world", "", "rwkv-world"},
    OtherFormat{"{{- 'User: ' + message['content']|trim + '\\n\\n' -}}", "", "rwkv-world"},
    OtherFormat{"<|start_of_role|>", "", "granite"},
    OtherFormat{"message['role'] + additional_special_tokens[0] + message['content'] + additional_special_tokens[1]", "",
                "gigachat"},
    OtherFormat{"<|role_start|>", "", "megrez"},
    OtherFormat{" \xD0\x90\xD1\x81\xD1\x81\xD0\xB8\xD1\x81\xD1\x82\xD0\xB5\xD0\xBD\xD1\x82:", "", "yandex"},  // " Ассистент:"
    OtherFormat{"<role>ASSISTANT</role>", "'HUMAN'", "bailing"},
    OtherFormat{"<|header_start|>", "<|header_end|>", "llama4"},
    OtherFormat{"<|endofuserprompt|>", "", "dots1"},
    OtherFormat{"<|extra_0|>", "<|extra_4|>", "hunyuan-moe"},
};

template <size_t N>
void reject_others(std::string_view t, const std::array<OtherFormat, N>& others) {
  for (const OtherFormat& o : others) {
    if (contains(t, o.a) && (o.b.empty() || contains(t, o.b)) && (o.c.empty() || contains(t, o.c))) {
      fail(ErrorKind::kUnsupported, "chat template looks like the '{}' format, which Tandem does not render: {}", o.name,
           quote_start(t));
    }
  }
}

// llama.cpp's names, indexed by ChatTemplate::Variant's declaration order.
constexpr std::array<std::pair<std::string_view, int>, 13> kVariantNames = {{
    {"gemma", 0},
    {"llama3", 1},
    {"chatml", 2},
    {"llama2", 3},
    {"llama2-sys", 4},
    {"llama2-sys-bos", 5},
    {"llama2-sys-strip", 6},
    {"mistral-v1", 7},
    {"mistral-v3", 8},
    {"mistral-v3-tekken", 9},
    {"mistral-v7", 10},
    {"mistral-v7-tekken", 11},
    {"gpt-oss", 12},
}};

}  // namespace

ChatFamily ChatTemplate::family_of(Variant v) {
  switch (v) {
    case Variant::kGemma: return ChatFamily::kGemma;
    case Variant::kLlama3: return ChatFamily::kLlama3;
    case Variant::kChatML: return ChatFamily::kChatML;
    case Variant::kLlama2:
    case Variant::kLlama2Sys:
    case Variant::kLlama2SysBos:
    case Variant::kLlama2SysStrip: return ChatFamily::kLlama2;
    case Variant::kMistralV1:
    case Variant::kMistralV3:
    case Variant::kMistralV3Tekken:
    case Variant::kMistralV7:
    case Variant::kMistralV7Tekken: return ChatFamily::kMistral;
    case Variant::kGptOss: return ChatFamily::kGptOss;
  }
  return ChatFamily::kChatML;  // unreachable: every enumerator is handled above
}

ChatTemplate ChatTemplate::from_family(ChatFamily f) {
  switch (f) {
    case ChatFamily::kGemma: return ChatTemplate(Variant::kGemma);
    case ChatFamily::kLlama2: return ChatTemplate(Variant::kLlama2SysStrip);
    case ChatFamily::kLlama3: return ChatTemplate(Variant::kLlama3);
    case ChatFamily::kChatML: return ChatTemplate(Variant::kChatML);
    case ChatFamily::kMistral: return ChatTemplate(Variant::kMistralV3);
    case ChatFamily::kGptOss: return ChatTemplate(Variant::kGptOss);
  }
  fail(ErrorKind::kInvalidArgument, "unknown chat family {}", static_cast<int>(f));
}

ChatTemplate ChatTemplate::detect(std::string_view t) {
  for (const auto& [name, v] : kVariantNames) {
    if (t == name) return ChatTemplate(static_cast<Variant>(v));
  }
  if (t == "mistral") return from_family(ChatFamily::kMistral);
  if (trim(t).empty()) fail(ErrorKind::kUnsupported, "chat template is empty");

  // The checks and their order are llama.cpp's llm_chat_detect_template.
  if (contains(t, "<|im_start|>")) {
    if (contains(t, "<|im_sep|>")) {
      fail(ErrorKind::kUnsupported, "chat template looks like the 'phi4' format, which Tandem does not render: {}",
           quote_start(t));
    }
    if (contains(t, "<end_of_utterance>")) {
      fail(ErrorKind::kUnsupported, "chat template looks like the 'smolvlm' format, which Tandem does not render: {}",
           quote_start(t));
    }
    return ChatTemplate(Variant::kChatML);
  }
  if (t.starts_with("mistral") || contains(t, "[INST]")) {
    // llama.cpp does not tell v7-tekken apart by markers; only its name selects it.
    if (contains(t, "[SYSTEM_PROMPT]")) return ChatTemplate(Variant::kMistralV7);
    if (contains(t, "' [INST] ' + system_message") || contains(t, "[AVAILABLE_TOOLS]")) {
      if (contains(t, " [INST]")) return ChatTemplate(Variant::kMistralV1);
      if (contains(t, "\"[INST]\"")) return ChatTemplate(Variant::kMistralV3Tekken);
      return ChatTemplate(Variant::kMistralV3);
    }
    if (contains(t, "content.strip()")) return ChatTemplate(Variant::kLlama2SysStrip);
    if (contains(t, "bos_token + '[INST]")) return ChatTemplate(Variant::kLlama2SysBos);
    if (contains(t, "<<SYS>>")) return ChatTemplate(Variant::kLlama2Sys);
    return ChatTemplate(Variant::kLlama2);
  }
  reject_others(t, kBeforeGemma);
  if (contains(t, "<start_of_turn>")) return ChatTemplate(Variant::kGemma);
  reject_others(t, kBeforeLlama3);
  if (contains(t, "<|start_header_id|>") && contains(t, "<|end_header_id|>")) return ChatTemplate(Variant::kLlama3);
  reject_others(t, kBeforeGptOss);
  if (contains(t, "<|start|>") && contains(t, "<|channel|>")) return ChatTemplate(Variant::kGptOss);
  fail(ErrorKind::kUnsupported,
       "unsupported chat template (known: gemma, llama2, llama3, chatml, mistral, gpt-oss): {}", quote_start(t));
}

std::string_view ChatTemplate::name() const {
  switch (family_) {
    case ChatFamily::kGemma: return "gemma";
    case ChatFamily::kLlama2: return "llama2";
    case ChatFamily::kLlama3: return "llama3";
    case ChatFamily::kChatML: return "chatml";
    case ChatFamily::kMistral: return "mistral";
    case ChatFamily::kGptOss: return "gpt-oss";
  }
  return "?";
}

std::string_view ChatTemplate::variant() const {
  for (const auto& [name, v] : kVariantNames) {
    if (static_cast<Variant>(v) == variant_) return name;
  }
  return "?";
}

std::vector<std::string> ChatTemplate::stop_strings() const {
  switch (family_) {
    case ChatFamily::kGemma: return {"<end_of_turn>"};
    case ChatFamily::kLlama3: return {"<|eot_id|>"};
    case ChatFamily::kChatML: return {"<|im_end|>"};
    case ChatFamily::kLlama2:
    case ChatFamily::kMistral: return {"</s>"};
    // The end of the final answer and of a tool call; "<|end|>" only closes a channel's message.
    case ChatFamily::kGptOss: return {"<|return|>", "<|call|>"};
  }
  return {};
}

RenderedChat ChatTemplate::render(const std::vector<ChatMessage>& msgs, bool add_generation_prompt) const {
  std::vector<Role> roles;
  roles.reserve(msgs.size());
  for (size_t i = 0; i < msgs.size(); ++i) roles.push_back(parse_role(msgs[i], i));

  Renderer out;
  switch (variant_) {
    case Variant::kChatML:
      for (const ChatMessage& m : msgs) {
        out += "<|im_start|>" + m.role + "\n";
        out.content(m.content);
        out += "<|im_end|>\n";
      }
      if (add_generation_prompt) out += "<|im_start|>assistant\n";
      break;

    case Variant::kLlama3:
      for (const ChatMessage& m : msgs) {
        out += "<|start_header_id|>" + m.role + "<|end_header_id|>\n\n";
        out.content(trim(m.content));
        out += "<|eot_id|>";
      }
      if (add_generation_prompt) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
      break;

    case Variant::kGemma: {
      // Gemma has no system turn: system text (trimmed, concatenated) opens the
      // next user turn, separated by a blank line.
      std::string system;
      for (size_t i = 0; i < msgs.size(); ++i) {
        if (roles[i] == Role::kSystem) {
          system += trim(msgs[i].content);
          continue;
        }
        const bool model = roles[i] == Role::kAssistant;
        out += model ? "<start_of_turn>model\n" : "<start_of_turn>user\n";
        if (!model && !system.empty()) {
          out.content(system);
          out += "\n\n";
          system.clear();
        }
        out.content(trim(msgs[i].content));
        out += "<end_of_turn>\n";
      }
      if (add_generation_prompt) out += "<start_of_turn>model\n";
      break;
    }

    case Variant::kLlama2:
    case Variant::kLlama2Sys:
    case Variant::kLlama2SysBos:
    case Variant::kLlama2SysStrip: {
      const bool sys_block = variant_ != Variant::kLlama2;
      const bool bos_in_history = variant_ == Variant::kLlama2SysBos;
      const bool strip = variant_ == Variant::kLlama2SysStrip;
      // The first "[INST] " is written up front: the tokenizer adds the BOS before it.
      out += "[INST] ";
      bool in_turn = true;
      for (size_t i = 0; i < msgs.size(); ++i) {
        const std::string_view content = strip ? trim(msgs[i].content) : std::string_view(msgs[i].content);
        if (!in_turn) {
          out += bos_in_history ? "<s>[INST] " : "[INST] ";
          in_turn = true;
        }
        switch (roles[i]) {
          case Role::kSystem:
            if (sys_block) {
              out += "<<SYS>>\n";
              out.content(content);
              out += "\n<</SYS>>\n\n";
            } else {
              out.content(content);
              out += "\n";
            }
            break;
          case Role::kUser:
            out.content(content);
            out += " [/INST]";
            break;
          case Role::kAssistant:
            out.content(content);
            out += "</s>";
            in_turn = false;
            break;
        }
      }
      break;
    }

    case Variant::kMistralV1:
    case Variant::kMistralV3:
    case Variant::kMistralV3Tekken: {
      const std::string_view lead = variant_ == Variant::kMistralV1 ? " " : "";
      const std::string_view space = variant_ == Variant::kMistralV3Tekken ? "" : " ";
      const bool trim_answer = variant_ == Variant::kMistralV3;
      bool in_turn = false;
      for (size_t i = 0; i < msgs.size(); ++i) {
        if (!in_turn) {
          out += lead;
          out += "[INST]";
          out += space;
          in_turn = true;
        }
        const std::string_view content = msgs[i].content;
        switch (roles[i]) {
          case Role::kSystem:
            out.content(content);
            out += "\n\n";
            break;
          case Role::kUser:
            out.content(content);
            out += lead;
            out += "[/INST]";
            break;
          case Role::kAssistant:
            out += space;
            out.content(trim_answer ? trim(content) : content);
            out += "</s>";
            in_turn = false;
            break;
        }
      }
      break;
    }

    case Variant::kMistralV7:
    case Variant::kMistralV7Tekken: {
      const std::string_view space = variant_ == Variant::kMistralV7 ? " " : "";
      for (size_t i = 0; i < msgs.size(); ++i) {
        const std::string_view content = msgs[i].content;
        switch (roles[i]) {
          case Role::kSystem:
            out += "[SYSTEM_PROMPT]";
            out += space;
            out.content(content);
            out += "[/SYSTEM_PROMPT]";
            break;
          case Role::kUser:
            out += "[INST]";
            out += space;
            out.content(content);
            out += "[/INST]";
            break;
          case Role::kAssistant:
            out += space;
            out.content(content);
            out += "</s>";
            break;
        }
      }
      break;
    }

    case Variant::kGptOss:
      for (const ChatMessage& m : msgs) {
        out += "<|start|>" + m.role + "<|message|>";
        out.content(m.content);
        out += m.role == "assistant" ? "<|return|>" : "<|end|>";
      }
      if (add_generation_prompt) out += "<|start|>assistant";
      break;
  }
  return std::move(out.result);
}

std::string ChatTemplate::apply(const std::vector<ChatMessage>& msgs, bool add_generation_prompt) const {
  return render(msgs, add_generation_prompt).text;
}

}  // namespace tandem

#include "chat/model_chat.h"

#include "core/error.h"
#include "gguf/gguf.h"

namespace tandem {

ChatTemplate chat_template_for(const GgufFile& f) {
  if (auto tmpl = f.get_string("tokenizer.chat_template")) return ChatTemplate::detect(*tmpl);
  const std::string arch = f.get_string("general.architecture").value_or("");
  if (arch.rfind("gemma", 0) == 0) return ChatTemplate::from_family(ChatFamily::kGemma);
  if (arch == "qwen2" || arch == "qwen3" || arch == "qwen2moe" || arch == "qwen3moe") return ChatTemplate::from_family(ChatFamily::kChatML);
  if (arch == "gpt-oss") return ChatTemplate::from_family(ChatFamily::kGptOss);
  fail(ErrorKind::kUnsupported,
       "{}: the model has no tokenizer.chat_template and no default chat format is known for architecture '{}'",
       f.path(), arch);
}

}  // namespace tandem

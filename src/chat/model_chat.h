// Picks a model's chat format: from its tokenizer.chat_template when it has
// one, else from its architecture (some GGUF exports, like the Gemma 3 270M
// default model, ship without a template).
#pragma once

#include "chat/chat_template.h"

namespace tandem {

class GgufFile;

// Throws tandem::Error(kUnsupported) naming the template or architecture.
ChatTemplate chat_template_for(const GgufFile& f);

}  // namespace tandem

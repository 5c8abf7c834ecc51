// Converts a llama2.c checkpoint (legacy 7-int header, float32 weights) and a
// llama2.c tokenizer.bin into a GGUF v3 `llama` model, laid out the way
// llama.cpp's convert-llama2c-to-ggml writes it (all tensors F32).
#pragma once

#include <string>

namespace tandem {

// Throws tandem::Error(kInvalidFile) naming the file and the inconsistency for
// truncated or malformed inputs, kIo when a file cannot be read or written.
void convert_llama2c(const std::string& model_bin, const std::string& tokenizer_bin,
                     const std::string& out_gguf);

}  // namespace tandem

// Human-readable dump of a GGUF file for `tandem inspect`.
#pragma once

#include <string>

namespace tandem {

class GgufFile;

// Header facts, every metadata key with its type and value (arrays longer than
// a few elements are abbreviated with their length unless full_arrays), then
// the tensor table: name, type, dims (ne0 first), offset and bytes.
std::string describe_gguf(const GgufFile& f, bool full_arrays = false);

}  // namespace tandem

// The two subword algorithms, applied to one raw-text fragment at a time.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "tokenizer/vocab.h"

namespace tandem::tok {

class PreTokenizer;

// llama.cpp's llm_tokenizer_spm: `text` must already have spaces escaped to
// U+2581. Starts from UTF-8 characters, repeatedly merges the adjacent pair
// whose concatenation is the vocab token with the highest score (ties: the
// leftmost pair), and spells symbols that are not tokens as byte tokens.
void spm_encode(const Vocab& v, std::string_view text, std::vector<int32_t>& out);

// llama.cpp's llm_tokenizer_bpe_session: pre-tokenizes, then merges each word
// by rank (lowest rank first; ties: leftmost).
void bpe_encode(const Vocab& v, const PreTokenizer& pre, std::string_view text, std::vector<int32_t>& out);

}  // namespace tandem::tok

// UTF-8 and byte-level helpers shared by the tokenizers. Decoding follows
// llama.cpp's lenient rules (so that pre-tokenized words come out byte-for-byte
// the same), not strict UTF-8 validation.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tandem::tok {

// Byte length of a UTF-8 sequence judged only by its first byte, the way
// llama.cpp splits text into symbols (continuation bytes count as 1).
size_t utf8_len_from_lead(uint8_t lead);

// Decodes like llama.cpp's unicode_cpts_from_utf8: a sequence that is cut short
// or has a bad continuation byte yields U+FFFD and consumes a single byte.
// Overlong forms and surrogates are decoded as written.
std::vector<uint32_t> decode_utf8_lenient(std::string_view s);

// Appends the UTF-8 encoding of `cpt`; surrogates and values above U+10FFFF
// (which the lenient decoder can produce) become U+FFFD.
void append_utf8(std::string& out, uint32_t cpt);

// decode_utf8_lenient followed by re-encoding: always valid UTF-8.
std::string sanitize_utf8(std::string_view s);

// GPT-2 byte-level BPE alphabet: every byte maps to one printable codepoint.
const std::string& byte_to_unicode(uint8_t byte);  // UTF-8 of that codepoint
int unicode_to_byte(uint32_t cpt);                 // -1 when not in the alphabet

// Strict UTF-8 check of the sequence starting at s[i]: its length when it is a
// complete valid character, 0 when it is a valid but unfinished prefix that
// runs to the end of `s`, -1 when the byte at `i` cannot start a valid character
// (or the sequence is broken).
int utf8_sequence_status(std::string_view s, size_t i);

// U+FFFD, used wherever invalid bytes are shown as text.
inline constexpr std::string_view kReplacementChar = "\xEF\xBF\xBD";

}  // namespace tandem::tok

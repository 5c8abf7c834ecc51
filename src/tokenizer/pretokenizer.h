// BPE pre-tokenization: the regex lists llama.cpp applies for each
// tokenizer.ggml.pre value, run with PCRE2 (UTF + UCP). Each regex splits every
// current fragment into its matches and the unmatched gaps between them, and
// the next regex works on the result (llama.cpp's unicode_regex_split).
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace tandem::tok {

struct PreTokenizerSpec {
  std::vector<std::string> names;    // tokenizer.ggml.pre values
  std::vector<std::string> regexes;  // applied in order
  bool clean_spaces = true;          // llama.cpp's BPE default
  bool add_bos = false;
  bool ignore_merges = false;
  bool no_bos = false;  // the pre-type disables the default BOS id
};

// nullptr when llama.cpp does not know the name (or Tandem does not support it).
const PreTokenizerSpec* find_pre_tokenizer(std::string_view name);
// The spec used when tokenizer.ggml.pre is absent or "default".
const PreTokenizerSpec& default_pre_tokenizer();
// Every supported spec (the first is the default).
const std::vector<PreTokenizerSpec>& all_pre_tokenizers();

class PreTokenizer {
 public:
  // Compiles the spec's regexes; throws tandem::Error if PCRE2 rejects one.
  explicit PreTokenizer(const PreTokenizerSpec& spec);
  ~PreTokenizer();
  PreTokenizer(const PreTokenizer&) = delete;
  PreTokenizer& operator=(const PreTokenizer&) = delete;

  // Splits `text` into words. Invalid UTF-8 is first replaced the way
  // llama.cpp does (U+FFFD per bad byte). Words are returned as UTF-8; with
  // `byte_encode` each byte is mapped to the GPT-2 byte alphabet.
  std::vector<std::string> split(std::string_view text, bool byte_encode) const;

 private:
  struct Compiled;
  std::vector<std::unique_ptr<Compiled>> regexes_;
};

// Rewrites \s and \S into explicit classes holding exactly the codepoints that
// llama.cpp (and Python's `regex`) treat as whitespace; PCRE2's own \s differs
// (e.g. it also matches U+180E). Exposed for tests.
std::string expand_whitespace_classes(std::string_view pattern);

}  // namespace tandem::tok

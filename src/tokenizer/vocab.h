// The vocabulary behind Tokenizer: token texts, scores, attributes, special
// ids and the flags that steer tokenization, read from tokenizer.ggml.* the way
// llama.cpp's llama_vocab::load does (including its text-based detection of
// end-of-generation tokens), plus the special-token splitter that runs before
// the SPM/BPE algorithms.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace tandem {
class GgufFile;
}

namespace tandem::tok {

// llama.cpp's llama_token_attr bits.
enum Attr : uint32_t {
  kAttrUndefined = 0,
  kAttrUnknown = 1u << 0,
  kAttrUnused = 1u << 1,
  kAttrNormal = 1u << 2,
  kAttrControl = 1u << 3,
  kAttrUserDefined = 1u << 4,
  kAttrByte = 1u << 5,
  kAttrLstrip = 1u << 7,
  kAttrRstrip = 1u << 8,
};

// Open-addressing index from strings to their position in a vector the caller
// owns (token texts, merge strings). std::unordered_map rehashes every string
// it walks past, which made loading a 262k vocab several times slower.
class StringIndex {
 public:
  // With duplicates, the last position wins when `last_wins`, else the first.
  void build(const std::vector<std::string>& keys, bool last_wins);
  // The position of `s` in `keys` (the vector given to build), -1 if absent.
  int32_t find(const std::vector<std::string>& keys, std::string_view s) const;

 private:
  struct Slot {
    uint32_t tag = 0;   // high hash bits, to skip most string compares
    int32_t pos = -1;   // -1: empty
  };
  std::vector<Slot> slots_;
  size_t mask_ = 0;
};

// Finds which special tokens occur anywhere in a text (a byte trie walked from
// every position), so the splitter only scans for those.
class SpecialMatcher {
 public:
  void build(const std::vector<std::string>& texts);
  // Indices into `texts` given to build() that occur in `text`, ascending.
  std::vector<int32_t> present_in(std::string_view text) const;

 private:
  struct Node {
    int32_t first_match = -1;  // head of a list in match_next_
  };
  std::vector<Node> nodes_;
  std::unordered_map<uint64_t, int32_t> edges_;  // (node << 8 | byte) -> child
  std::vector<int32_t> match_next_;              // per build index: next index at same node
  bool first_byte_[256] = {};
};

struct Vocab {
  enum class Kind { kSpm, kBpe };
  Kind kind = Kind::kSpm;
  std::string pre;  // tokenizer.ggml.pre ("" when absent)

  std::vector<std::string> text;
  std::vector<float> score;
  std::vector<uint32_t> attr;
  StringIndex text_index;  // duplicate texts: the last id wins, as in llama.cpp

  int32_t bos = -1, eos = -1, eot = -1, eom = -1, unk = -1, sep = -1, pad = -1;
  int32_t fim_pad = -1, fim_rep = -1, fim_sep = -1;
  std::unordered_set<int32_t> eog;

  bool add_bos = false;
  bool add_eos = false;
  bool add_space_prefix = false;
  bool clean_spaces = false;   // detokenize: HF clean_up_tokenization_spaces
  bool ignore_merges = false;  // BPE: a word that is a whole token skips merges

  // BPE merges ("left right"); a merge's rank is its position (the first of
  // duplicates wins, as in llama.cpp).
  std::vector<std::string> merges;
  StringIndex merge_index;

  // Ids of control / user-defined / unknown tokens, longest text first (ties:
  // lower id first); the order in which the splitter claims them.
  std::vector<int32_t> special_order;
  SpecialMatcher special_matcher;

  // SPM byte fallback: the token for each byte ("<0xNN>", else the byte
  // itself), -1 where the vocab has neither.
  int32_t byte_token[256];

  int32_t n() const { return static_cast<int32_t>(text.size()); }
  int32_t find(std::string_view s) const { return text_index.find(text, s); }
  int32_t bpe_rank(std::string_view key) const { return merge_index.find(merges, key); }

  // Reads and validates tokenizer.ggml.*; throws tandem::Error naming the key
  // (or the unknown model / pre-tokenizer).
  static Vocab load(const GgufFile& f);
};

// A piece of input after special-token splitting: either raw text
// [offset, offset + length) of the input, or a single token.
struct Fragment {
  int32_t token = -1;  // -1: raw text
  size_t offset = 0;
  size_t length = 0;
};

// llama.cpp's tokenizer_st_partition: special tokens are claimed longest first;
// control and unknown tokens only when parse_special, user-defined always;
// LSTRIP/RSTRIP tokens eat neighbouring ASCII whitespace.
std::vector<Fragment> split_special(const Vocab& v, std::string_view text, bool parse_special);

}  // namespace tandem::tok

// The vocabulary behind Tokenizer: token texts, scores, attributes, special
// ids and the flags that steer tokenization, read from tokenizer.ggml.* the way
// llama.cpp's llama_vocab::load does (including its text-based detection of
// end-of-generation tokens), plus the special-token splitter that runs before
// the SPM/BPE algorithms.
#pragma once

#include <cstdint>
#include <string>
#include <span>
#include <string_view>
#include <utility>
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

// Strings by position in one buffer (token texts, merges): a 262k-token
// vocabulary held as std::strings took 8 MB of string objects for its
// 2.4 MB of text.
class TextTable {
 public:
  // Appends s; throws tandem::Error once the texts pass 4 GiB in all.
  void push_back(std::string_view s);
  std::string_view operator[](size_t i) const { return {chars_.data() + start_[i], start_[i + 1] - start_[i]}; }
  size_t size() const { return start_.size() - 1; }
  bool empty() const { return size() == 0; }

 private:
  std::string chars_;
  std::vector<uint32_t> start_ = {0};  // text i is chars_[start_[i], start_[i + 1])
};

// Open-addressing index from strings to their position in a table the caller
// owns (token texts, merge strings). std::unordered_map rehashes every string
// it walks past, which made loading a 262k vocab several times slower.
class StringIndex {
 public:
  // With duplicates, the last position wins when `last_wins`, else the first.
  // Throws tandem::Error for more than 16,777,215 keys.
  void build(const TextTable& keys, bool last_wins);
  // The position of `s` in `keys` (the table given to build), -1 if absent.
  int32_t find(const TextTable& keys, std::string_view s) const;

 private:
  // A slot: 0 when empty, else (tag << 24) | (position + 1), the tag being 8
  // high bits of the hash that skip most string compares. Four bytes, not
  // eight: a 262k vocabulary's index is 2 MB. Up to kMaxKeys strings.
  static constexpr uint32_t kMaxKeys = (1u << 24) - 1;
  std::vector<uint32_t> slots_;
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
  int32_t child(int32_t node, uint8_t byte) const;  // -1 when none

  // The trie in flat arrays (Gemma's 6,414 special tokens have 75k bytes:
  // as a hash map of edges that took 3 MB, this 1): node n's edges are
  // [edge_start_[n], edge_start_[n + 1]), sorted by byte.
  std::vector<int32_t> first_match_;  // per node: head of a list in match_next_, -1 if none
  std::vector<uint32_t> edge_start_;
  std::vector<uint8_t> edge_byte_;
  std::vector<int32_t> edge_child_;
  std::vector<int32_t> match_next_;  // per build index: next index at the same node
  bool first_byte_[256] = {};
};

struct Vocab {
  enum class Kind { kSpm, kBpe };
  Kind kind = Kind::kSpm;
  std::string pre;  // tokenizer.ggml.pre ("" when absent)

  TextTable text;
  std::vector<float> score;
  std::vector<uint16_t> attr;  // Attr bits (all below 1 << 9)
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
  TextTable merges;
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
// LSTRIP/RSTRIP tokens eat neighbouring ASCII whitespace. No control or
// unknown token is matched where it would overlap a `literal` range
// (offset, length): text a user wrote stays text.
using TextRanges = std::span<const std::pair<size_t, size_t>>;
std::vector<Fragment> split_special(const Vocab& v, std::string_view text, bool parse_special,
                                    TextRanges literal = {});

}  // namespace tandem::tok

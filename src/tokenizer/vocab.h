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

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
};
using TokenMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

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
  TokenMap text_to_id;  // duplicate texts: the last id wins, as in llama.cpp

  int32_t bos = -1, eos = -1, eot = -1, eom = -1, unk = -1, sep = -1, pad = -1;
  int32_t fim_pad = -1, fim_rep = -1, fim_sep = -1;
  std::unordered_set<int32_t> eog;

  bool add_bos = false;
  bool add_eos = false;
  bool add_space_prefix = false;
  bool clean_spaces = false;   // detokenize: HF clean_up_tokenization_spaces
  bool ignore_merges = false;  // BPE: a word that is a whole token skips merges

  // BPE merge ranks keyed by the merge string "left right".
  TokenMap bpe_ranks;

  // Ids of control / user-defined / unknown tokens, longest text first (ties:
  // lower id first); the order in which the splitter claims them.
  std::vector<int32_t> special_order;
  SpecialMatcher special_matcher;

  // SPM byte fallback: the token for each byte ("<0xNN>", else the byte
  // itself), -1 where the vocab has neither.
  int32_t byte_token[256];

  int32_t n() const { return static_cast<int32_t>(text.size()); }
  int32_t find(std::string_view s) const {
    auto it = text_to_id.find(s);
    return it == text_to_id.end() ? -1 : it->second;
  }
  int32_t bpe_rank(std::string_view key) const {
    auto it = bpe_ranks.find(key);
    return it == bpe_ranks.end() ? -1 : it->second;
  }

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

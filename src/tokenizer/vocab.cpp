#include "tokenizer/vocab.h"

#include <algorithm>
#include <cctype>
#include <span>
#include <unordered_map>

#include "core/error.h"
#include "gguf/gguf.h"
#include "tokenizer/pretokenizer.h"

namespace tandem::tok {

namespace {

constexpr int64_t kNoToken32 = 0xFFFFFFFFll;  // what converters write for "none"

bool ascii_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r';
}

uint32_t attr_from_type(int64_t type) {
  switch (type) {  // tokenizer.ggml.token_type values
    case 1: return kAttrNormal;
    case 2: return kAttrUnknown;
    case 3: return kAttrControl;
    case 4: return kAttrUserDefined;
    case 5: return kAttrUnused;
    case 6: return kAttrByte;
    default: return kAttrUndefined;
  }
}

// Every text in the lists below starts with '<', '[' or '_'; checking that
// first keeps the scans over a 262k vocab cheap.
bool contains(std::span<const std::string_view> list, std::string_view s) {
  if (s.empty() || (s[0] != '<' && s[0] != '[' && s[0] != '_')) return false;
  return std::find(list.begin(), list.end(), s) != list.end();
}

// Texts llama.cpp uses to spot end-of-turn and friends when the file does not
// name them (llama_vocab::impl::load, "auto-detect special tokens by text").
constexpr std::string_view kEotTexts[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>",
    "<EOT>", "_<EOT>", "[EOT]", "<｜end▁of▁sentence｜>", "<end_of_utterance>"};
constexpr std::string_view kEomTexts[] = {"<|eom_id|>"};
constexpr std::string_view kFimPadTexts[] = {"<|fim_pad|>", "<fim-pad>", "<fim_pad>",
                                                                 "<PAD>", "[PAD]"};
constexpr std::string_view kFimRepTexts[] = {"<|fim_repo|>", "<|repo_name|>", "<fim-repo>",
                                                                 "<REPO>", "<reponame>"};
constexpr std::string_view kFimSepTexts[] = {"<|file_sep|>"};
constexpr std::string_view kEogTexts[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
    "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
    "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>"};

std::vector<float> read_scores(const GgufFile& f, const char* key) {
  const GgufValue* v = f.find(key);
  if (!v) return {};
  if (v->type == GgufType::ARRAY && v->elem_type == GgufType::INT32) {
    const auto ints = f.get_int_array(key);
    return std::vector<float>(ints->begin(), ints->end());
  }
  auto arr = f.get_float_array(key);
  return arr ? std::move(*arr) : std::vector<float>{};
}

}  // namespace

Vocab Vocab::load(const GgufFile& f) {
  Vocab v;
  const auto model = f.get_string("tokenizer.ggml.model");
  if (!model) fail(ErrorKind::kInvalidFile, "missing key tokenizer.ggml.model");
  const PreTokenizerSpec* pre_spec = nullptr;
  if (*model == "llama") {
    v.kind = Kind::kSpm;
    v.bos = 1;
    v.eos = 2;
    v.unk = 0;
    v.add_bos = true;
    v.add_space_prefix = true;
  } else if (*model == "gpt2") {
    v.kind = Kind::kBpe;
    v.bos = 11;
    v.eos = 11;
    v.pre = f.get_string("tokenizer.ggml.pre").value_or("");
    pre_spec = v.pre.empty() ? &default_pre_tokenizer() : find_pre_tokenizer(v.pre);
    if (!pre_spec) fail(ErrorKind::kUnsupported, "unknown pre-tokenizer tokenizer.ggml.pre = '{}'", v.pre);
    v.clean_spaces = pre_spec->clean_spaces;
    v.add_bos = pre_spec->add_bos;
    v.ignore_merges = pre_spec->ignore_merges;
    if (pre_spec->no_bos) v.bos = -1;
  } else {
    fail(ErrorKind::kUnsupported, "unsupported tokenizer model tokenizer.ggml.model = '{}' (supported: llama, gpt2)",
         *model);
  }
  if (auto b = f.get_bool("tokenizer.ggml.add_space_prefix")) v.add_space_prefix = *b;

  // Empty texts become "[EMPTY_<id>]", as in llama.cpp.
  const bool has_tokens = f.for_each_string("tokenizer.ggml.tokens", [&](std::string_view t) {
    if (v.text.size() >= static_cast<size_t>(INT32_MAX))
      fail(ErrorKind::kInvalidFile, "tokenizer.ggml.tokens has too many entries (over {})", INT32_MAX);
    if (t.empty()) v.text.push_back("[EMPTY_" + std::to_string(v.text.size()) + "]");
    else v.text.push_back(t);
  });
  if (!has_tokens) fail(ErrorKind::kInvalidFile, "missing key tokenizer.ggml.tokens");
  if (v.text.empty()) fail(ErrorKind::kInvalidFile, "tokenizer.ggml.tokens is empty");
  const size_t n = v.text.size();

  std::vector<float> scores = read_scores(f, "tokenizer.ggml.scores");
  if (f.find("tokenizer.ggml.scores") && scores.size() < n) {
    fail(ErrorKind::kInvalidFile, "tokenizer.ggml.scores has {} entries but tokenizer.ggml.tokens has {}",
         scores.size(), n);
  }
  std::vector<int64_t> types;
  if (auto t = f.get_int_array("tokenizer.ggml.token_type")) {
    types = std::move(*t);
    if (types.size() < n) {
      fail(ErrorKind::kInvalidFile, "tokenizer.ggml.token_type has {} entries but tokenizer.ggml.tokens has {}",
           types.size(), n);
    }
  }

  v.score.assign(n, 0.0f);
  v.attr.assign(n, kAttrNormal);
  for (size_t i = 0; i < n; ++i) {
    if (!scores.empty()) v.score[i] = scores[i];
    if (!types.empty()) v.attr[i] = attr_from_type(types[i]);
  }
  v.text_index.build(v.text, /*last_wins=*/true);

  if (v.kind == Kind::kBpe) {
    const bool has_merges = f.for_each_string("tokenizer.ggml.merges", [&](std::string_view m) {
      if (v.merges.size() >= static_cast<size_t>(INT32_MAX))
        fail(ErrorKind::kInvalidFile, "tokenizer.ggml.merges has too many entries (over {})", INT32_MAX);
      v.merges.push_back(m);
    });
    if (!has_merges) fail(ErrorKind::kInvalidFile, "missing key tokenizer.ggml.merges (required for gpt2 tokenizers)");
    v.merge_index.build(v.merges, /*last_wins=*/false);
  }

  // Special ids: a default that does not fit the vocab is dropped; a value in
  // the file must fit, except the 0xFFFFFFFF / -1 "none" marker, which keeps
  // the default as llama.cpp does.
  const int32_t n32 = v.n();
  struct IdKey {
    const char* key;
    int32_t* id;
  };
  const IdKey id_keys[] = {
      {"tokenizer.ggml.bos_token_id", &v.bos},         {"tokenizer.ggml.eos_token_id", &v.eos},
      {"tokenizer.ggml.eot_token_id", &v.eot},         {"tokenizer.ggml.eom_token_id", &v.eom},
      {"tokenizer.ggml.unknown_token_id", &v.unk},     {"tokenizer.ggml.seperator_token_id", &v.sep},
      {"tokenizer.ggml.padding_token_id", &v.pad},     {"tokenizer.ggml.fim_pad_token_id", &v.fim_pad},
      {"tokenizer.ggml.fim_rep_token_id", &v.fim_rep}, {"tokenizer.ggml.fim_sep_token_id", &v.fim_sep},
  };
  for (const auto& k : id_keys) {
    if (*k.id >= n32) *k.id = -1;
    auto val = f.get_int(k.key);
    if (!val || *val == kNoToken32 || *val == -1) continue;
    if (*val < 0 || *val >= n32) {
      fail(ErrorKind::kInvalidFile, "{} = {} is out of range (vocab has {} tokens)", k.key, *val, n32);
    }
    *k.id = static_cast<int32_t>(*val);
  }
  if (auto b = f.get_bool("tokenizer.ggml.add_bos_token")) v.add_bos = *b;
  if (auto b = f.get_bool("tokenizer.ggml.add_eos_token")) v.add_eos = *b;

  // Text-based detection. Only the id that owns a text in text_index counts
  // (llama.cpp walks that map); among several matches the lowest id wins.
  auto canonical = [&](int32_t id) { return v.find(v.text[id]) == id; };
  auto detect = [&](int32_t& slot, std::span<const std::string_view> texts) {
    if (slot != -1) return;
    for (int32_t id = 0; id < n32; ++id) {
      if (contains(texts, v.text[id]) && canonical(id)) {
        slot = id;
        v.attr[id] |= kAttrControl;
        return;
      }
    }
  };
  detect(v.eot, kEotTexts);
  detect(v.eom, kEomTexts);
  detect(v.fim_pad, kFimPadTexts);
  detect(v.fim_rep, kFimRepTexts);
  detect(v.fim_sep, kFimSepTexts);

  for (int32_t id : {v.fim_pad, v.fim_rep, v.fim_sep}) {
    if (id >= 0) v.eog.insert(id);
  }
  for (int32_t id = 0; id < n32; ++id) {
    if (contains(kEogTexts, v.text[id]) && canonical(id)) {
      v.eog.insert(id);
      v.attr[id] |= kAttrControl;
    }
  }
  // gpt-oss: always rendered.
  for (std::string_view t : {"<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"}) {
    if (int32_t id = v.find(t); id >= 0) v.attr[id] = kAttrUserDefined;
  }
  for (int32_t id : {v.eos, v.eot, v.eom}) {
    if (id >= 0) v.eog.insert(id);
  }
  {
    // o200k_harmony / solar-open: "<|end|>" ends a message, not generation.
    bool has_return = false, has_call = false, has_flush = false;
    int32_t end_id = -1;
    for (int32_t id : v.eog) {
      const std::string_view t = v.text[id];
      if (t == "<|return|>") has_return = true;
      else if (t == "<|call|>" || t == "<|calls|>") has_call = true;
      else if (t == "<|flush|>") has_flush = true;
      else if (t == "<|end|>") end_id = id;
    }
    if (end_id >= 0 && ((has_return && has_call) || (has_call && has_flush))) {
      v.eog.erase(end_id);
      v.attr[end_id] = kAttrUserDefined;
    }
  }
  {
    // gemma4 / plamo2: "</s>" is an ordinary token there.
    bool has_marker = false;
    int32_t s_id = -1;
    for (int32_t id : v.eog) {
      const std::string_view t = v.text[id];
      if (t == "<|tool_response>" || t == "<|plamo:eos|>") has_marker = true;
      else if (t == "</s>") s_id = id;
    }
    if (has_marker && s_id >= 0) {
      v.eog.erase(s_id);
      v.attr[s_id] = kAttrNormal;
    }
  }

  for (int32_t id = 0; id < n32; ++id) {
    if (v.attr[id] & (kAttrControl | kAttrUserDefined | kAttrUnknown)) v.special_order.push_back(id);
  }
  std::stable_sort(v.special_order.begin(), v.special_order.end(),
                   [&](int32_t a, int32_t b) { return v.text[a].size() > v.text[b].size(); });

  // Phi-3 files expect special tokens to swallow the whitespace after them.
  std::string name = f.get_string("general.name").value_or("");
  std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return std::tolower(c); });
  if (name.find("phi-3") != std::string::npos || name.find("phi3") != std::string::npos) {
    for (int32_t id : v.special_order) v.attr[id] |= kAttrRstrip;
    if (int32_t id = v.find("</s>"); id >= 0) v.attr[id] |= kAttrRstrip;
    for (std::string_view t : {"<unk>", "<s>", "<|endoftext|>"}) {
      if (int32_t id = v.find(t); id >= 0) v.attr[id] &= ~kAttrRstrip;
    }
  }

  std::vector<std::string> special_texts;
  special_texts.reserve(v.special_order.size());
  for (int32_t id : v.special_order) special_texts.emplace_back(v.text[id]);
  v.special_matcher.build(special_texts);

  for (int b = 0; b < 256; ++b) {
    const std::string hex = fmt::format("<0x{:02X}>", b);
    int32_t id = v.find(hex);
    if (id < 0) id = v.find(std::string_view(reinterpret_cast<const char*>(&b), 1));
    v.byte_token[b] = id;
  }
  return v;
}

void TextTable::push_back(std::string_view s) {
  if (s.size() > UINT32_MAX - chars_.size())
    fail(ErrorKind::kInvalidFile, "strings of over 4 GiB in all (at entry {})", size());
  chars_.append(s);
  start_.push_back(static_cast<uint32_t>(chars_.size()));
}

void StringIndex::build(const TextTable& keys, bool last_wins) {
  if (keys.size() > kMaxKeys)
    fail(ErrorKind::kInvalidFile, "{} strings to index: more than the {} supported", keys.size(), kMaxKeys);
  size_t cap = 16;
  while (cap < keys.size() * 2) cap <<= 1;
  slots_.assign(cap, 0);
  mask_ = cap - 1;
  const std::hash<std::string_view> hasher;
  for (size_t i = 0; i < keys.size(); ++i) {
    const size_t h = hasher(keys[i]);
    const uint32_t tag = static_cast<uint32_t>(h >> 56) << 24;
    for (size_t s = h & mask_;; s = (s + 1) & mask_) {
      uint32_t& slot = slots_[s];
      if (slot == 0) {
        slot = tag | static_cast<uint32_t>(i + 1);
        break;
      }
      if ((slot & 0xFF000000u) == tag && keys[(slot & kMaxKeys) - 1] == keys[i]) {
        if (last_wins) slot = tag | static_cast<uint32_t>(i + 1);
        break;
      }
    }
  }
}

int32_t StringIndex::find(const TextTable& keys, std::string_view str) const {
  if (slots_.empty()) return -1;
  const size_t h = std::hash<std::string_view>{}(str);
  const uint32_t tag = static_cast<uint32_t>(h >> 56) << 24;
  for (size_t s = h & mask_;; s = (s + 1) & mask_) {
    const uint32_t slot = slots_[s];
    if (slot == 0) return -1;
    const auto pos = static_cast<int32_t>((slot & kMaxKeys) - 1);
    if ((slot & 0xFF000000u) == tag && keys[pos] == str) return pos;
  }
}

void SpecialMatcher::build(const std::vector<std::string>& texts) {
  // Built with a hash map of edges, then laid out flat.
  std::unordered_map<uint64_t, int32_t> edges;  // (node << 8 | byte) -> child
  first_match_.assign(1, -1);
  match_next_.assign(texts.size(), -1);
  std::fill(std::begin(first_byte_), std::end(first_byte_), false);
  // Insert in reverse so each node's list comes out in ascending index order.
  for (size_t k = texts.size(); k-- > 0;) {
    const std::string& t = texts[k];
    if (t.empty()) continue;
    first_byte_[static_cast<uint8_t>(t[0])] = true;
    int32_t node = 0;
    for (char c : t) {
      const uint64_t key = (static_cast<uint64_t>(node) << 8) | static_cast<uint8_t>(c);
      auto it = edges.find(key);
      if (it == edges.end()) {
        first_match_.push_back(-1);
        it = edges.emplace(key, static_cast<int32_t>(first_match_.size() - 1)).first;
      }
      node = it->second;
    }
    match_next_[k] = first_match_[node];
    first_match_[node] = static_cast<int32_t>(k);
  }
  std::vector<std::pair<uint64_t, int32_t>> sorted(edges.begin(), edges.end());
  edges = {};
  std::sort(sorted.begin(), sorted.end());
  edge_start_.assign(first_match_.size() + 1, 0);
  edge_byte_.resize(sorted.size());
  edge_child_.resize(sorted.size());
  for (size_t e = 0; e < sorted.size(); ++e) {
    ++edge_start_[(sorted[e].first >> 8) + 1];
    edge_byte_[e] = static_cast<uint8_t>(sorted[e].first & 0xFF);
    edge_child_[e] = sorted[e].second;
  }
  for (size_t n = 1; n < edge_start_.size(); ++n) edge_start_[n] += edge_start_[n - 1];
}

int32_t SpecialMatcher::child(int32_t node, uint8_t byte) const {
  const auto b = edge_byte_.begin() + edge_start_[node], e = edge_byte_.begin() + edge_start_[node + 1];
  const auto it = std::lower_bound(b, e, byte);
  return it != e && *it == byte ? edge_child_[it - edge_byte_.begin()] : -1;
}

std::vector<int32_t> SpecialMatcher::present_in(std::string_view text) const {
  std::vector<char> seen(match_next_.size(), 0);
  std::vector<int32_t> found;
  for (size_t i = 0; i < text.size(); ++i) {
    if (!first_byte_[static_cast<uint8_t>(text[i])]) continue;
    int32_t node = 0;
    for (size_t j = i; j < text.size(); ++j) {
      node = child(node, static_cast<uint8_t>(text[j]));
      if (node < 0) break;
      for (int32_t k = first_match_[node]; k >= 0; k = match_next_[k]) {
        if (!seen[k]) {
          seen[k] = 1;
          found.push_back(k);
        }
      }
    }
  }
  std::sort(found.begin(), found.end());
  return found;
}

std::vector<Fragment> split_special(const Vocab& v, std::string_view text, bool parse_special, TextRanges literal) {
  std::vector<Fragment> frags;
  if (text.empty()) return frags;
  frags.push_back({-1, 0, text.size()});

  std::vector<Fragment> next;
  for (int32_t k : v.special_matcher.present_in(text)) {
    const int32_t id = v.special_order[k];
    const uint32_t attr = v.attr[id];
    const bool control = attr & (kAttrControl | kAttrUnknown);
    if (!parse_special && control) continue;
    const std::string_view tok = v.text[id];
    const auto in_literal = [&](size_t m) {
      if (!control) return false;
      for (const auto& [off, len] : literal)
        if (m < off + len && m + tok.size() > off) return true;
      return false;
    };
    next.clear();
    for (const Fragment& f : frags) {
      if (f.token >= 0) {
        next.push_back(f);
        continue;
      }
      size_t pos = f.offset;
      const size_t end = f.offset + f.length;
      const std::string_view window = text.substr(0, end);
      while (true) {
        size_t m = window.find(tok, pos);
        while (m != std::string_view::npos && in_literal(m)) m = window.find(tok, m + 1);
        if (m == std::string_view::npos) {
          if (end > pos) next.push_back({-1, pos, end - pos});
          break;
        }
        size_t left_len = m - pos;
        if (attr & kAttrLstrip) {
          while (left_len > 0 && ascii_space(text[pos + left_len - 1])) --left_len;
        }
        if (left_len > 0) next.push_back({-1, pos, left_len});
        next.push_back({id, m, tok.size()});
        pos = m + tok.size();
        if (attr & kAttrRstrip) {
          while (pos < end && ascii_space(text[pos])) ++pos;
        }
        if (pos >= end) break;
      }
    }
    frags.swap(next);
  }
  return frags;
}

}  // namespace tandem::tok

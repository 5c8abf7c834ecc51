#include <queue>
#include <string>

#include "tokenizer/algorithms.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/unicode.h"

namespace tandem::tok {

namespace {

struct Symbol {
  int prev;
  int next;
  size_t off;  // into the word
  size_t n;    // 0 once merged into its left neighbour
};

struct Bigram {
  int left;
  int right;
  int32_t rank;
  std::string text;  // what the pair spelled when queued
};

struct BigramOrder {  // min-heap on rank, then the leftmost
  bool operator()(const Bigram& a, const Bigram& b) const {
    return a.rank > b.rank || (a.rank == b.rank && a.left > b.left);
  }
};

void encode_word(const Vocab& v, const std::string& word, std::vector<int32_t>& out, std::string& key) {
  if (v.ignore_merges) {
    if (const int32_t id = v.find(word); id >= 0) {
      out.push_back(id);
      return;
    }
  }
  std::vector<Symbol> sym;
  sym.reserve(word.size());
  for (size_t off = 0; off < word.size();) {
    const size_t len = std::min(utf8_len_from_lead(static_cast<uint8_t>(word[off])), word.size() - off);
    const int idx = static_cast<int>(sym.size());
    sym.push_back({idx - 1, off + len == word.size() ? -1 : idx + 1, off, len});
    off += len;
  }
  const std::string_view w(word);
  auto piece = [&](int i) { return w.substr(sym[i].off, sym[i].n); };

  std::priority_queue<Bigram, std::vector<Bigram>, BigramOrder> queue;
  auto try_add = [&](int left, int right) {
    if (left < 0 || right < 0) return;
    key.assign(piece(left));
    key += ' ';
    key += piece(right);
    const int32_t rank = v.bpe_rank(key);
    if (rank < 0) return;
    std::string text(piece(left));
    text += piece(right);
    queue.push({left, right, rank, std::move(text)});
  };
  for (int i = 1; i < static_cast<int>(sym.size()); ++i) try_add(i - 1, i);

  while (!queue.empty()) {
    const Bigram b = queue.top();
    queue.pop();
    Symbol& l = sym[b.left];
    Symbol& r = sym[b.right];
    if (l.n == 0 || r.n == 0) continue;
    // Stale when either side has changed since the pair was queued.
    if (l.n + r.n != b.text.size() || w.substr(l.off, l.n + r.n) != b.text || l.off + l.n != r.off) continue;
    l.n += r.n;
    r.n = 0;
    l.next = r.next;
    if (r.next >= 0) sym[r.next].prev = b.left;
    try_add(l.prev, b.left);
    try_add(b.left, l.next);
  }

  for (int i = sym.empty() ? -1 : 0; i != -1; i = sym[i].next) {
    const std::string_view s = piece(i);
    if (const int32_t id = v.find(s); id >= 0) {
      out.push_back(id);
      continue;
    }
    // As llama.cpp: look up each byte of the (byte-encoded) symbol on its own;
    // bytes without a token are dropped.
    for (char c : s) {
      if (const int32_t id = v.find(std::string_view(&c, 1)); id >= 0) out.push_back(id);
    }
  }
}

}  // namespace

void bpe_encode(const Vocab& v, const PreTokenizer& pre, std::string_view text, std::vector<int32_t>& out) {
  std::string key;
  for (const std::string& word : pre.split(text, /*byte_encode=*/true)) encode_word(v, word, out, key);
}

}  // namespace tandem::tok

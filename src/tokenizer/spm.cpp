#include <queue>
#include <string>

#include "tokenizer/algorithms.h"
#include "tokenizer/unicode.h"

namespace tandem::tok {

namespace {

struct Symbol {
  int prev;
  int next;
  size_t off;  // into the text
  size_t n;    // 0 once merged into its left neighbour
};

struct Bigram {
  int left;
  int right;
  float score;
  size_t size;
};

struct BigramOrder {  // max-heap: best score on top, then the leftmost
  bool operator()(const Bigram& a, const Bigram& b) const {
    return a.score < b.score || (a.score == b.score && a.left > b.left);
  }
};

}  // namespace

void spm_encode(const Vocab& v, std::string_view text, std::vector<int32_t>& out) {
  std::vector<Symbol> sym;
  sym.reserve(text.size());
  for (size_t off = 0; off < text.size();) {
    const size_t len = std::min(utf8_len_from_lead(static_cast<uint8_t>(text[off])), text.size() - off);
    const int idx = static_cast<int>(sym.size());
    sym.push_back({idx - 1, off + len == text.size() ? -1 : idx + 1, off, len});
    off += len;
  }

  std::priority_queue<Bigram, std::vector<Bigram>, BigramOrder> queue;
  auto try_add = [&](int left, int right) {
    if (left < 0 || right < 0) return;
    const std::string_view s = text.substr(sym[left].off, sym[left].n + sym[right].n);
    const int32_t id = v.find(s);
    if (id < 0) return;
    queue.push({left, right, v.score[id], s.size()});
  };
  for (int i = 1; i < static_cast<int>(sym.size()); ++i) try_add(i - 1, i);

  while (!queue.empty()) {
    const Bigram b = queue.top();
    queue.pop();
    Symbol& l = sym[b.left];
    Symbol& r = sym[b.right];
    // Stale: one side was merged away since this pair was queued.
    if (l.n == 0 || r.n == 0 || l.n + r.n != b.size) continue;
    l.n += r.n;
    r.n = 0;
    l.next = r.next;
    if (r.next >= 0) sym[r.next].prev = b.left;
    try_add(l.prev, b.left);
    try_add(b.left, l.next);
  }

  for (int i = sym.empty() ? -1 : 0; i != -1; i = sym[i].next) {
    const std::string_view s = text.substr(sym[i].off, sym[i].n);
    // Merged symbols are tokens by construction; only single characters
    // missing from the vocab fall back to bytes.
    if (const int32_t id = v.find(s); id >= 0) {
      out.push_back(id);
      continue;
    }
    for (char c : s) {
      const int32_t id = v.byte_token[static_cast<uint8_t>(c)];
      if (id >= 0) out.push_back(id);
      else if (v.unk >= 0) out.push_back(v.unk);
    }
  }
}

}  // namespace tandem::tok

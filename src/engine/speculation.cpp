#include "engine/speculation.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "engine/sequence.h"

namespace tandem {

SpecMode parse_spec_mode(std::string_view name) {
  if (name == "off" || name == "none") return SpecMode::kOff;
  if (name == "ngram" || name == "lookup") return SpecMode::kNgram;
  if (name == "draft") return SpecMode::kDraft;
  fail(ErrorKind::kInvalidArgument, "unknown speculation mode '{}' (off, ngram or draft)", name);
}

const char* spec_mode_name(SpecMode m) {
  switch (m) {
    case SpecMode::kOff: return "off";
    case SpecMode::kNgram: return "ngram";
    case SpecMode::kDraft: return "draft";
  }
  return "?";
}

// --- CostCurve ---------------------------------------------------------------

void CostCurve::observe(int32_t rows, double seconds) {
  if (rows <= 0 || !(seconds > 0)) return;
  if (static_cast<size_t>(rows) >= t_.size()) t_.resize(static_cast<size_t>(rows) + 1, -1.0);
  double& t = t_[rows];
  if (t < 0) {
    t = seconds;
    ++points_;
  } else {
    t += 0.2 * (seconds - t);  // a running average that follows the machine's drift
  }
}

double CostCurve::at(int32_t rows) const {
  if (points_ == 0 || rows <= 0) return 0;
  const int32_t n = static_cast<int32_t>(t_.size());
  if (rows < n && t_[rows] >= 0) return t_[rows];
  int32_t lo = std::min(rows, n - 1);
  while (lo > 0 && t_[lo] < 0) --lo;
  int32_t hi = rows + 1;
  while (hi < n && t_[hi] < 0) ++hi;
  if (lo > 0 && hi < n) return t_[lo] + (t_[hi] - t_[lo]) * (rows - lo) / double(hi - lo);
  if (lo == 0) return t_[hi];  // below every point seen: at least that step's cost
  // Beyond every point: the line through the last two.
  int32_t lo2 = lo - 1;
  while (lo2 > 0 && t_[lo2] < 0) --lo2;
  if (lo2 == 0) return t_[lo] * rows / lo;
  const double slope = std::max(0.0, (t_[lo] - t_[lo2]) / (lo - lo2));
  return t_[lo] + slope * (rows - lo);
}

// --- prompt lookup -------------------------------------------------------------

namespace {

uint64_t ngram_hash(std::span<const int32_t> toks) {
  uint64_t h = 0x9E3779B97F4A7C15ull ^ toks.size();
  for (int32_t t : toks) {
    h ^= static_cast<uint64_t>(static_cast<uint32_t>(t)) + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
    h *= 0xBF58476D1CE4E5B9ull;
  }
  return h ^ (h >> 31);
}

}  // namespace

void NgramDrafter::index(Sequence& seq) {
  // Every n-gram that ends before the last token: the sequence's own suffix
  // must find an earlier occurrence, not itself.
  SpecState& st = seq.spec;
  const std::vector<int32_t>& t = seq.tokens;
  const int32_t end = static_cast<int32_t>(t.size()) - 1;
  for (int32_t e = std::max(st.indexed + 1, 1); e <= end; ++e)
    for (int32_t n = cfg_.ngram_min; n <= cfg_.ngram_max && n <= e; ++n)
      st.ngrams[ngram_hash(std::span<const int32_t>(t.data() + e - n, n))] = e;
  st.indexed = std::max(st.indexed, end);
}

int32_t NgramDrafter::available(Sequence& seq, int32_t cap) {
  index(seq);
  SpecState& st = seq.spec;
  st.match_end = -1;
  st.match_len = 0;
  const std::vector<int32_t>& t = seq.tokens;
  const int32_t size = static_cast<int32_t>(t.size());
  for (int32_t n = std::min(cfg_.ngram_max, size - 1); n >= cfg_.ngram_min; --n) {
    const std::span<const int32_t> suffix(t.data() + size - n, n);
    const auto it = st.ngrams.find(ngram_hash(suffix));
    if (it == st.ngrams.end()) continue;
    const int32_t e = it->second;
    if (e >= size || e < n || !std::equal(suffix.begin(), suffix.end(), t.begin() + (e - n))) continue;
    st.match_end = e;
    st.match_len = std::min(cap, size - e);
    return st.match_len;
  }
  return 0;
}

void NgramDrafter::propose(std::span<Sequence* const> seqs, std::span<const int32_t> want,
                           std::span<std::vector<int32_t>> out) {
  for (size_t i = 0; i < seqs.size(); ++i) {
    const SpecState& st = seqs[i]->spec;
    const int32_t n = std::min(want[i], st.match_len);
    out[i].assign(seqs[i]->tokens.begin() + st.match_end, seqs[i]->tokens.begin() + st.match_end + std::max(n, 0));
  }
}

void NgramDrafter::forget(Sequence& seq, int32_t n_tokens) {
  if (n_tokens >= 0 && n_tokens > seq.spec.indexed) return;
  seq.spec.ngrams.clear();  // tokens were taken back: index again from the start
  seq.spec.indexed = 0;
}

// --- policy ----------------------------------------------------------------------

void SpecPolicy::choose(int32_t base_rows, std::span<const double> acceptance, std::span<const int32_t> avail,
                        const Drafter* draft, std::span<int32_t> k) const {
  std::fill(k.begin(), k.end(), 0);
  const size_t n = k.size();
  if (!cfg_.adaptive) {
    for (size_t i = 0; i < n; ++i) k[i] = std::min(avail[i], cfg_.max_draft);
    return;
  }
  if (n == 0 || target_.empty()) return;
  // Add drafted tokens one at a time, the one with the most expected gain
  // first (the j-th draft of a sequence is kept with probability a^j), and
  // keep the prefix of additions with the most expected tokens per second.
  std::vector<int32_t> level;  // level[j]: sequences drafting at least j + 1 tokens
  const auto draft_cost = [&] {
    if (!draft) return 0.0;
    double c = 0;
    for (int32_t rows : level) c += draft->cost(rows, 1);
    return c;
  };
  std::vector<double> gain(n);
  for (size_t i = 0; i < n; ++i) gain[i] = avail[i] > 0 ? acceptance[i] : 0;
  double tokens = static_cast<double>(n);
  int32_t rows = base_rows;
  const double base = tokens / target_.at(rows);
  double best = base;
  std::vector<int32_t> kk(n, 0);
  std::vector<int32_t> best_k(n, 0);
  for (int32_t added = 0; added < cfg_.max_draft * static_cast<int32_t>(n); ++added) {
    size_t pick = n;
    for (size_t i = 0; i < n; ++i)
      if (kk[i] < avail[i] && gain[i] > 0 && (pick == n || gain[i] > gain[pick])) pick = i;
    if (pick == n || gain[pick] < 1e-3) break;
    tokens += gain[pick];
    gain[pick] *= acceptance[pick];
    if (static_cast<size_t>(kk[pick]) == level.size()) level.push_back(0);
    ++level[kk[pick]];
    ++kk[pick];
    ++rows;
    const double rate = tokens / (target_.at(rows) + draft_cost());
    if (rate > best) {
      best = rate;
      best_k = kk;
    }
  }
  if (best < base * cfg_.min_gain) return;
  std::copy(best_k.begin(), best_k.end(), k.begin());
}

}  // namespace tandem

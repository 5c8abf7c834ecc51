#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.h"

namespace tandem {

namespace {

using Cand = std::pair<float, int32_t>;  // (logit, token id)

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
// Far above any real vocabulary; a larger value is a typo, not a request.
constexpr int32_t kMaxTopK = 1 << 24;
// top-p sorts this many candidates first and widens only if their mass is short.
constexpr size_t kTopPFirstSort = 256;

// Ranks candidates: higher logit first, lower id first on ties, so every
// filter and the greedy pick agree on the order and results are reproducible.
bool better(const Cand& a, const Cand& b) {
  return a.first > b.first || (a.first == b.first && a.second < b.second);
}

// NaN would break the strict weak ordering the sorts rely on, and +inf would
// turn the softmax's (logit - max) into NaN; the largest float keeps its meaning.
float clean(float x) {
  if (std::isnan(x)) return kNegInf;
  return x == std::numeric_limits<float>::infinity() ? std::numeric_limits<float>::max() : x;
}

struct Penalized {
  int32_t id;
  float logit;
};

void require_finite(float v, const char* name) {
  if (!std::isfinite(v)) fail(ErrorKind::kInvalidArgument, "sampling: {} must be a finite number, got {}", name, v);
}

uint32_t random_seed() {
  std::random_device rd;
  return rd();
}

std::mt19937 make_rng(uint64_t seed) {
  if (seed == 0xFFFFFFFFull) return std::mt19937(random_seed());
  if (seed <= 0xFFFFFFFFull) return std::mt19937(static_cast<uint32_t>(seed));
  // mt19937 keeps only 32 bits of a plain seed; feed both halves so that
  // seeds differing above bit 31 give different streams.
  std::seed_seq seq{static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)};
  return std::mt19937(seq);
}

// The penalized logits of the tokens in the penalty window, sorted by id.
std::vector<Penalized> penalize(const SamplingParams& p, std::span<const float> logits,
                                std::span<const int32_t> history) {
  std::vector<Penalized> out;
  const bool active = p.repeat_penalty != 1.0f || p.frequency_penalty != 0.0f || p.presence_penalty != 0.0f;
  if (!active || p.repeat_last_n == 0 || history.empty()) return out;
  size_t window = history.size();
  if (p.repeat_last_n > 0) window = std::min(window, static_cast<size_t>(p.repeat_last_n));
  std::vector<int32_t> ids(history.end() - static_cast<std::ptrdiff_t>(window), history.end());
  std::sort(ids.begin(), ids.end());
  for (size_t i = 0; i < ids.size();) {
    const int32_t id = ids[i];
    if (id < 0 || static_cast<size_t>(id) >= logits.size()) {
      fail(ErrorKind::kInvalidArgument, "sampling: history token {} is outside the vocabulary of {} tokens", id,
           logits.size());
    }
    size_t j = i;
    while (j < ids.size() && ids[j] == id) ++j;
    const float count = static_cast<float>(j - i);
    float l = clean(logits[static_cast<size_t>(id)]);
    // llama.cpp's rule: dividing a negative logit would raise it, so those are multiplied.
    l = l <= 0.0f ? l * p.repeat_penalty : l / p.repeat_penalty;
    l -= count * p.frequency_penalty + p.presence_penalty;
    out.push_back({id, clean(l)});
    i = j;
  }
  return out;
}

// Calls fn(logit, id) for every token in id order, penalized where it applies.
template <typename Fn>
void for_each_logit(std::span<const float> logits, const std::vector<Penalized>& pen, Fn&& fn) {
  size_t pi = 0;
  const size_t n = logits.size();
  for (size_t i = 0; i < n; ++i) {
    if (pi < pen.size() && static_cast<size_t>(pen[pi].id) == i) {
      fn(pen[pi].logit, static_cast<int32_t>(i));
      ++pi;
    } else {
      fn(clean(logits[i]), static_cast<int32_t>(i));
    }
  }
}

}  // namespace

Sampler::Sampler(const SamplingParams& p) : p_(p) {
  if (std::isnan(p.temperature) || std::isinf(p.temperature)) {
    fail(ErrorKind::kInvalidArgument, "sampling: temperature must be a finite number, got {}", p.temperature);
  }
  if (p.top_k > kMaxTopK) {
    fail(ErrorKind::kInvalidArgument, "sampling: top_k {} is larger than any vocabulary (max {}; <= 0 turns it off)",
         p.top_k, kMaxTopK);
  }
  if (!(p.top_p > 0.0f && p.top_p <= 1.0f)) {
    fail(ErrorKind::kInvalidArgument, "sampling: top_p must be in (0, 1], got {}", p.top_p);
  }
  if (!(p.min_p >= 0.0f && p.min_p <= 1.0f)) {
    fail(ErrorKind::kInvalidArgument, "sampling: min_p must be in [0, 1], got {}", p.min_p);
  }
  if (!(p.repeat_penalty > 0.0f) || std::isinf(p.repeat_penalty)) {
    fail(ErrorKind::kInvalidArgument, "sampling: repeat_penalty must be a finite number > 0, got {}",
         p.repeat_penalty);
  }
  if (p.repeat_last_n < -1) {
    fail(ErrorKind::kInvalidArgument, "sampling: repeat_last_n must be >= -1 (-1: whole history), got {}",
         p.repeat_last_n);
  }
  require_finite(p.frequency_penalty, "frequency_penalty");
  require_finite(p.presence_penalty, "presence_penalty");
  rng_ = make_rng(p.seed);
}

int32_t Sampler::sample(std::span<const float> logits, std::span<const int32_t> history) {
  const size_t n = logits.size();
  if (n == 0) fail(ErrorKind::kInvalidArgument, "sampling: empty logits");
  if (n > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    fail(ErrorKind::kInvalidArgument, "sampling: {} logits exceed the token id range", n);
  }
  const std::vector<Penalized> pen = penalize(p_, logits, history);

  const bool greedy = p_.temperature <= 0.0f;
  const size_t k = greedy ? 1 : (p_.top_k > 0 ? std::min(n, static_cast<size_t>(p_.top_k)) : n);

  // Candidates. With top-k, a bounded heap scan avoids sorting the whole vocabulary.
  cand_.clear();
  bool sorted = false;
  if (k < n) {
    cand_.reserve(k);
    // The heap's front is the worst kept candidate.
    for_each_logit(logits, pen, [&](float l, int32_t id) {
      const Cand c{l, id};
      if (cand_.size() < k) {
        cand_.push_back(c);
        std::push_heap(cand_.begin(), cand_.end(), better);
      } else if (better(c, cand_.front())) {
        std::pop_heap(cand_.begin(), cand_.end(), better);
        cand_.back() = c;
        std::push_heap(cand_.begin(), cand_.end(), better);
      }
    });
    std::sort_heap(cand_.begin(), cand_.end(), better);
    while (!cand_.empty() && cand_.back().first == kNegInf) cand_.pop_back();
    sorted = true;
  } else {
    cand_.reserve(n);
    for_each_logit(logits, pen, [&](float l, int32_t id) {
      if (l != kNegInf) cand_.push_back({l, id});
    });
  }
  if (cand_.empty()) fail(ErrorKind::kInvalidArgument, "sampling: all {} logits are -inf or NaN", n);
  if (greedy || cand_.size() == 1) {
    if (!greedy) std::uniform_real_distribution<double>(0.0, 1.0)(rng_);  // one draw per pick, always
    return cand_.front().second;
  }

  auto max_logit = [&] {
    if (sorted) return cand_.front().first;
    float m = kNegInf;
    for (const Cand& c : cand_) m = std::max(m, c.first);
    return m;
  };

  // top-p: probabilities at temperature 1 over what top-k left.
  if (p_.top_p < 1.0f) {
    const float maxl = max_logit();
    double total = 0.0;
    for (const Cand& c : cand_) total += std::exp(static_cast<double>(c.first - maxl));
    const double target = static_cast<double>(p_.top_p) * total;
    size_t sorted_upto = sorted ? cand_.size() : 0;
    size_t keep = cand_.size();
    double cum = 0.0;
    for (size_t i = 0; i < cand_.size(); ++i) {
      if (i == sorted_upto) {
        // Sort the next block of the best remaining candidates; the mass is usually
        // reached within the first few hundred, so the full sort is rarely paid.
        const size_t next = std::min(cand_.size(), std::max(kTopPFirstSort, 2 * sorted_upto));
        std::partial_sort(cand_.begin() + static_cast<std::ptrdiff_t>(sorted_upto),
                          cand_.begin() + static_cast<std::ptrdiff_t>(next), cand_.end(), better);
        sorted_upto = next;
      }
      cum += std::exp(static_cast<double>(cand_[i].first - maxl));
      if (cum >= target) {
        keep = i + 1;
        break;
      }
    }
    cand_.resize(keep);
    sorted = true;
  }

  // min-p: p_i >= min_p * p_max is logit_i >= max_logit + log(min_p).
  if (p_.min_p > 0.0f) {
    const float threshold = max_logit() + std::log(p_.min_p);
    if (sorted) {
      auto it = std::find_if(cand_.begin() + 1, cand_.end(), [&](const Cand& c) { return c.first < threshold; });
      cand_.erase(it, cand_.end());
    } else {
      std::erase_if(cand_, [&](const Cand& c) { return c.first < threshold; });
    }
  }

  // Temperature, softmax and the draw, in one pass over unnormalized weights.
  const double rnd = std::uniform_real_distribution<double>(0.0, 1.0)(rng_);
  if (cand_.size() == 1) return cand_.front().second;
  const float maxl = max_logit();
  const double inv_t = 1.0 / static_cast<double>(p_.temperature);
  double total = 0.0;
  for (Cand& c : cand_) {
    const double w = std::exp(static_cast<double>(c.first - maxl) * inv_t);
    c.first = static_cast<float>(w);
    total += w;
  }
  const double target = rnd * total;
  double cum = 0.0;
  int32_t last_positive = cand_.front().second;
  for (const Cand& c : cand_) {
    if (c.first <= 0.0f) continue;
    cum += c.first;
    last_positive = c.second;
    if (cum > target) return c.second;
  }
  return last_positive;  // rounding left target at the very end of the mass
}

StopMatch find_stop(std::string_view text, std::span<const std::string> stops) {
  StopMatch m;
  for (const std::string& s : stops) {
    if (s.empty()) continue;
    const size_t pos = text.find(s);
    if (pos < m.pos) m.pos = pos;
  }
  if (m.pos != std::string::npos) {
    m.safe_len = m.pos;
    return m;
  }
  m.safe_len = text.size();
  for (const std::string& s : stops) {
    if (s.empty()) continue;
    // Longest tail of the text that is a proper prefix of s.
    for (size_t len = std::min(s.size() - 1, text.size()); len > 0; --len) {
      if (text.substr(text.size() - len) == std::string_view(s).substr(0, len)) {
        m.safe_len = std::min(m.safe_len, text.size() - len);
        break;
      }
    }
  }
  return m;
}

}  // namespace tandem

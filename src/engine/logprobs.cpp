#include "engine/logprobs.h"

#include <algorithm>

#include "kernels/ops.h"

namespace tandem {

TokenLogprob token_logprob(std::span<const float> logits, int32_t token, int32_t top_k,
                           std::vector<TokenLogprob>* top) {
  const float lse = log_sum_exp(logits.data(), static_cast<int64_t>(logits.size()));
  if (top) top->clear();
  if (top && top_k > 0) {
    // A sorted window of the best k seen so far: most tokens fail the test
    // against its last entry, so this is one compare per token, not a sort
    // of the vocabulary (262k entries for Gemma).
    const int32_t k = std::min<int32_t>(top_k, static_cast<int32_t>(logits.size()));
    auto better = [&](int32_t a, int32_t b) { return logits[a] != logits[b] ? logits[a] > logits[b] : a < b; };
    std::vector<int32_t> best;
    best.reserve(k + 1);
    for (int32_t i = 0; i < static_cast<int32_t>(logits.size()); ++i) {
      if (static_cast<int32_t>(best.size()) == k && !better(i, best.back())) continue;
      best.insert(std::upper_bound(best.begin(), best.end(), i, better), i);
      if (static_cast<int32_t>(best.size()) > k) best.pop_back();
    }
    for (int32_t id : best) top->push_back({id, logits[id] - lse});
  }
  return {token, logits[token] - lse};
}

}  // namespace tandem

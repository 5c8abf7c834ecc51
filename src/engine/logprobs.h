// Log-probabilities as the OpenAI API reports them: of the model's own
// distribution (log-softmax of the raw logits, before temperature or any
// sampling filter), for one token and for the k most likely ones.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "engine/request.h"

namespace tandem {

// The log-probability of `token` under `logits`; with top_k > 0, also the
// top_k most likely tokens into `top` (most likely first, ties by lower id).
// logits.size() is the vocabulary; token must be inside it.
TokenLogprob token_logprob(std::span<const float> logits, int32_t token, int32_t top_k,
                           std::vector<TokenLogprob>* top);

}  // namespace tandem

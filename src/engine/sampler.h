// Picks the next token from logits. The chain follows llama.cpp's order:
// logit bias -> penalties -> top-k -> top-p -> min-p -> temperature -> draw. temperature <= 0
// (negative included, as in llama.cpp) is greedy: argmax of the penalized
// logits, lowest id on ties, the other filters ignored. Seeded: same seed, same
// logits, same picks. NaN logits count as -inf; -inf tokens are never picked.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <string>
#include <vector>

namespace tandem {

// The largest top_k taken (no vocabulary is larger); <= 0 turns top-k off.
constexpr int32_t kMaxTopK = 1 << 24;

struct SamplingParams {
  float temperature = 0.8f;
  int32_t top_k = 40;          // <= 0: off
  float top_p = 0.95f;         // >= 1: off
  float min_p = 0.05f;         // <= 0: off
  float repeat_penalty = 1.0f; // 1: off (llama.cpp's rule: divide positive logits, multiply negative)
  int32_t repeat_last_n = 64;  // how many recent tokens the penalties look at (-1: all)
  float frequency_penalty = 0.0f;  // OpenAI-style, subtracts count * f
  float presence_penalty = 0.0f;   // subtracts p once for any token seen
  uint64_t seed = 0xFFFFFFFF;      // 0xFFFFFFFF: random seed; all 64 bits count
  // Added to these tokens' logits before anything else (OpenAI's logit_bias);
  // any order, each id once.
  std::vector<std::pair<int32_t, float>> logit_bias;
};

// Which tokens may come next (constrained decoding, e.g. JSON output).
class TokenConstraint {
 public:
  virtual ~TokenConstraint() = default;
  virtual bool allows(int32_t token) const = 0;
};

class Sampler {
 public:
  explicit Sampler(const SamplingParams& p);  // throws kInvalidArgument on absurd values
  // history: the tokens so far (prompt + generated) that penalties look at.
  // With a constraint, a pick it refuses is drawn again with every refused
  // token removed (as llama.cpp applies a grammar): the same distribution as
  // masking first, at the cost of one check for most picks.
  int32_t sample(std::span<const float> logits, std::span<const int32_t> history,
                 const TokenConstraint* constraint = nullptr);
  const SamplingParams& params() const { return p_; }

 private:
  int32_t pick(std::span<const float> logits, std::span<const int32_t> history);

  SamplingParams p_;
  std::mt19937 rng_;
  std::vector<std::pair<float, int32_t>> cand_;  // reused scratch
  std::vector<float> masked_;                    // reused scratch
};

}  // namespace tandem

// The mixture-of-experts feed-forward block: a router picks k of the layer's
// experts for each row and weighs their outputs; an optional shared expert
// runs on every row. Independent of any one family: the gating (softmax or
// sigmoid, before or after the top-k; renormalised, scaled; a selection
// bias) and the optional pieces (router bias, per-expert biases, a shared
// expert with or without a sigmoid gate) come from MoeShape and MoeWeights.
//
// The step's rows are grouped by expert, so each picked expert's matrices are
// read once per call and multiplied as a GEMM over its rows; a decode row
// (n = 1) reads only its k experts. Batch invariance: every product is row
// invariant (kernels/matmul.h), and a row's k outputs are summed in its own
// top-k order, so no row's result depends on which rows share its experts.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/ops.h"
#include "model/config.h"
#include "model/weights.h"

namespace tandem {

class Matmul;
class ThreadPool;

struct MoeShape {
  int64_t n_embd = 0;
  int64_t n_ff_exp = 0;    // one expert's hidden width
  int64_t n_ff_shexp = 0;  // the shared expert's, 0: none
  int32_t n_expert = 0;
  int32_t n_expert_used = 0;
  Activation act = Activation::kSilu;
  MoeGating gating;
  static MoeShape of(const ModelConfig& c);
};

// One row's routing as llama.cpp's build_moe_ffn computes it: probabilities
// from the logits (softmax or sigmoid; kSoftmaxTopK keeps the logits), the k
// largest of probability + select_bias (may be null) in decreasing order,
// their probabilities as weights (kSoftmaxTopK: a softmax over the k
// logits), divided by their sum when normalising (the sum clamped below at
// 2^-14, as llama.cpp does), times the scale. `probs` holds n_expert floats
// of scratch. ids and weights receive k values each.
void moe_route(const MoeGating& g, const float* logits, const float* select_bias, int32_t n_expert, int32_t k,
               float* probs, int32_t* ids, float* weights);

class MoeFfn {
 public:
  explicit MoeFfn(KernelLevel level) : level_(level) {}

  // out[r * ldo + i] = sum_j w[r][j] * expert_{id[r][j]}(x_r)[i] (+ the shared
  // expert's output, times sigmoid(x_r . gate_inp_shexp) where the layer has that
  // gate), for the n rows of x (row stride ldx).
  void run(const MoeWeights& W, const MoeShape& s, const float* x, int64_t ldx, int64_t n, float* out, int64_t ldo,
           Matmul& mm, ThreadPool& pool);

  // The experts the last run picked, k per row (row-major), and their weights.
  const std::vector<int32_t>& last_ids() const { return ids_; }
  const std::vector<float>& last_weights() const { return weights_; }

 private:
  void shared_expert(const MoeWeights& W, const MoeShape& s, const float* x, int64_t ldx, int64_t n, Matmul& mm,
                     ThreadPool& pool);

  KernelLevel level_;
  std::vector<float> logits_, probs_, weights_;
  std::vector<int32_t> ids_;
  std::vector<int32_t> count_, start_, fill_;  // per expert: rows routed, first grouped slot, slots filled
  std::vector<int64_t> grouped_of_;           // per (row, j): its slot among the grouped rows
  std::vector<int64_t> row_of_;               // per grouped slot: its row
  std::vector<float> xg_, g_, u_, y_;         // gathered inputs, gate, up (one expert's rows); outputs (grouped)
  std::vector<float> sh_g_, sh_u_, sh_gate_, sh_y_;
};

}  // namespace tandem

#include "model/moe_ffn.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"
#include "kernels/matmul.h"
#include "runtime/thread_pool.h"

namespace tandem {

MoeShape MoeShape::of(const ModelConfig& c) {
  MoeShape s;
  s.n_embd = c.n_embd;
  s.n_ff_exp = c.n_ff_exp;
  s.n_ff_shexp = c.n_ff_shexp;
  s.n_expert = c.n_expert;
  s.n_expert_used = c.n_expert_used;
  s.act = c.act;
  s.gating = c.moe_gating;
  return s;
}

namespace {

// ggml's softmax: e^(x - max) in float, their sum in double, then one scale.
void softmax_in_place(float* p, int32_t n) {
  float mx = -INFINITY;
  for (int32_t i = 0; i < n; ++i) mx = std::max(mx, p[i]);
  double sum = 0;
  for (int32_t i = 0; i < n; ++i) {
    p[i] = std::exp(p[i] - mx);
    sum += p[i];
  }
  const float inv = static_cast<float>(1.0 / sum);
  for (int32_t i = 0; i < n; ++i) p[i] *= inv;
}

float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

}  // namespace

void moe_route(const MoeGating& g, const float* logits, const float* select_bias, int32_t n_expert, int32_t k,
               float* probs, int32_t* ids, float* weights) {
  std::copy_n(logits, n_expert, probs);
  if (g.func == MoeGating::Func::kSoftmax) softmax_in_place(probs, n_expert);
  if (g.func == MoeGating::Func::kSigmoid)
    for (int32_t i = 0; i < n_expert; ++i) probs[i] = sigmoid(probs[i]);
  // The k best by selection score, best first; ties to the lower id.
  auto score = [&](int32_t e) { return select_bias ? probs[e] + select_bias[e] : probs[e]; };
  for (int32_t j = 0; j < k; ++j) {
    int32_t best = -1;
    for (int32_t e = 0; e < n_expert; ++e) {
      if (std::find(ids, ids + j, e) != ids + j) continue;
      if (best < 0 || score(e) > score(best)) best = e;
    }
    ids[j] = best;
    weights[j] = probs[best];
  }
  if (g.func == MoeGating::Func::kSoftmaxTopK) softmax_in_place(weights, k);
  if (g.normalize) {
    double sum = 0;
    for (int32_t j = 0; j < k; ++j) sum += weights[j];
    const float d = std::max(static_cast<float>(sum), 6.103515625e-5f);
    for (int32_t j = 0; j < k; ++j) weights[j] /= d;
  }
  if (g.scale != 1.0f)
    for (int32_t j = 0; j < k; ++j) weights[j] *= g.scale;
}

void MoeFfn::run(const MoeWeights& W, const MoeShape& s, const float* x, int64_t ldx, int64_t n, float* out,
                 int64_t ldo, Matmul& mm, ThreadPool& pool) {
  if (n <= 0) return;
  const int64_t E = s.n_embd, F = s.n_ff_exp;
  const int32_t NE = s.n_expert, K = s.n_expert_used;
  if (static_cast<int32_t>(W.gate.size()) != NE || K < 1 || K > NE)
    fail(ErrorKind::kInvalidArgument, "MoeFfn: {} experts bound, shape says {} (top {})", W.gate.size(), NE, K);

  // Route: the router's logits for every row, then each row's top-k.
  logits_.resize(static_cast<size_t>(n * NE));
  mm.run(W.router, x, ldx, n, logits_.data(), NE, pool);
  ids_.resize(static_cast<size_t>(n * K));
  weights_.resize(static_cast<size_t>(n * K));
  probs_.resize(static_cast<size_t>(n * NE));
  pool.parallel_for(n, 16, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      float* l = logits_.data() + r * NE;
      if (!W.router_bias.empty())
        for (int32_t e = 0; e < NE; ++e) l[e] += W.router_bias[e];
      moe_route(s.gating, l, W.select_bias.empty() ? nullptr : W.select_bias.data(), NE, K, probs_.data() + r * NE,
                ids_.data() + r * K, weights_.data() + r * K);
    }
  });

  // Group the (row, j) pairs by expert, rows in increasing order within one.
  count_.assign(static_cast<size_t>(NE), 0);
  for (int32_t e : ids_) ++count_[e];
  start_.resize(static_cast<size_t>(NE));
  int32_t max_rows = 0;
  for (int32_t e = 0, acc = 0; e < NE; ++e) {
    start_[e] = acc;
    acc += count_[e];
    max_rows = std::max(max_rows, count_[e]);
  }
  fill_.assign(static_cast<size_t>(NE), 0);
  grouped_of_.resize(static_cast<size_t>(n * K));
  row_of_.resize(static_cast<size_t>(n * K));
  for (int64_t i = 0; i < n * K; ++i) {
    const int32_t e = ids_[i];
    const int64_t slot = start_[e] + fill_[e]++;
    grouped_of_[i] = slot;
    row_of_[slot] = i / K;
  }

  y_.resize(static_cast<size_t>(n * K * E));
  auto add_bias = [&](const WeightVector& b, int32_t e, int64_t width, float* y, int64_t rows) {
    if (b.empty()) return;
    const float* be = b.data() + static_cast<int64_t>(e) * width;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t i = 0; i < width; ++i) y[r * width + i] += be[i];
  };
  auto activate = [&](float* g, const float* u, int64_t rows) {
    pool.parallel_for(rows, 4, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) gated_activation_at(level_, s.act, g + r * F, u + r * F, F);
    });
  };

  if (n == 1) {
    // One row: its k experts share the input, so all their gate and up
    // products run in one parallel region (bit-identical to one at a time).
    g_.resize(static_cast<size_t>(K * F));
    u_.resize(static_cast<size_t>(K * F));
    std::vector<const WeightMatrix*> mats;
    std::vector<float*> outs;
    std::vector<int64_t> lds(static_cast<size_t>(2 * K), F);
    for (int32_t j = 0; j < K; ++j) {
      mats.push_back(&W.gate[ids_[j]]);
      mats.push_back(&W.up[ids_[j]]);
      outs.push_back(g_.data() + j * F);
      outs.push_back(u_.data() + j * F);
    }
    mm.run_many(mats, x, ldx, 1, outs, lds, pool);
    for (int32_t j = 0; j < K; ++j) {
      add_bias(W.gate_bias, ids_[j], F, g_.data() + j * F, 1);
      add_bias(W.up_bias, ids_[j], F, u_.data() + j * F, 1);
    }
    activate(g_.data(), u_.data(), K);
    for (int32_t j = 0; j < K; ++j) {
      float* y = y_.data() + grouped_of_[j] * E;
      mm.run(W.down[ids_[j]], g_.data() + j * F, F, 1, y, E, pool);
      add_bias(W.down_bias, ids_[j], E, y, 1);
    }
  } else {
    // Each picked expert once: its rows gathered, a GEMM for gate and up, the
    // activation, a GEMM for down into the expert's grouped output rows.
    xg_.resize(static_cast<size_t>(max_rows) * E);
    g_.resize(static_cast<size_t>(max_rows) * F);
    u_.resize(static_cast<size_t>(max_rows) * F);
    for (int32_t e = 0; e < NE; ++e) {
      const int64_t c = count_[e];
      if (c == 0) continue;
      for (int64_t i = 0; i < c; ++i)
        std::copy_n(x + row_of_[start_[e] + i] * ldx, E, xg_.data() + i * E);
      const WeightMatrix* gu[] = {&W.gate[e], &W.up[e]};
      float* const gu_out[] = {g_.data(), u_.data()};
      const int64_t gu_ld[] = {F, F};
      mm.run_many(gu, xg_.data(), E, c, gu_out, gu_ld, pool);
      add_bias(W.gate_bias, e, F, g_.data(), c);
      add_bias(W.up_bias, e, F, u_.data(), c);
      activate(g_.data(), u_.data(), c);
      float* y = y_.data() + static_cast<int64_t>(start_[e]) * E;
      mm.run(W.down[e], g_.data(), F, c, y, E, pool);
      add_bias(W.down_bias, e, E, y, c);
    }
  }

  if (W.sh_gate) shared_expert(W, s, x, ldx, n, mm, pool);

  // Each row's k outputs, weighted and summed in its top-k order (as
  // llama.cpp adds them), then the shared expert's.
  pool.parallel_for(n, 4, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      float* o = out + r * ldo;
      const float* w = weights_.data() + r * K;
      const float* y0 = y_.data() + grouped_of_[r * K] * E;
      for (int64_t i = 0; i < E; ++i) o[i] = y0[i] * w[0];
      for (int32_t j = 1; j < K; ++j) {
        const float* y = y_.data() + grouped_of_[r * K + j] * E;
        const float wj = w[j];
        for (int64_t i = 0; i < E; ++i) o[i] += y[i] * wj;
      }
      if (W.sh_gate) {
        const float* sy = sh_y_.data() + r * E;
        const float gate = W.sh_gate_inp ? sigmoid(sh_gate_[r]) : 1.0f;
        for (int64_t i = 0; i < E; ++i) o[i] += sy[i] * gate;
      }
    }
  });
}

// The shared expert, a dense gated FFN over every row into sh_y_, and where
// the layer has one, its gate's logit per row into sh_gate_.
void MoeFfn::shared_expert(const MoeWeights& W, const MoeShape& s, const float* x, int64_t ldx, int64_t n,
                           Matmul& mm, ThreadPool& pool) {
  const int64_t E = s.n_embd, F = s.n_ff_shexp;
  sh_g_.resize(static_cast<size_t>(n * F));
  sh_u_.resize(static_cast<size_t>(n * F));
  sh_gate_.resize(static_cast<size_t>(n));
  sh_y_.resize(static_cast<size_t>(n * E));
  std::vector<const WeightMatrix*> mats = {&W.sh_gate, &W.sh_up};
  std::vector<float*> outs = {sh_g_.data(), sh_u_.data()};
  std::vector<int64_t> lds = {F, F};
  if (W.sh_gate_inp) {
    mats.push_back(&W.sh_gate_inp);
    outs.push_back(sh_gate_.data());
    lds.push_back(1);
  }
  mm.run_many(mats, x, ldx, n, outs, lds, pool);
  pool.parallel_for(n, 4, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) gated_activation_at(level_, s.act, sh_g_.data() + r * F, sh_u_.data() + r * F, F);
  });
  mm.run(W.sh_down, sh_g_.data(), F, n, sh_y_.data(), E, pool);
}

}  // namespace tandem

#include "kernels/sparse_select.h"

#include <algorithm>
#include <vector>

#if defined(__x86_64__)
// GCC 12's _mm512_reduce_add_ps starts from a deliberately uninitialized
// vector (kernels/simd_avx512.h explains the warning).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#endif

namespace tandem {

int32_t sparse_table_blocks(const SparseAttention& o, int32_t pos, int32_t block_size) {
  if (o.budget <= 0) return 0;
  const int32_t held = pos / block_size + 1;
  const int32_t n_table = o.budget / block_size;
  return held > n_table ? n_table : 0;
}

void block_bound_scores_ref(const float* q, int32_t n_q, int64_t q_stride, int32_t dim, const float* bounds,
                            size_t stride, const int32_t* blocks, int32_t n, float* scores) {
  for (int32_t i = 0; i < n; ++i) {
    const float* lo = bounds + size_t(blocks[i]) * stride;
    const float* hi = lo + dim;
    float best = 0;
    for (int32_t g = 0; g < n_q; ++g) {
      const float* qg = q + g * q_stride;
      float sum = 0;
      for (int32_t c = 0; c < dim; ++c) sum += std::max(qg[c] * lo[c], qg[c] * hi[c]);
      best = g == 0 ? sum : std::max(best, sum);
    }
    scores[i] = best;
  }
}

namespace {

// max(q * lo, q * hi) = max(q, 0) * hi + min(q, 0) * lo exactly (one term
// is zero), so the vector kernel splits each query row once.
#if defined(__x86_64__)
__attribute__((target("avx2,fma,avx512f"))) void scores_avx512(const float* q, int32_t n_q, int64_t q_stride,
                                                               int32_t dim, const float* bounds, size_t stride,
                                                               const int32_t* blocks, int32_t n, float* scores) {
  std::vector<float> pos(size_t(n_q) * dim), neg(size_t(n_q) * dim);
  for (int32_t g = 0; g < n_q; ++g)
    for (int32_t c = 0; c < dim; ++c) {
      pos[size_t(g) * dim + c] = std::max(q[g * q_stride + c], 0.0f);
      neg[size_t(g) * dim + c] = std::min(q[g * q_stride + c], 0.0f);
    }
  const int32_t full = dim / 16 * 16;
  for (int32_t i = 0; i < n; ++i) {
    const float* lo = bounds + size_t(blocks[i]) * stride;
    const float* hi = lo + dim;
    if (i + 1 < n) {
      const char* next = reinterpret_cast<const char*>(bounds + size_t(blocks[i + 1]) * stride);
      for (size_t b = 0; b < 2 * size_t(dim) * sizeof(float); b += 64) _mm_prefetch(next + b, _MM_HINT_T0);
    }
    float best = 0;
    for (int32_t g = 0; g < n_q; ++g) {
      const float* p = pos.data() + size_t(g) * dim;
      const float* m = neg.data() + size_t(g) * dim;
      __m512 acc = _mm512_setzero_ps();
      for (int32_t c = 0; c < full; c += 16) {
        acc = _mm512_fmadd_ps(_mm512_loadu_ps(p + c), _mm512_loadu_ps(hi + c), acc);
        acc = _mm512_fmadd_ps(_mm512_loadu_ps(m + c), _mm512_loadu_ps(lo + c), acc);
      }
      float sum = _mm512_reduce_add_ps(acc);
      for (int32_t c = full; c < dim; ++c) sum += p[c] * hi[c] + m[c] * lo[c];
      best = g == 0 ? sum : std::max(best, sum);
    }
    scores[i] = best;
  }
}
#endif

}  // namespace

void block_bound_scores(KernelLevel level, const float* q, int32_t n_q, int64_t q_stride, int32_t dim,
                        const float* bounds, size_t stride, const int32_t* blocks, int32_t n, float* scores) {
#if defined(__x86_64__)
  if (level >= KernelLevel::kAvx512) {
    scores_avx512(q, n_q, q_stride, dim, bounds, stride, blocks, n, scores);
    return;
  }
#endif
  (void)level;
  block_bound_scores_ref(q, n_q, q_stride, dim, bounds, stride, blocks, n, scores);
}

void select_blocks(KernelLevel level, const SparseAttention& o, int32_t pos, int32_t block_size,
                   const int32_t* seq_table, const float* q, int32_t n_q, int64_t q_stride, int32_t dim,
                   const float* bounds, size_t stride, float* score_scratch, int32_t* index_scratch,
                   int32_t* table) {
  const int32_t cur = pos / block_size;
  const int32_t n_sink = o.sinks / block_size, n_window = o.window / block_size;
  const int32_t n_table = o.budget / block_size;
  const int32_t first = n_sink, last = cur - n_window + 1;  // candidates [first, last)
  const int32_t n_cand = last - first, k = n_table - n_sink - n_window;
  int32_t* out = table;
  for (int32_t b = 0; b < n_sink; ++b) *out++ = seq_table[b];
  if (k > 0) {
    block_bound_scores(level, q, n_q, q_stride, dim, bounds, stride, seq_table + first, n_cand, score_scratch);
    for (int32_t i = 0; i < n_cand; ++i) index_scratch[i] = i;
    // The k highest scores, ties to the earlier block; then position order.
    std::nth_element(index_scratch, index_scratch + (k - 1), index_scratch + n_cand, [&](int32_t a, int32_t b) {
      return score_scratch[a] > score_scratch[b] || (score_scratch[a] == score_scratch[b] && a < b);
    });
    std::sort(index_scratch, index_scratch + k);
    for (int32_t i = 0; i < k; ++i) *out++ = seq_table[first + index_scratch[i]];
  }
  for (int32_t b = last; b <= cur; ++b) *out++ = seq_table[b];
}

}  // namespace tandem

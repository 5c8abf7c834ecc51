#include "kernels/sparse_select.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "quant/quant.h"

#if defined(__x86_64__)
// GCC 12's _mm512_mask_reduce_max_ps starts from a deliberately uninitialized
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

void block_bound_scores_ref(const float* q, int32_t n_q, int64_t q_stride, int32_t dim, const uint16_t* bounds,
                            size_t stride, const int32_t* blocks, int32_t n, float* scores) {
  for (int32_t i = 0; i < n; ++i) {
    const uint16_t* lo = bounds + size_t(blocks[i]) * stride;
    const uint16_t* hi = lo + dim;
    float best = 0;
    for (int32_t g = 0; g < n_q; ++g) {
      const float* qg = q + g * q_stride;
      float sum = 0;
      for (int32_t c = 0; c < dim; ++c) sum += std::max(qg[c] * f16_to_f32(lo[c]), qg[c] * f16_to_f32(hi[c]));
      if (std::isnan(sum)) sum = INFINITY;
      best = g == 0 ? sum : std::max(best, sum);
    }
    scores[i] = best;
  }
}

namespace {

#if defined(__x86_64__)
#define TANDEM_SPARSE_TARGET __attribute__((target("avx2,fma,avx512f,avx512bw,avx512vl")))

// 128-bit chunks [x0 + x2, x1 + x3, y0 + y2, y1 + y3].
TANDEM_SPARSE_TARGET inline __m512 fold_pair(__m512 x, __m512 y) {
  return _mm512_add_ps(_mm512_shuffle_f32x4(x, y, 0x44), _mm512_shuffle_f32x4(x, y, 0xEE));
}
// Of two folded pairs: chunk k holds head k's four partial sums.
TANDEM_SPARSE_TARGET inline __m512 fold_quad(__m512 xy, __m512 zw) {
  return _mm512_add_ps(_mm512_shuffle_f32x4(xy, zw, 0x88), _mm512_shuffle_f32x4(xy, zw, 0xDD));
}
// Eight accumulators (one per query head) to their sums, folded across each
// other's lanes rather than reduced one head at a time: head g's sum lands in
// lane 4g (g < 4) or 4(g - 4) + 1.
TANDEM_SPARSE_TARGET inline __m512 sums8(const __m512* a) {
  const __m512 x = fold_quad(fold_pair(a[0], a[1]), fold_pair(a[2], a[3]));
  const __m512 y = fold_quad(fold_pair(a[4], a[5]), fold_pair(a[6], a[7]));
  const __m512 u = _mm512_add_ps(_mm512_unpacklo_ps(x, y), _mm512_unpackhi_ps(x, y));
  return _mm512_add_ps(u, _mm512_shuffle_ps(u, u, _MM_SHUFFLE(1, 0, 3, 2)));
}

// G heads (G <= 8) at a time; max(q * lo, q * hi) = max(q, 0) * hi +
// min(q, 0) * lo exactly (one term is zero), so each query row is split once
// into `split` ([head][pos | neg][chunk of 16], zero past dim).
template <int G>
TANDEM_SPARSE_TARGET void scores_avx512_g(const float* split, int32_t n_q, int32_t dim, const uint16_t* bounds, size_t stride, const int32_t* blocks,
    int32_t n, float* scores) {
  const int32_t chunks = (dim + 15) / 16, dp = chunks * 16;
  const __mmask16 tail = dim % 16 ? __mmask16((1u << (dim % 16)) - 1) : __mmask16(0xFFFF);
  for (int32_t i = 0; i < n; ++i) {
    const uint16_t* lo = bounds + size_t(blocks[i]) * stride;
    const uint16_t* hi = lo + dim;
    if (i + 1 < n) {
      const char* next = reinterpret_cast<const char*>(bounds + size_t(blocks[i + 1]) * stride);
      for (size_t b = 0; b < 2 * size_t(dim) * sizeof(uint16_t); b += 64) _mm_prefetch(next + b, _MM_HINT_T0);
    }
    float best = -INFINITY;
    for (int32_t g0 = 0; g0 < n_q; g0 += G) {
      const int32_t gn = std::min(G, n_q - g0);
      __m512 acc[8];
      for (int g = 0; g < 8; ++g) acc[g] = _mm512_setzero_ps();
      for (int32_t j = 0; j < chunks; ++j) {
        const __mmask16 m = j + 1 == chunks ? tail : __mmask16(0xFFFF);
        const __m512 l = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, lo + j * 16));
        const __m512 h = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, hi + j * 16));
        const float* p = split + size_t(g0) * 2 * dp + j * 16;
        for (int g = 0; g < G; ++g) {
          acc[g] = _mm512_fmadd_ps(_mm512_loadu_ps(p + size_t(g) * 2 * dp), h, acc[g]);
          acc[g] = _mm512_fmadd_ps(_mm512_loadu_ps(p + size_t(g) * 2 * dp + dp), l, acc[g]);
        }
      }
      // Lanes of heads g0 .. g0 + gn - 1 only (the rest is padding).
      __mmask16 valid = 0;
      for (int32_t g = 0; g < gn; ++g) valid |= __mmask16(1u << (g < 4 ? 4 * g : 4 * (g - 4) + 1));
      __m512 sums = sums8(acc);
      sums = _mm512_mask_mov_ps(sums, _mm512_cmp_ps_mask(sums, sums, _CMP_UNORD_Q), _mm512_set1_ps(INFINITY));
      best = std::max(best, _mm512_mask_reduce_max_ps(valid, sums));
    }
    scores[i] = best;
  }
}

TANDEM_SPARSE_TARGET void scores_avx512(
    const float* q, int32_t n_q, int64_t q_stride, int32_t dim, const uint16_t* bounds, size_t stride,
    const int32_t* blocks, int32_t n, float* scores) {
  // Grows to the largest group seen, then is reused: no allocation a step.
  thread_local std::vector<float> split;
  const int32_t dp = (dim + 15) / 16 * 16;
  const int32_t G = n_q <= 1 ? 1 : n_q <= 2 ? 2 : n_q <= 4 ? 4 : 8;
  const int32_t padded = (n_q + G - 1) / G * G;
  if (split.size() < size_t(padded) * 2 * dp) split.resize(size_t(padded) * 2 * dp);
  for (int32_t g = 0; g < padded; ++g)
    for (int32_t c = 0; c < dp; ++c) {
      const float x = g < n_q && c < dim ? q[g * q_stride + c] : 0.0f;
      split[size_t(g) * 2 * dp + c] = std::max(x, 0.0f);
      split[size_t(g) * 2 * dp + dp + c] = std::min(x, 0.0f);
    }
  switch (G) {
    case 1: scores_avx512_g<1>(split.data(), n_q, dim, bounds, stride, blocks, n, scores); break;
    case 2: scores_avx512_g<2>(split.data(), n_q, dim, bounds, stride, blocks, n, scores); break;
    case 4: scores_avx512_g<4>(split.data(), n_q, dim, bounds, stride, blocks, n, scores); break;
    default: scores_avx512_g<8>(split.data(), n_q, dim, bounds, stride, blocks, n, scores); break;
  }
}
#undef TANDEM_SPARSE_TARGET
#endif

}  // namespace

void block_bound_scores(KernelLevel level, const float* q, int32_t n_q, int64_t q_stride, int32_t dim,
                        const uint16_t* bounds, size_t stride, const int32_t* blocks, int32_t n, float* scores) {
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
                   const uint16_t* bounds, size_t stride, float* score_scratch, int32_t* index_scratch,
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

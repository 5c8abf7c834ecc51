// AVX-512 row-wise kernels (product_kernels.h): decode-shaped products that stream each
// weight row once, in file order, at memory speed.
//
// Quantized types: vector lanes run along the row (dpbusd over 64 quants),
// the lane sums of each block are folded into exact block sums, and the
// per-block float chain of product_kernels.h runs in scalar FMAs, so the results equal
// the packed path's bit for bit. Two weight rows are interleaved so that two
// chains are in flight; q32 types take 8 rows at a time with the 8 chains in
// the lanes of one FMA, and q4_0 16 rows with a cheaper reduction (see there).
//
// Float types: tiles of up to 6 activation rows x 4 weight rows of 16-lane
// FMA accumulators, reduced by product_kernels.h's fixed tree; f16 / bf16 weight rows
// come four at a time from their tiles (kernels/layout_float_tiles.h) when loaded so.
//
// The kernels are split by class: product_rows_avx512_q32.cpp, _kquant.cpp
// and _float.cpp. This header holds what they share: scalar steps of the
// float chain, lane sums, the software prefetch of the weight stream (its
// distance: kernels/stream_tuning.h), and the walk over weight and activation
// rows that the q32 and K-quant kernels share. Only for those files.
#pragma once

#if defined(__x86_64__)

#include "kernels/simd_avx512.h"

#include <algorithm>

#include "kernels/kernel_builds.h"
#include "kernels/product_kernels.h"
#include "kernels/stream_tuning.h"

namespace tandem::gemm_detail::avx512_rows {

TD_FN float fma1(float a, float b, float c) {
  return _mm_cvtss_f32(_mm_fmadd_ss(_mm_set_ss(a), _mm_set_ss(b), _mm_set_ss(c)));
}

TD_FN float f16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

// Four vectors folded so that element p of each 128-bit lane holds the sum
// of P[p]'s four elements in that lane (unpacks and adds, no cross-lane moves).
TD_FN __m512i lane_sums4(const __m512i P[4]) {
  const __m512i t01 = _mm512_add_epi32(_mm512_unpacklo_epi32(P[0], P[1]), _mm512_unpackhi_epi32(P[0], P[1]));
  const __m512i t23 = _mm512_add_epi32(_mm512_unpacklo_epi32(P[2], P[3]), _mm512_unpackhi_epi32(P[2], P[3]));
  return _mm512_add_epi32(_mm512_unpacklo_epi64(t01, t23), _mm512_unpackhi_epi64(t01, t23));
}

TD_FN void prefetch_ahead(const uint8_t* p, int64_t bytes, int64_t dist) {
  if (dist == 0) return;
  for (int64_t i = 0; i < bytes; i += 64) _mm_prefetch(reinterpret_cast<const char*>(p + dist + i), _MM_HINT_T0);
}

// Walks weight rows [o0, o1) Tile::kRows (1 or 2) at a time and activation
// rows in pairs, calling Tile::run<NW, NA>(w, A, r, y + r * ldy + o, ldy).
// Two weight rows give the q32 kernels two float chains in flight; the
// K-quant kernels have few float steps and gain nothing from two (q4_K with
// two rows measured faster from L2 but not end to end).
template <typename Tile>
TD_FN void quant_rows(const WeightMatrix& W, int64_t o0, int64_t o1, const GemmActs& A, int64_t r0, int64_t r1,
                      float* y, int64_t ldy) {
  const int64_t pf = prefetch_distance(A.prefetch, W.row_stride, Tile::kRows, kPrefetchBytesFewRows);
  for (int64_t o = o0; o < o1; o += Tile::kRows) {
    const uint8_t* w[2] = {W.row(o), W.row(std::min(o + 1, o1 - 1))};
    const bool two = Tile::kRows == 2 && o + 1 < o1;
    for (int64_t r = r0; r < r1; r += 2) {
      float* yo = y + r * ldy + o;
      const bool pair = r + 1 < r1;
      if constexpr (Tile::kRows == 2) {
        if (two) {
          if (pair) Tile::template run<2, 2>(w, A, r, yo, ldy, pf);
          else Tile::template run<2, 1>(w, A, r, yo, ldy, pf);
          continue;
        }
      }
      if (pair) Tile::template run<1, 2>(w, A, r, yo, ldy, pf);
      else Tile::template run<1, 1>(w, A, r, yo, ldy, pf);
    }
  }
}

}  // namespace tandem::gemm_detail::avx512_rows

#endif

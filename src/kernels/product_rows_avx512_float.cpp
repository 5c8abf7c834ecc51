// AVX-512 row-wise kernels for f32, f16 and bf16 weights (product_rows_avx512.cpp
// says what the row-wise path is): register tiles of up to 6 activation rows
// x 4 weight rows of 16-lane FMA accumulators, reduced by product_kernels.h's tree.
#include "kernels/product_rows_avx512.h"

#if defined(__x86_64__)

#include <algorithm>
#include <cstring>

#include "kernels/layout_float_tiles.h"

namespace tandem::gemm_detail::avx512_rows {
namespace {

struct LoadF32 {
  static constexpr int kBytes = 4;
  TD_FN __m512 operator()(const uint8_t* row, int64_t k) const {
    return _mm512_loadu_ps(reinterpret_cast<const float*>(row) + k);
  }
};
struct LoadF16 {
  static constexpr int kBytes = 2;
  TD_FN __m512 operator()(const uint8_t* row, int64_t k) const {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + 2 * k)));
  }
};
struct LoadBF16 {
  static constexpr int kBytes = 2;
  TD_FN __m512 operator()(const uint8_t* row, int64_t k) const {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + 2 * k));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
};

// product_kernels.h's tree: lanes j + j+8, then j + j+4, j + j+2, 0 + 1.
TD_FN float reduce_tree(__m512 v) {
  const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(v), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
  __m128 q = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
  q = _mm_add_ps(q, _mm_movehl_ps(q, q));
  return _mm_cvtss_f32(_mm_add_ss(q, _mm_movehdup_ps(q)));
}

// kPf: prefetch the weights pf bytes ahead. Weight row i's chunk of 16
// elements at k is at w[i] + (k / 16) * step: step = 16 * Load::kBytes in
// the file's layout, 4x that in float tiles.
template <typename Load, int NA, int NW, bool kPf>
TD_FN void float_tile(const uint8_t* const w[NW], int64_t step, const float* const a[NA], int64_t K, float* y,
                      int64_t ldy, int64_t pf) {
  const Load load;
  __m512 acc[NA][NW];
  for (int m = 0; m < NA; ++m)
    for (int i = 0; i < NW; ++i) acc[m][i] = _mm512_setzero_ps();
  // One prefetch per 64-byte line: every step for f32 and for tiles (whose
  // 4 rows' chunks fill two lines a step), every other for 16-bit rows.
  const bool every_step = Load::kBytes == 4 || step != 16 * Load::kBytes;
  int64_t k = 0, off = 0;
  for (; k + 16 <= K; k += 16, off += step) {
    __m512 wv[NW];
    const bool new_line = every_step || (k & 31) == 0;
    for (int i = 0; i < NW; ++i) {
      if (kPf && new_line) _mm_prefetch(reinterpret_cast<const char*>(w[i] + off + pf), _MM_HINT_T0);
      wv[i] = load(w[i] + off, 0);
    }
    for (int m = 0; m < NA; ++m) {
      const __m512 av = _mm512_loadu_ps(a[m] + k);
      for (int i = 0; i < NW; ++i) acc[m][i] = _mm512_fmadd_ps(wv[i], av, acc[m][i]);
    }
  }
  if (k < K) {
    // The tail (file layout only: tiles are whole chunks) through zero-padded
    // copies: the extra lanes add exact zeros.
    alignas(64) uint8_t wt[NW][64] = {};
    alignas(64) float at[NA][16] = {};
    for (int i = 0; i < NW; ++i) std::memcpy(wt[i], w[i] + k * Load::kBytes, (K - k) * Load::kBytes);
    for (int m = 0; m < NA; ++m) std::memcpy(at[m], a[m] + k, (K - k) * 4);
    for (int m = 0; m < NA; ++m)
      for (int i = 0; i < NW; ++i) acc[m][i] = _mm512_fmadd_ps(load(wt[i], 0), _mm512_load_ps(at[m]), acc[m][i]);
  }
  for (int m = 0; m < NA; ++m)
    for (int i = 0; i < NW; ++i) y[m * ldy + i] = reduce_tree(acc[m][i]);
}

// NA (runtime, 1..6) activation rows x NW weight rows; pf = 0: no prefetch.
template <typename Load, int NW, bool kPf>
TD_FN void float_tile_na(int64_t na, const uint8_t* const w[NW], int64_t step, const float* const a[6], int64_t K,
                         float* y, int64_t ldy, int64_t pf) {
  switch (na) {
    case 1: return float_tile<Load, 1, NW, kPf>(w, step, a, K, y, ldy, pf);
    case 2: return float_tile<Load, 2, NW, kPf>(w, step, a, K, y, ldy, pf);
    case 3: return float_tile<Load, 3, NW, kPf>(w, step, a, K, y, ldy, pf);
    case 4: return float_tile<Load, 4, NW, kPf>(w, step, a, K, y, ldy, pf);
    case 5: return float_tile<Load, 5, NW, kPf>(w, step, a, K, y, ldy, pf);
    default: return float_tile<Load, 6, NW, kPf>(w, step, a, K, y, ldy, pf);
  }
}
template <typename Load, int NW>
TD_FN void float_tile_n(int64_t na, const uint8_t* const w[NW], int64_t step, const float* const a[6], int64_t K,
                        float* y, int64_t ldy, int64_t pf) {
  if (pf != 0) float_tile_na<Load, NW, true>(na, w, step, a, K, y, ldy, pf);
  else float_tile_na<Load, NW, false>(na, w, step, a, K, y, ldy, 0);
}

// Weight rows in blocks of 64 (kept in L2 while every activation row passes),
// activation rows 6 at a time (in L1), register tiles of 6 x 4. A single
// activation row (decode) gets 4 chains, enough to hide the FMA latency;
// 8 weight rows side by side measured slower (more streams to prefetch).
// Where the CPU streams one row better than four side by side
// (float_single_row), decode reads file rows one at a time, and f16 / bf16
// rows from their tiles four at a time (one stream: kernels/layout_float_tiles.h).
// Only the first group of activation rows prefetches weights: it is the one
// that pulls the block from memory. Later groups find it in L2, and the
// prefetches then only compete with the tile's own loads: dropping them
// took 512-row f16 products from ~160 to ~208 GFLOP/s on one Zen 5 core.
template <typename Load>
TD_ATTR void rows_float(const WeightMatrix& W, int64_t o0, int64_t o1, const GemmActs& A, int64_t r0, int64_t r1,
                        float* y, int64_t ldy) {
  const int64_t K = A.cols;
  const int64_t pf4 = prefetch_distance(A.prefetch, W.row_stride, 4);
  const bool single_row = A.float_single_row;
  constexpr int64_t kRowStep = 16 * Load::kBytes;
  constexpr int64_t kTileStep = float_tiles::group_step(Load::kBytes);
  // Rows below `tiled` come from W.tiles() (o0 is a multiple of 16).
  const int64_t tiled = W.tiles() ? W.rows / kGemmTile * kGemmTile : 0;
  for (int64_t ob = o0; ob < o1; ob += 64) {
    const int64_t oe = std::min(o1, ob + 64);
    for (int64_t r = r0; r < r1; r += 6) {
      const int64_t na = std::min<int64_t>(6, r1 - r);
      const float* a[6];
      for (int m = 0; m < 6; ++m) a[m] = A.fgroup(std::min(r + m, r1 - 1));
      const int64_t pf = r == r0 ? pf4 : 0;
      int64_t o = ob;
      for (; o < std::min(oe, tiled); o += 4) {
        const uint8_t* w[4];
        for (int i = 0; i < 4; ++i) w[i] = float_tiles::row_start(W.tiles(), K, Load::kBytes, o + i);
        float_tile_n<Load, 4>(na, w, kTileStep, a, K, y + r * ldy + o, ldy, pf);
      }
      if (na == 1 && single_row)
        for (; o < oe; ++o) {
          const uint8_t* w[1] = {W.row(o)};
          float_tile_n<Load, 1>(na, w, kRowStep, a, K, y + r * ldy + o, ldy, pf);
        }
      for (; o + 4 <= oe; o += 4) {
        const uint8_t* w[4] = {W.row(o), W.row(o + 1), W.row(o + 2), W.row(o + 3)};
        float_tile_n<Load, 4>(na, w, kRowStep, a, K, y + r * ldy + o, ldy, pf);
      }
      for (; o < oe; ++o) {
        const uint8_t* w[1] = {W.row(o)};
        float_tile_n<Load, 1>(na, w, kRowStep, a, K, y + r * ldy + o, ldy, pf);
      }
    }
  }
}


}  // namespace

}  // namespace tandem::gemm_detail::avx512_rows

namespace tandem::builds {

using namespace gemm_detail::avx512_rows;

TypeFns avx512_float_rows(GgmlType w) {
  switch (w) {
    case GgmlType::F32: return {.rows = rows_float<LoadF32>};
    case GgmlType::F16: return {.rows = rows_float<LoadF16>};
    case GgmlType::BF16: return {.rows = rows_float<LoadBF16>};
    default: return {};
  }
}

}  // namespace tandem::builds

#endif

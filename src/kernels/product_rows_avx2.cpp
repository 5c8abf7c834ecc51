// AVX2 row-wise kernels (product_kernels.h): the AVX-512 row kernels' work with 256-bit
// registers and maddubs + madd in place of dpbusd (also on AVX-VNNI CPUs:
// the integer sums are exact either way, only speed differs). q8_0 takes the
// sign trick (|w| times a with w's sign), as its offset quants would
// saturate maddubs; the other formats hold quants below 64.
#include "kernels/simd_avx2.h"

#if defined(__x86_64__)

#include <algorithm>
#include <type_traits>

#include "kernels/kernel_builds.h"
#include "kernels/product_kernels.h"
#include "kernels/stream_tuning.h"

namespace tandem::gemm_detail {
namespace {

using namespace avx2;

TD_FN void prefetch_ahead(const uint8_t* p, int64_t bytes, int64_t dist) {
  if (dist == 0) return;
  for (int64_t i = 0; i < bytes; i += 64) _mm_prefetch(reinterpret_cast<const char*>(p + dist + i), _MM_HINT_T0);
}

TD_FN float f16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

// A block's scale: the f16 d its first two bytes hold, or mxfp4's E8M0 byte
// as 2^(e - 128) (e8m0_to_f32_half: the code values are doubled).
template <typename Conv>
TD_FN float block_scale(const uint8_t* blk) {
  if constexpr (std::is_same_v<Conv, Mxfp4Conv>) return e8m0_to_f32_half(blk[offsetof(BlockMXFP4, e)]);
  else return f16(blk);
}

TD_FN __m256i loadu(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }

// Sums of 32 u8 x s8 products in 8 int32 lanes (pairs cannot saturate here).
TD_FN __m256i dot32(__m256i u, __m256i s) { return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)); }

// 8 vectors of lane sums to one vector of their totals (vector i -> lane i).
TD_FN __m256i sums8(const __m256i P[8]) {
  const __m256i u0 = _mm256_hadd_epi32(_mm256_hadd_epi32(P[0], P[1]), _mm256_hadd_epi32(P[2], P[3]));
  const __m256i u1 = _mm256_hadd_epi32(_mm256_hadd_epi32(P[4], P[5]), _mm256_hadd_epi32(P[6], P[7]));
  const __m128i lo = _mm_add_epi32(_mm256_castsi256_si128(u0), _mm256_extracti128_si256(u0, 1));
  const __m128i hi = _mm_add_epi32(_mm256_castsi256_si128(u1), _mm256_extracti128_si256(u1, 1));
  return _mm256_set_m128i(hi, lo);
}

TD_FN int32_t hsum(__m256i v) {
  __m128i x = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  x = _mm_hadd_epi32(x, x);
  return _mm_cvtsi128_si32(_mm_hadd_epi32(x, x));
}

// q4_0 / q5_0 / q8_0 / mxfp4, NW weight rows x NA activation rows.
template <typename Conv, int NW, int NA>
TD_FN void q32_tile(const uint8_t* const w[NW], const GemmActs& A, int64_t r, float* y, int64_t ldy, int64_t pf) {
  constexpr bool kSigned = Conv::kBlock == sizeof(BlockQ8_0);
  const Conv conv;
  const int64_t nb = A.nb;
  float acc[NW][NA] = {};
  int64_t b = 0;
  for (; b + 8 <= nb; b += 8) {
    __m256i u[NW][8], sgn[NW][8];
    alignas(32) float dw[NW][8];
    for (int i = 0; i < NW; ++i) {
      const uint8_t* blk = w[i] + b * Conv::kBlock;
      prefetch_ahead(blk, 8 * Conv::kBlock, pf);
      for (int k = 0; k < 8; ++k) {
        if constexpr (kSigned) {
          sgn[i][k] = loadu(blk + k * Conv::kBlock + offsetof(BlockQ8_0, qs));
          u[i][k] = _mm256_abs_epi8(sgn[i][k]);
        } else {
          u[i][k] = conv(blk + k * Conv::kBlock);
        }
        dw[i][k] = block_scale<Conv>(blk + k * Conv::kBlock);
      }
    }
    for (int m = 0; m < NA; ++m) {
      const int8_t* a = A.qgroup(r + m) + b * kQK;
      const __m256 da = _mm256_loadu_ps(A.sgroup(r + m) + b);
      for (int i = 0; i < NW; ++i) {
        __m256i P[8];
        for (int k = 0; k < 8; ++k) {
          const __m256i av = loadu(a + 32 * k);
          P[k] = kSigned ? dot32(u[i][k], _mm256_sign_epi8(av, sgn[i][k])) : dot32(u[i][k], av);
        }
        __m256i s = sums8(P);
        if constexpr (!kSigned) s = _mm256_add_epi32(s, loadu(A.egroup(r + m) + b));
        alignas(32) float fs[8], sc[8];
        _mm256_store_ps(fs, _mm256_cvtepi32_ps(s));
        _mm256_store_ps(sc, _mm256_mul_ps(_mm256_load_ps(dw[i]), da));
        __m128 x = _mm_set_ss(acc[i][m]);
        for (int k = 0; k < 8; ++k) x = _mm_fmadd_ss(_mm_load_ss(fs + k), _mm_load_ss(sc + k), x);
        acc[i][m] = _mm_cvtss_f32(x);
      }
    }
  }
  for (; b < nb; ++b) {
    for (int i = 0; i < NW; ++i) {
      const uint8_t* blk = w[i] + b * Conv::kBlock;
      const __m256i q = kSigned ? loadu(blk + offsetof(BlockQ8_0, qs)) : conv(blk);
      const float dw = block_scale<Conv>(blk);
      for (int m = 0; m < NA; ++m) {
        const __m256i av = loadu(A.qgroup(r + m) + b * kQK);
        const int32_t sum = kSigned ? hsum(dot32(_mm256_abs_epi8(q), _mm256_sign_epi8(av, q)))
                                    : hsum(dot32(q, av)) + A.egroup(r + m)[b];
        acc[i][m] = _mm_cvtss_f32(_mm_fmadd_ss(_mm_set_ss(static_cast<float>(sum)), _mm_set_ss(dw * A.sgroup(r + m)[b]),
                                               _mm_set_ss(acc[i][m])));
      }
    }
  }
  for (int i = 0; i < NW; ++i)
    for (int m = 0; m < NA; ++m) y[m * ldy + i] = acc[i][m];
}

// Lanes 0-3 of v and of w summed into (float(v total), float(w total)).
TD_FN __m128 hsum_pair(__m256i isum, __m128i msum) {
  const __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(isum), _mm256_extracti128_si256(isum, 1));
  const __m128i h = _mm_hadd_epi32(s4, msum);
  return _mm_cvtepi32_ps(_mm_hadd_epi32(h, h));
}

// q4_K / q5_K, one weight row x NA activation rows.
template <typename Block, int NA>
TD_FN void k4_tile(const uint8_t* w, const GemmActs& A, int64_t r, float* y, int64_t ldy, int64_t pf) {
  constexpr bool kQ5 = sizeof(Block) == sizeof(BlockQ5K);
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  __m128 acc[NA];
  for (int m = 0; m < NA; ++m) acc[m] = _mm_setzero_ps();
  for (int64_t b = 0; b < A.nb; ++b) {
    const uint8_t* blk = w + b * sizeof(Block);
    prefetch_ahead(blk, sizeof(Block), pf);
    // Sub-block j: elements 32j..32j+31, nibble j%2 of qs[32(j/2)..].
    __m256i q[8];
    for (int c = 0; c < 4; ++c) {
      const __m256i x = loadu(blk + offsetof(Block, qs) + 32 * c);
      q[2 * c] = _mm256_and_si256(x, m4);
      q[2 * c + 1] = _mm256_and_si256(_mm256_srli_epi16(x, 4), m4);
    }
    if constexpr (kQ5) {
      const __m256i qh = loadu(blk + offsetof(BlockQ5K, qh));
      for (int j = 0; j < 8; ++j) {
        const __m256i bit = _mm256_set1_epi8(static_cast<char>(1 << j));
        q[j] = _mm256_or_si256(q[j], _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, bit), bit), _mm256_set1_epi8(0x10)));
      }
    }
    uint32_t words[4];
    k4_unpack_words(blk + offsetof(Block, scales), words);
    uint8_t sm[16];  // scales 0..7, mins 8..15
    std::memcpy(sm, words, 16);
    const __m128i mins = _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(sm + 8)));
    const float d = f16(blk + offsetof(Block, d)), dmin = f16(blk + offsetof(Block, dmin));
    for (int m = 0; m < NA; ++m) {
      const int8_t* a = A.qgroup(r + m) + b * kQKK;
      __m256i s = _mm256_setzero_si256();
      for (int j = 0; j < 8; ++j)
        s = _mm256_add_epi32(s, _mm256_madd_epi16(_mm256_maddubs_epi16(q[j], loadu(a + 32 * j)), _mm256_set1_epi16(sm[j])));
      const __m128i bp = _mm_loadu_si128(reinterpret_cast<const __m128i*>(A.egroup(r + m) + b * 4));
      const __m128 im = hsum_pair(s, _mm_madd_epi16(mins, bp));
      const __m128 da = _mm_set_ss(A.sgroup(r + m)[b]);
      const __m128 x = _mm_fmadd_ss(im, _mm_mul_ss(_mm_set_ss(d), da), acc[m]);
      acc[m] = _mm_fnmadd_ss(_mm_movehdup_ps(im), _mm_mul_ss(_mm_set_ss(dmin), da), x);
    }
  }
  for (int m = 0; m < NA; ++m) y[m * ldy] = _mm_cvtss_f32(acc[m]);
}

// q6_K, one weight row x NA activation rows.
template <int NA>
TD_FN void k6_tile(const uint8_t* w, const GemmActs& A, int64_t r, float* y, int64_t ldy, int64_t pf) {
  const __m256i m4 = _mm256_set1_epi8(0x0F), m2 = _mm256_set1_epi8(3);
  float acc[NA] = {};
  for (int64_t b = 0; b < A.nb; ++b) {
    const uint8_t* blk = w + b * sizeof(BlockQ6K);
    prefetch_ahead(blk, sizeof(BlockQ6K), pf);
    // Slice j = 4h + q: elements 128h + 32q + (0..31), quants + 32.
    __m256i q[8], sc[8];
    const int8_t* scales = reinterpret_cast<const int8_t*>(blk + offsetof(BlockQ6K, scales));
    for (int j = 0; j < 8; ++j) {
      const int h = j / 4, qq = j % 4;
      const __m256i l = loadu(blk + offsetof(BlockQ6K, ql) + 64 * h + 32 * (qq % 2));
      const __m256i lo = _mm256_and_si256(qq >= 2 ? _mm256_srli_epi16(l, 4) : l, m4);
      const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(loadu(blk + offsetof(BlockQ6K, qh) + 32 * h), 2 * qq), m2);
      q[j] = _mm256_or_si256(lo, _mm256_slli_epi16(hi, 4));
      // maddubs lanes 0-7 cover group 2j, lanes 8-15 group 2j+1.
      sc[j] = _mm256_set_m128i(_mm_set1_epi16(scales[2 * j + 1]), _mm_set1_epi16(scales[2 * j]));
    }
    const __m256i sc_lo = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(scales)));
    const __m256i sc_hi = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(scales + 8)));
    const float d = f16(blk + offsetof(BlockQ6K, d));
    for (int m = 0; m < NA; ++m) {
      const int8_t* a = A.qgroup(r + m) + b * kQKK;
      const int32_t* extra = A.egroup(r + m) + b * 16;  // -32 * group sums: takes the +32 out
      __m256i s = _mm256_add_epi32(_mm256_mullo_epi32(sc_lo, loadu(extra)), _mm256_mullo_epi32(sc_hi, loadu(extra + 8)));
      for (int j = 0; j < 8; ++j)
        s = _mm256_add_epi32(s, _mm256_madd_epi16(_mm256_maddubs_epi16(q[j], loadu(a + 32 * j)), sc[j]));
      acc[m] = _mm_cvtss_f32(_mm_fmadd_ss(_mm_set_ss(static_cast<float>(hsum(s))), _mm_set_ss(d * A.sgroup(r + m)[b]),
                                          _mm_set_ss(acc[m])));
    }
  }
  for (int m = 0; m < NA; ++m) y[m * ldy] = acc[m];
}

template <typename Conv>
TD_ATTR void rows_q32(const WeightMatrix& W, int64_t o0, int64_t o1, const GemmActs& A, int64_t r0, int64_t r1,
                      float* y, int64_t ldy) {
  const int64_t pf = prefetch_distance(A.prefetch, W.row_stride, 2);
  for (int64_t o = o0; o < o1; o += 2) {
    const uint8_t* w[2] = {W.row(o), W.row(std::min(o + 1, o1 - 1))};
    for (int64_t r = r0; r < r1; r += 2) {
      float* yo = y + r * ldy + o;
      const bool two = o + 1 < o1, pair = r + 1 < r1;
      if (two && pair) q32_tile<Conv, 2, 2>(w, A, r, yo, ldy, pf);
      else if (two) q32_tile<Conv, 2, 1>(w, A, r, yo, ldy, pf);
      else if (pair) q32_tile<Conv, 1, 2>(w, A, r, yo, ldy, pf);
      else q32_tile<Conv, 1, 1>(w, A, r, yo, ldy, pf);
    }
  }
}

template <typename Block>
TD_ATTR void rows_k4(const WeightMatrix& W, int64_t o0, int64_t o1, const GemmActs& A, int64_t r0, int64_t r1,
                     float* y, int64_t ldy) {
  const int64_t pf = prefetch_distance(A.prefetch, W.row_stride, 1);
  for (int64_t o = o0; o < o1; ++o)
    for (int64_t r = r0; r < r1; r += 2) {
      if (r + 1 < r1) k4_tile<Block, 2>(W.row(o), A, r, y + r * ldy + o, ldy, pf);
      else k4_tile<Block, 1>(W.row(o), A, r, y + r * ldy + o, ldy, pf);
    }
}

TD_ATTR void rows_k6(const WeightMatrix& W, int64_t o0, int64_t o1, const GemmActs& A, int64_t r0, int64_t r1,
                     float* y, int64_t ldy) {
  const int64_t pf = prefetch_distance(A.prefetch, W.row_stride, 1);
  for (int64_t o = o0; o < o1; ++o)
    for (int64_t r = r0; r < r1; r += 2) {
      if (r + 1 < r1) k6_tile<2>(W.row(o), A, r, y + r * ldy + o, ldy, pf);
      else k6_tile<1>(W.row(o), A, r, y + r * ldy + o, ldy, pf);
    }
}

// ---- float class: a 16-lane accumulator is a pair of registers ----

struct LoadF32 {
  static constexpr int kBytes = 4;
  TD_FN __m256 operator()(const uint8_t* row, int64_t k) const { return _mm256_loadu_ps(reinterpret_cast<const float*>(row) + k); }
};
struct LoadF16 {
  static constexpr int kBytes = 2;
  TD_FN __m256 operator()(const uint8_t* row, int64_t k) const {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 2 * k)));
  }
};
struct LoadBF16 {
  static constexpr int kBytes = 2;
  TD_FN __m256 operator()(const uint8_t* row, int64_t k) const {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 2 * k));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
};

// product_kernels.h's tree on lanes 0-7 (lo) and 8-15 (hi).
TD_FN float reduce_tree(__m256 lo, __m256 hi) {
  const __m256 h = _mm256_add_ps(lo, hi);
  __m128 q = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
  q = _mm_add_ps(q, _mm_movehl_ps(q, q));
  return _mm_cvtss_f32(_mm_add_ss(q, _mm_movehdup_ps(q)));
}

template <typename Load, int NA, int NW>
TD_FN void float_tile(const uint8_t* const w[NW], const float* const a[NA], int64_t K, float* y, int64_t ldy, int64_t pf) {
  const Load load;
  __m256 acc[NA][NW][2];
  for (int m = 0; m < NA; ++m)
    for (int i = 0; i < NW; ++i) acc[m][i][0] = acc[m][i][1] = _mm256_setzero_ps();
  int64_t k = 0;
  for (; k + 16 <= K; k += 16) {
    __m256 wv[NW][2];
    for (int i = 0; i < NW; ++i) {
      if (pf != 0) _mm_prefetch(reinterpret_cast<const char*>(w[i] + k * Load::kBytes + pf), _MM_HINT_T0);
      wv[i][0] = load(w[i], k);
      wv[i][1] = load(w[i], k + 8);
    }
    for (int m = 0; m < NA; ++m)
      for (int h = 0; h < 2; ++h) {
        const __m256 av = _mm256_loadu_ps(a[m] + k + 8 * h);
        for (int i = 0; i < NW; ++i) acc[m][i][h] = _mm256_fmadd_ps(wv[i][h], av, acc[m][i][h]);
      }
  }
  if (k < K) {
    // The tail through zero-padded copies: the extra lanes add exact zeros.
    alignas(32) uint8_t wt[NW][64] = {};
    alignas(32) float at[NA][16] = {};
    for (int i = 0; i < NW; ++i) std::memcpy(wt[i], w[i] + k * Load::kBytes, (K - k) * Load::kBytes);
    for (int m = 0; m < NA; ++m) std::memcpy(at[m], a[m] + k, (K - k) * 4);
    for (int m = 0; m < NA; ++m)
      for (int i = 0; i < NW; ++i)
        for (int h = 0; h < 2; ++h)
          acc[m][i][h] = _mm256_fmadd_ps(load(wt[i], 8 * h), _mm256_load_ps(at[m] + 8 * h), acc[m][i][h]);
  }
  for (int m = 0; m < NA; ++m)
    for (int i = 0; i < NW; ++i) y[m * ldy + i] = reduce_tree(acc[m][i][0], acc[m][i][1]);
}

// As product_rows_avx512_float.cpp: blocks of 64 weight rows, 2 x 2 tiles (1 x 4 for
// a single activation row).
template <typename Load>
TD_ATTR void rows_float(const WeightMatrix& W, int64_t o0, int64_t o1, const GemmActs& A, int64_t r0, int64_t r1,
                        float* y, int64_t ldy) {
  const int64_t K = A.cols;
  const int64_t pf4 = prefetch_distance(A.prefetch, W.row_stride, 4),
                pf2 = prefetch_distance(A.prefetch, W.row_stride, 2);
  for (int64_t ob = o0; ob < o1; ob += 64) {
    const int64_t oe = std::min(o1, ob + 64);
    for (int64_t r = r0; r < r1; r += 2) {
      const int64_t na = std::min<int64_t>(2, r1 - r);
      const float* a[2] = {A.fgroup(r), A.fgroup(std::min(r + 1, r1 - 1))};
      int64_t o = ob;
      if (na == 1) {
        for (; o + 4 <= oe; o += 4) {
          const uint8_t* w[4] = {W.row(o), W.row(o + 1), W.row(o + 2), W.row(o + 3)};
          float_tile<Load, 1, 4>(w, a, K, y + r * ldy + o, ldy, pf4);
        }
      }
      for (; o < oe; o += 2) {
        const uint8_t* w[2] = {W.row(o), W.row(std::min(o + 1, oe - 1))};
        float* yo = y + r * ldy + o;
        if (o + 1 < oe && na == 2) {
          float_tile<Load, 2, 2>(w, a, K, yo, ldy, pf2);
          continue;
        }
        for (int64_t m = 0; m < na; ++m)
          for (int64_t i = 0; i < std::min<int64_t>(2, oe - o); ++i)
            float_tile<Load, 1, 1>(w + i, a + m, K, yo + m * ldy + i, ldy, pf2);
      }
    }
  }
}

}  // namespace

}  // namespace tandem::gemm_detail

namespace tandem::builds {

using namespace gemm_detail;

TypeFns avx2_rows(GgmlType w) {
  switch (w) {
    case GgmlType::Q4_0: return {.rows = rows_q32<Q4_0Conv>};
    case GgmlType::Q5_0: return {.rows = rows_q32<Q5_0Conv>};
    case GgmlType::Q8_0: return {.rows = rows_q32<Q8_0Conv>};
    case GgmlType::MXFP4: return {.rows = rows_q32<Mxfp4Conv>};
    case GgmlType::Q4_K: return {.rows = rows_k4<BlockQ4K>};
    case GgmlType::Q5_K: return {.rows = rows_k4<BlockQ5K>};
    case GgmlType::Q6_K: return {.rows = rows_k6};
    case GgmlType::F32: return {.rows = rows_float<LoadF32>};
    case GgmlType::F16: return {.rows = rows_float<LoadF16>};
    case GgmlType::BF16: return {.rows = rows_float<LoadBF16>};
    default: return {};
  }
}

}  // namespace tandem::builds

#endif

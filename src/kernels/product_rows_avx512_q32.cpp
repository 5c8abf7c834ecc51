// AVX-512 row-wise kernels for q4_0, q5_0, q8_0 and mxfp4 (product_rows_avx512.cpp
// says what the row-wise path is): 8 weight rows at a time with the 8 float
// chains in the lanes of one FMA, q4_0 and mxfp4 16 rows at a time, q4_0 / q5_0 tiles
// with one lane per row, and 2-row tiles for what is left.
#include "kernels/product_rows_avx512.h"

#if defined(__x86_64__)

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "quant/quant_blocks.h"
#include "kernels/simd_avx512.h"
#include "kernels/layout_q32_tiles.h"
#include "kernels/simd_transpose.h"

namespace tandem::gemm_detail::avx512_rows {
namespace {

using namespace avx512;

// Four vectors of two blocks' dpbusd lane sums (block 2p in lanes 0-7, 2p+1
// in 8-15 of P[p]) to the 8 block sums, block i in lane i.
TD_FN __m256i block_sums8(const __m512i P[4]) {
  // 128-bit lanes: 0, 1 hold blocks 0, 2, 4, 6 (element halves); 2, 3 blocks 1, 3, 5, 7.
  const __m512i v = lane_sums4(P);
  const __m256i lo = _mm512_castsi512_si256(v), hi = _mm512_extracti64x4_epi64(v, 1);
  const __m128i even = _mm_add_epi32(_mm256_castsi256_si128(lo), _mm256_extracti128_si256(lo, 1));
  const __m128i odd = _mm_add_epi32(_mm256_castsi256_si128(hi), _mm256_extracti128_si256(hi, 1));
  return _mm256_set_m128i(_mm_unpackhi_epi32(even, odd), _mm_unpacklo_epi32(even, odd));
}

template <typename Conv>
inline constexpr bool kMxfp4 = std::is_same_v<Conv, Mxfp4Conv>;

// A block's scale: the f16 d its first two bytes hold, or mxfp4's E8M0 byte
// as 2^(e - 128) (e8m0_to_f32_half: the code values are doubled).
template <typename Conv>
TD_FN float block_scale(const uint8_t* blk) {
  if constexpr (kMxfp4<Conv>) return e8m0_to_f32_half(blk[offsetof(BlockMXFP4, e)]);
  else return f16(blk);
}

// The scales of 8 blocks from the first 4 bytes of each (one per lane), as
// block_scale gives them. E8M0: the exponent field e - 1, or for e < 2 the
// subnormals 2^(e - 128), exact either way.
template <typename Conv>
TD_FN __m256 scales8_of(__m256i words) {
  if constexpr (kMxfp4<Conv>) {
    const __m256i e = _mm256_and_si256(words, _mm256_set1_epi32(0xFF));
    const __m256i normal = _mm256_slli_epi32(_mm256_sub_epi32(e, _mm256_set1_epi32(1)), 23);
    const __m256i tiny = _mm256_sllv_epi32(_mm256_set1_epi32(0x00200000), e);
    return _mm256_castsi256_ps(_mm256_mask_blend_epi32(_mm256_cmplt_epu32_mask(e, _mm256_set1_epi32(2)), normal, tiny));
  } else {
    return _mm256_cvtph_ps(_mm256_cvtepi32_epi16(words));
  }
}

// The scales of 8 blocks Conv::kBlock bytes apart, as floats.
template <typename Conv>
TD_FN __m256 block_scales8(const uint8_t* blk) {
  const __m256i idx = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(Conv::kBlock));
  return scales8_of<Conv>(_mm256_i32gather_epi32(reinterpret_cast<const int*>(blk), idx, 1));
}

// NW weight rows x NA activation rows of a q4_0 / q5_0 / q8_0 matrix.
template <typename Conv, int NW, int NA>
TD_FN void q32_tile(const uint8_t* const w[NW], const GemmActs& A, int64_t r, float* y, int64_t ldy, int64_t pf) {
  const Conv conv;
  const int64_t nb = A.nb;
  __m128 acc[NW][NA];
  for (int i = 0; i < NW; ++i)
    for (int m = 0; m < NA; ++m) acc[i][m] = _mm_setzero_ps();
  int64_t b = 0;
  for (; b + 8 <= nb; b += 8) {
    __m512i u[NW][4];
    __m256 dw[NW];
    for (int i = 0; i < NW; ++i) {
      const uint8_t* blk = w[i] + b * Conv::kBlock;
      prefetch_ahead(blk, 8 * Conv::kBlock, pf);
      for (int p = 0; p < 4; ++p) u[i][p] = conv.pair(blk + 2 * p * Conv::kBlock);
      dw[i] = block_scales8<Conv>(blk);
    }
    for (int m = 0; m < NA; ++m) {
      const int8_t* a = A.qgroup(r + m) + b * kQK;
      const __m256 da = _mm256_loadu_ps(A.sgroup(r + m) + b);
      const __m256i extra = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(A.egroup(r + m) + b));
      __m512i av[4];
      for (int p = 0; p < 4; ++p) av[p] = _mm512_loadu_si512(a + 64 * p);
      for (int i = 0; i < NW; ++i) {
        __m512i P[4];
        for (int p = 0; p < 4; ++p) P[p] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u[i][p], av[p]);
        alignas(32) float s[8], sc[8];
        _mm256_store_ps(s, _mm256_cvtepi32_ps(_mm256_add_epi32(block_sums8(P), extra)));
        _mm256_store_ps(sc, _mm256_mul_ps(dw[i], da));
        __m128 x = acc[i][m];
        for (int k = 0; k < 8; ++k) x = _mm_fmadd_ss(_mm_load_ss(s + k), _mm_load_ss(sc + k), x);
        acc[i][m] = x;
      }
    }
  }
  for (; b < nb; ++b) {
    for (int i = 0; i < NW; ++i) {
      const uint8_t* blk = w[i] + b * Conv::kBlock;
      const __m256i u = conv(blk);
      const float dw = block_scale<Conv>(blk);
      for (int m = 0; m < NA; ++m) {
        const __m256i p = _mm256_dpbusd_epi32(_mm256_setzero_si256(), u,
                                              _mm256_loadu_si256(reinterpret_cast<const __m256i*>(A.qgroup(r + m) + b * kQK)));
        const int32_t sum = _mm512_reduce_add_epi32(_mm512_zextsi256_si512(p)) + A.egroup(r + m)[b];
        acc[i][m] = _mm_set_ss(fma1(static_cast<float>(sum), dw * A.sgroup(r + m)[b], _mm_cvtss_f32(acc[i][m])));
      }
    }
  }
  for (int i = 0; i < NW; ++i)
    for (int m = 0; m < NA; ++m) y[m * ldy + i] = _mm_cvtss_f32(acc[i][m]);
}

// 8 weight rows (rows0 + n * stride) x NA activation rows of a q4_0 / q5_0 /
// q8_0 matrix. The block sums come out one row per vector; transposed, each
// block's sums for the 8 rows share a vector, and the 8 chains advance in
// the lanes of one FMA per block.
// One chunk of n <= 8 blocks (kFull: n == 8) of q32_tile8. In a short last
// chunk, missing blocks are zero vectors (their sums are never used) and the
// activation loads are masked.
template <typename Conv, int NA, bool kFull>
TD_FN void q32_chunk8(const uint8_t* rows0, size_t stride, __m256i row_off, const GemmActs& A, int64_t r, int64_t b,
                      int64_t n, int64_t pf, __m256 acc[NA]) {
  const Conv conv;
  __m256i S[NA][8];
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i) {
    const uint8_t* blk = rows0 + i * stride + b * Conv::kBlock;
    prefetch_ahead(blk, 8 * Conv::kBlock, pf);
    __m512i u[4];
    for (int p = 0; p < 4; ++p) {
      if (kFull || 2 * p + 1 < n) u[p] = conv.pair(blk + 2 * p * Conv::kBlock);
      else if (2 * p < n) u[p] = _mm512_zextsi256_si512(conv(blk + 2 * p * Conv::kBlock));
      else u[p] = _mm512_setzero_si512();
    }
    for (int m = 0; m < NA; ++m) {
      const int8_t* a = A.qgroup(r + m) + b * kQK;
      __m512i P[4];
      for (int p = 0; p < 4; ++p) {
        __m512i av;
        if (kFull) {
          av = _mm512_loadu_si512(a + 64 * p);
        } else {
          const int64_t bytes = std::clamp<int64_t>(n * kQK - 64 * p, 0, 64);
          av = _mm512_maskz_loadu_epi8(bytes == 0 ? 0 : ~0ull >> (64 - bytes), a + 64 * p);
        }
        P[p] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u[p], av);
      }
      S[m][i] = block_sums8(P);
    }
  }
  for (int m = 0; m < NA; ++m) simd::transpose_8x8_epi32(S[m]);  // S[m][k]: block b + k, lane = row
  for (int k = 0; k < (kFull ? 8 : n); ++k) {
    const __m256i h = _mm256_i32gather_epi32(reinterpret_cast<const int*>(rows0 + (b + k) * Conv::kBlock), row_off, 1);
    const __m256 dw = scales8_of<Conv>(h);
    for (int m = 0; m < NA; ++m) {
      const __m256i sum = _mm256_add_epi32(S[m][k], _mm256_set1_epi32(A.egroup(r + m)[b + k]));
      acc[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), _mm256_mul_ps(dw, _mm256_set1_ps(A.sgroup(r + m)[b + k])), acc[m]);
    }
  }
}

template <typename Conv, int NA>
TD_FN void q32_tile8(const uint8_t* rows0, size_t stride, const GemmActs& A, int64_t r, float* y, int64_t ldy,
                     int64_t pf) {
  const int64_t nb = A.nb;
  const __m256i row_off = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
                                             _mm256_set1_epi32(static_cast<int32_t>(stride)));
  __m256 acc[NA];
  for (int m = 0; m < NA; ++m) acc[m] = _mm256_setzero_ps();
  int64_t b = 0;
  for (; b + 8 <= nb; b += 8) q32_chunk8<Conv, NA, true>(rows0, stride, row_off, A, r, b, 8, pf, acc);
  if (b < nb) q32_chunk8<Conv, NA, false>(rows0, stride, row_off, A, r, b, nb - b, pf, acc);
  for (int m = 0; m < NA; ++m) _mm256_storeu_ps(y + m * ldy, acc[m]);
}

template <typename Conv>
struct Q32Tile {
  static constexpr int kRows = 2;
  template <int NW, int NA>
  TD_FN static void run(const uint8_t* const* w, const GemmActs& A, int64_t r, float* y, int64_t ldy, int64_t pf) {
    q32_tile<Conv, NW, NA>(w, A, r, y, ldy, pf);
  }
};

// ---- q4_0 and mxfp4, 16 weight rows side by side ----
//
// q4_0 packs a block in 18 bytes (mxfp4 in 17: the same nibble field after a
// one-byte scale), so its decode has twice the blocks per
// byte of q8_0, and the generic kernels above were compute-bound on it,
// below memory speed: per 2 blocks they spent ~8 shuffles folding 8-lane dpbusd results into block sums and
// transposing them, and the 8-row gathers of the block scales cost more
// still. Here:
// - a register holds four blocks' 16-byte quant fields, one per 128-bit
//   lane; the low and high nibbles go through two dpbusd into the same lanes
//   (the activations are rearranged to match once per step, for all rows),
//   which leaves 4 lanes per block instead of 8;
// - 4 rows x 4 blocks then reduce to one vector (lane 4k + j: block k, row
//   j), 3 merges of unpacks and adds;
// - the scales come from a 64-byte load of each row's step, moved into the
//   same layout by one dword permute per pair of rows (no gathers);
// - float(S + extra) and dw * da are formed in that layout and a 4x4
//   transpose of 128-bit lanes over the four row groups leaves, per block,
//   one vector with the 16 rows in its lanes: one 16-lane FMA per block.
// The integer block sums are the same exact numbers and the float steps per
// block (S + extra, float(), dw * da, fma in block order) those of the other
// kernels, so the results are bit-identical.

// Four vectors as a 4x4 matrix of 128-bit lanes, transposed in place.
TD_FN void transpose_lanes4(__m512 v[4]) {
  const __m512 t0 = _mm512_shuffle_f32x4(v[0], v[1], _MM_SHUFFLE(1, 0, 1, 0));
  const __m512 t1 = _mm512_shuffle_f32x4(v[0], v[1], _MM_SHUFFLE(3, 2, 3, 2));
  const __m512 t2 = _mm512_shuffle_f32x4(v[2], v[3], _MM_SHUFFLE(1, 0, 1, 0));
  const __m512 t3 = _mm512_shuffle_f32x4(v[2], v[3], _MM_SHUFFLE(3, 2, 3, 2));
  v[0] = _mm512_shuffle_f32x4(t0, t2, _MM_SHUFFLE(2, 0, 2, 0));
  v[1] = _mm512_shuffle_f32x4(t0, t2, _MM_SHUFFLE(3, 1, 3, 1));
  v[2] = _mm512_shuffle_f32x4(t1, t3, _MM_SHUFFLE(2, 0, 2, 0));
  v[3] = _mm512_shuffle_f32x4(t1, t3, _MM_SHUFFLE(3, 1, 3, 1));
}

// The two formats the 16-row step reads, blocks of a scale and 16 nibble
// bytes: q4_0 (f16 d; the nibbles are the quants) and mxfp4 (an E8M0 byte;
// the nibbles are codes, looked up to their values + 12 in place).
// scales(head) moves block k's scale of rows j = 0..3 (from the first 64
// bytes of each row's step) to lane 4k + j, as a float.
struct Q40Step {
  static constexpr size_t kB = sizeof(BlockQ4_0), kQs = offsetof(BlockQ4_0, qs);
  TD_FN static __m512i values(__m512i nibbles) { return nibbles; }
  TD_FN static __m512 scales(const __m512i head[4]) {
    // Block k's scale is in dword dpos[k] = 0, 4, 9, 13, in its low word for
    // even k and its high word for odd k: one permute per pair of rows,
    // even rows from the first table.
    const __m512i idw = _mm512_setr_epi32(0, 16, 0, 16, 4, 20, 4, 20, 9, 25, 9, 25, 13, 29, 13, 29);
    const __m512i hshift = _mm512_setr_epi32(0, 0, 0, 0, 16, 16, 16, 16, 0, 0, 0, 0, 16, 16, 16, 16);
    const __m512i d = _mm512_mask_blend_epi32(0xCCCC, _mm512_permutex2var_epi32(head[0], idw, head[1]),
                                              _mm512_permutex2var_epi32(head[2], idw, head[3]));
    return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srlv_epi32(d, hshift)));
  }
};
struct Mxfp4Step {
  static constexpr size_t kB = sizeof(BlockMXFP4), kQs = offsetof(BlockMXFP4, qs);
  TD_FN static __m512i values(__m512i nibbles) {
    const __m512i table = _mm512_broadcast_i32x4(_mm_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0));
    return _mm512_shuffle_epi8(table, nibbles);
  }
  TD_FN static __m512 scales(const __m512i head[4]) {
    // Block k's E8M0 byte 17k is byte k of dword 4k.
    const __m512i idw = _mm512_setr_epi32(0, 16, 0, 16, 4, 20, 4, 20, 8, 24, 8, 24, 12, 28, 12, 28);
    const __m512i bshift = _mm512_setr_epi32(0, 0, 0, 0, 8, 8, 8, 8, 16, 16, 16, 16, 24, 24, 24, 24);
    const __m512i d = _mm512_mask_blend_epi32(0xCCCC, _mm512_permutex2var_epi32(head[0], idw, head[1]),
                                              _mm512_permutex2var_epi32(head[2], idw, head[3]));
    const __m512i e = _mm512_and_si512(_mm512_srlv_epi32(d, bshift), _mm512_set1_epi32(0xFF));
    // As e8m0_to_f32_half: the exponent field e - 1, or the subnormals 2^(e - 128) for e < 2.
    const __m512i normal = _mm512_slli_epi32(_mm512_sub_epi32(e, _mm512_set1_epi32(1)), 23);
    const __m512i tiny = _mm512_sllv_epi32(_mm512_set1_epi32(0x00200000), e);
    return _mm512_castsi512_ps(_mm512_mask_blend_epi32(_mm512_cmplt_epu32_mask(e, _mm512_set1_epi32(2)), normal, tiny));
  }
};

// One step of 4 blocks (or of the first n < 4 blocks; the rest of the
// 4-block row pieces are zeros) for 16 rows w + i * stride. aq[m]: the 128
// activation quants of the step for activation row m (zeros past block n).
template <typename Fmt, int NA, bool kPf>
TD_FN void q40_step16(const uint8_t* w, size_t stride, const int8_t* const aq[NA], const float* const da[NA],
                      const int32_t* const ex[NA], int n, int64_t pf, __m512 acc[NA]) {
  const __m512i m4 = _mm512_set1_epi8(0x0F);
  // 128-bit lane k of the low (high) operand: elements 0..15 (16..31) of block
  // k, i.e. qwords 4k, 4k+1 (4k+2, 4k+3) of the step's 128 bytes.
  const __m512i ilo = _mm512_setr_epi64(0, 1, 4, 5, 8, 9, 12, 13), ihi = _mm512_setr_epi64(2, 3, 6, 7, 10, 11, 14, 15);
  // da and extra of block k, in lanes 4k..4k+3.
  const __m512i spread = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
  __m512i alo[NA], ahi[NA];
  for (int m = 0; m < NA; ++m) {
    const __m512i a0 = _mm512_loadu_si512(aq[m]), a1 = _mm512_loadu_si512(aq[m] + 64);
    alo[m] = _mm512_permutex2var_epi64(a0, ilo, a1);
    ahi[m] = _mm512_permutex2var_epi64(a0, ihi, a1);
  }
  __m512i V[NA][4];
  __m512 DW[4];
  for (int g = 0; g < 4; ++g) {
    __m512i P[NA][4];
    __m512i head[4];
    for (int j = 0; j < 4; ++j) {
      const uint8_t* row = w + (4 * g + j) * stride;
      if (kPf && pf != 0) {
        // The step's 4 blocks (68 or 72 bytes) touch at most two lines.
        _mm_prefetch(reinterpret_cast<const char*>(row + pf), _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(row + pf + 4 * Fmt::kB - 1), _MM_HINT_T0);
      }
      head[j] = _mm512_loadu_si512(row);
      const uint8_t* q = row + Fmt::kQs;
      // Broadcasts from memory place each field in its lane (loads, no shuffle unit).
      __m512i z = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q)));
      z = _mm512_mask_broadcast_i32x4(z, 0x00F0, _mm_loadu_si128(reinterpret_cast<const __m128i*>(q + Fmt::kB)));
      z = _mm512_mask_broadcast_i32x4(z, 0x0F00, _mm_loadu_si128(reinterpret_cast<const __m128i*>(q + 2 * Fmt::kB)));
      z = _mm512_mask_broadcast_i32x4(z, 0xF000, _mm_loadu_si128(reinterpret_cast<const __m128i*>(q + 3 * Fmt::kB)));
      const __m512i lo = Fmt::values(_mm512_and_si512(z, m4));
      const __m512i hi = Fmt::values(_mm512_and_si512(_mm512_srli_epi16(z, 4), m4));
      for (int m = 0; m < NA; ++m)
        P[m][j] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, alo[m]), hi, ahi[m]);
    }
    DW[g] = Fmt::scales(head);
    for (int m = 0; m < NA; ++m) {
      // Per 128-bit lane k (block k): rows 0..3's four partials -> [S0 S1 S2 S3].
      const __m512i x01 = _mm512_add_epi32(_mm512_unpacklo_epi32(P[m][0], P[m][1]), _mm512_unpackhi_epi32(P[m][0], P[m][1]));
      const __m512i x23 = _mm512_add_epi32(_mm512_unpacklo_epi32(P[m][2], P[m][3]), _mm512_unpackhi_epi32(P[m][2], P[m][3]));
      V[m][g] = _mm512_add_epi32(_mm512_unpacklo_epi64(x01, x23), _mm512_unpackhi_epi64(x01, x23));
    }
  }
  for (int m = 0; m < NA; ++m) {
    const __m512i e4 = _mm512_castsi128_si512(_mm_loadu_si128(reinterpret_cast<const __m128i*>(ex[m])));
    const __m512i E = _mm512_permutexvar_epi32(spread, e4);
    const __m512 DA = _mm512_permutexvar_ps(spread, _mm512_castps128_ps512(_mm_loadu_ps(da[m])));
    // Per lane, in V's layout: float(S + extra) and dw * da; then the 128-bit
    // lane transpose gives block k's 16 rows in lanes 4g + j of one vector.
    __m512 s[4], c[4];
    for (int g = 0; g < 4; ++g) {
      s[g] = _mm512_cvtepi32_ps(_mm512_add_epi32(V[m][g], E));
      c[g] = _mm512_mul_ps(DW[g], DA);
    }
    transpose_lanes4(s);
    transpose_lanes4(c);
    for (int k = 0; k < 4; ++k)
      if (k < n) acc[m] = _mm512_fmadd_ps(s[k], c[k], acc[m]);
  }
}

// 16 weight rows x NA activation rows r.. of a q4_0 matrix in the file's
// rows src + i * stride.
template <typename Fmt, int NA>
TD_FN void q40_tile16(const uint8_t* src, size_t stride, const GemmActs& A, int64_t r, float* y, int64_t ldy,
                      int64_t pf) {
  constexpr size_t kB = Fmt::kB;
  const int64_t nb = A.nb;
  __m512 acc[NA];
  for (int m = 0; m < NA; ++m) acc[m] = _mm512_setzero_ps();
  const int8_t* aq[NA];
  const float* da[NA];
  const int32_t* ex[NA];
  int64_t b = 0;
  for (; b + 4 <= nb; b += 4) {
    for (int m = 0; m < NA; ++m) {
      aq[m] = A.qgroup(r + m) + b * kQK;
      da[m] = A.sgroup(r + m) + b;
      ex[m] = A.egroup(r + m) + b;
    }
    q40_step16<Fmt, NA, true>(src + b * kB, stride, aq, da, ex, 4, pf, acc);
  }
  if (b < nb) {
    // The last n < 4 blocks through zero-padded copies (no reads past the rows).
    const int n = static_cast<int>(nb - b);
    alignas(64) uint8_t wt[16][4 * kB] = {};
    alignas(64) int8_t at[NA][4 * kQK] = {};
    // Scales and extras too: the step loads four of each.
    alignas(16) float dt[NA][4] = {};
    alignas(16) int32_t et[NA][4] = {};
    for (int i = 0; i < 16; ++i) std::memcpy(wt[i], src + i * stride + b * kB, n * kB);
    for (int m = 0; m < NA; ++m) {
      std::memcpy(at[m], A.qgroup(r + m) + b * kQK, n * kQK);
      std::memcpy(dt[m], A.sgroup(r + m) + b, n * sizeof(float));
      std::memcpy(et[m], A.egroup(r + m) + b, n * sizeof(int32_t));
      aq[m] = at[m];
      da[m] = dt[m];
      ex[m] = et[m];
    }
    q40_step16<Fmt, NA, false>(wt[0], 4 * kB, aq, da, ex, n, 0, acc);
  }
  for (int m = 0; m < NA; ++m) _mm512_storeu_ps(y + m * ldy, acc[m]);
}

// 16 weight rows x NA activation rows r.. of a q4_0 / q5_0 (kQ5) matrix from
// one tile of the tiles layout (kernels/layout_q32_tiles.h), lane n = row n, as
// k4_tile16 (product_rows_avx512_kquant.cpp) does for q4_K: per block, 8 dpbusd
// for the 16 rows, then S + extra and one 16-lane FMA. q4_0's high nibbles are masked in place (their
// sum divided by 16 exactly); q5_0's fifth bits come as byte masks. The same
// integers and float steps as the kernels above.
template <int NA, bool kQ5>
TD_FN void q32_lane16(const uint8_t* tile, const GemmActs& A, int64_t r, float* y, int64_t ldy, int64_t pf) {
  using namespace q32_tiles;
  const int64_t nb = A.nb;
  const __m512i lo4 = _mm512_set1_epi8(0x0F), hi4 = _mm512_set1_epi8(static_cast<char>(0xF0));
  const __m512i bit4 = _mm512_set1_epi8(0x10);
  __m512 acc[NA];
  for (int m = 0; m < NA; ++m) acc[m] = _mm512_setzero_ps();
  for (int64_t s = 0; s * kStepBlocks < nb; ++s) {
    const int64_t n = step_blocks(nb, s);
    const uint8_t* step = tile + s * step_bytes(kQ5);
    prefetch_ahead(step, step_bytes(kQ5), pf);
    for (int64_t k = 0; k < n; ++k) {
      const int64_t b = s * kStepBlocks + k;
      const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(step + kBlockD * k)));
      const uint8_t* q = step + kBlockD * n + kBlockQ * k;
      const uint8_t* h = step + (kBlockD + kBlockQ) * n + kBlockH * k;
      __m512i slo[NA], shi[NA];
      for (int m = 0; m < NA; ++m) slo[m] = shi[m] = _mm512_setzero_si512();
#pragma GCC unroll 4
      for (int c = 0; c < 4; ++c) {
        const __m512i z = _mm512_loadu_si512(q + 64 * c);
        __m512i lo = _mm512_and_si512(z, lo4), hi;
        if constexpr (kQ5) {
          hi = _mm512_and_si512(_mm512_srli_epi16(z, 4), lo4);
          lo = _mm512_mask_add_epi8(lo, mask64_at(h + 8 * c), lo, bit4);
          hi = _mm512_mask_add_epi8(hi, mask64_at(h + 8 * (c + 4)), hi, bit4);
        } else {
          hi = _mm512_and_si512(z, hi4);
        }
        for (int m = 0; m < NA; ++m) {
          const int8_t* a = A.qgroup(r + m) + b * kQK;
          int32_t al, ah;
          std::memcpy(&al, a + 4 * c, 4);
          std::memcpy(&ah, a + 16 + 4 * c, 4);
          slo[m] = _mm512_dpbusd_epi32(slo[m], lo, _mm512_set1_epi32(al));
          shi[m] = _mm512_dpbusd_epi32(shi[m], hi, _mm512_set1_epi32(ah));
        }
      }
      for (int m = 0; m < NA; ++m) {
        const __m512i high = kQ5 ? shi[m] : _mm512_srai_epi32(shi[m], 4);
        const __m512i sum = _mm512_add_epi32(_mm512_add_epi32(slo[m], high), _mm512_set1_epi32(A.egroup(r + m)[b]));
        acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_mul_ps(d, _mm512_set1_ps(A.sgroup(r + m)[b])), acc[m]);
      }
    }
  }
  for (int m = 0; m < NA; ++m) _mm512_storeu_ps(y + m * ldy, acc[m]);
}

// q32 matrices: q4_0 / q5_0 tiles, then q4_0 / mxfp4 16 weight rows at a time
// while they last (above); then 8 rows at a time (one FMA per block for all 8
// chains), then the 2-row tiles.
template <typename Conv>
TD_ATTR void rows_q32(const WeightMatrix& W, int64_t o0, int64_t o1, const GemmActs& A, int64_t r0, int64_t r1,
                      float* y, int64_t ldy) {
  int64_t o = o0;
  constexpr bool kQ5 = std::is_same_v<Conv, Q5_0Conv>;
  if constexpr (kQ5 || std::is_same_v<Conv, Q4_0Conv>) {
    if (W.tiles()) {
      // Whole tiles come from W.tiles() only (their file pages may be gone);
      // o0 is a tile's first row (GemmKernel::rows). One stream, 4 KB ahead
      // where the CPU wants software prefetch; activation rows four at a time.
      const size_t tb = q32_tiles::tile_bytes(A.nb, kQ5);
      const int64_t pft = A.prefetch ? kPrefetchBytes : 0;
      for (; o + 16 <= o1; o += 16) {
        const uint8_t* tile = W.tiles() + (o / 16) * tb;
        float* yo = y + o;
        int64_t r = r0;
        for (; r + 4 <= r1; r += 4) q32_lane16<4, kQ5>(tile, A, r, yo + r * ldy, ldy, pft);
        if (r1 - r == 3) q32_lane16<3, kQ5>(tile, A, r, yo + r * ldy, ldy, pft);
        if (r1 - r == 2) q32_lane16<2, kQ5>(tile, A, r, yo + r * ldy, ldy, pft);
        if (r1 - r == 1) q32_lane16<1, kQ5>(tile, A, r, yo + r * ldy, ldy, pft);
      }
    }
  }
  if constexpr (std::is_same_v<Conv, Q4_0Conv> || kMxfp4<Conv>) {
    using Fmt = std::conditional_t<kMxfp4<Conv>, Mxfp4Step, Q40Step>;
    const int64_t pf16 = prefetch_distance(A.prefetch, W.row_stride, 16);
    for (; o + 16 <= o1; o += 16)
      for (int64_t r = r0; r < r1; r += 2) {
        if (r + 1 < r1) q40_tile16<Fmt, 2>(W.row(o), W.row_stride, A, r, y + r * ldy + o, ldy, pf16);
        else q40_tile16<Fmt, 1>(W.row(o), W.row_stride, A, r, y + r * ldy + o, ldy, pf16);
      }
  }
  const int64_t pf = prefetch_distance(A.prefetch, W.row_stride, 8);
  // Gather offsets are int32: row strides past 256 MB take the 2-row tiles.
  if (W.row_stride < (size_t{1} << 28))
    for (; o + 8 <= o1; o += 8)
      for (int64_t r = r0; r < r1; r += 2) {
        if (r + 1 < r1) q32_tile8<Conv, 2>(W.row(o), W.row_stride, A, r, y + r * ldy + o, ldy, pf);
        else q32_tile8<Conv, 1>(W.row(o), W.row_stride, A, r, y + r * ldy + o, ldy, pf);
      }
  if (o < o1) quant_rows<Q32Tile<Conv>>(W, o, o1, A, r0, r1, y, ldy);
}

}  // namespace

}  // namespace tandem::gemm_detail::avx512_rows

namespace tandem::builds {

using namespace gemm_detail::avx512_rows;

TypeFns avx512_q32_rows(GgmlType w) {
  switch (w) {
    case GgmlType::Q4_0: return {.rows = rows_q32<Q4_0Conv>};
    case GgmlType::Q5_0: return {.rows = rows_q32<Q5_0Conv>};
    case GgmlType::Q8_0: return {.rows = rows_q32<Q8_0Conv>};
    case GgmlType::MXFP4: return {.rows = rows_q32<Mxfp4Conv>};
    default: return {};
  }
}

}  // namespace tandem::builds

#endif

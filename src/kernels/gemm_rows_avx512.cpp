// AVX-512 row-wise kernels (gemm.h): decode-shaped products that stream each
// weight row once, in file order, at memory speed.
//
// Quantized types: vector lanes run along the row (dpbusd over 64 quants),
// the lane sums of each block are folded into exact block sums, and the
// per-block float chain of gemm.h runs in scalar FMAs, so the results equal
// the packed path's bit for bit. Two weight rows are interleaved so that two
// chains are in flight; q32 types take 8 rows at a time with the 8 chains in
// the lanes of one FMA, and q4_0 16 rows with a cheaper reduction (see there).
//
// Float types: tiles of up to 6 activation rows x 4 weight rows of 16-lane
// FMA accumulators, reduced by gemm.h's fixed tree; f16 / bf16 weight rows
// come four at a time from their tiles (kernels/float_tiles.h) when loaded so.
#include "kernels/gemm.h"

#if defined(__x86_64__)

#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "core/blocks.h"
#include "kernels/gemm_avx512_conv.h"
#include "kernels/float_tiles.h"
#include "kernels/gemm_avx512_pack.h"
#include "kernels/k4_tiles.h"
#include "kernels/q32_tiles.h"
#include "kernels/stream_tuning.h"
#include "kernels/transpose_avx2.h"

#define TD_ATTR __attribute__((target(TD_GEMM_AVX512)))
#define TD_FN TD_ATTR inline

namespace tandem::gemm_detail {
namespace {

using namespace avx512;

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

// Software prefetch at least this far ahead: the hardware prefetcher alone
// leaves these streaming kernels well short of bandwidth. A kernel reading
// rows o..o+n-1 side by side prefetches the same offsets a whole number of
// n-row groups ahead (prefetch_distance), i.e. bytes a later group will read
// at the same point; a plain "4 KB ahead" would land on the next row of the
// current group, already being read.
constexpr int64_t kPrefetchBytes = 4096;
// Kernels reading only 1 or 2 rows side by side (the K-quants) need more: 4 KB
// ahead is about one memory latency of their single stream. 16 KB took q6_K
// decode from ~36 to ~39 GB/s on one Zen 5 core (~58 -> ~63 on two), and
// q4_K's stream from memory from below to above its compute speed.
constexpr int64_t kPrefetchBytesFewRows = 16384;

// 0 (no prefetch) where the CPU streams better without (kernels/stream_tuning.h).
inline int64_t prefetch_distance(size_t row_stride, int rows_side_by_side, int64_t at_least = kPrefetchBytes) {
  if (!stream_tuning().software_prefetch) return 0;
  const int64_t group = static_cast<int64_t>(row_stride) * rows_side_by_side;
  return (at_least + group - 1) / group * group;
}

TD_FN void prefetch_ahead(const uint8_t* p, int64_t bytes, int64_t dist) {
  if (dist == 0) return;
  for (int64_t i = 0; i < bytes; i += 64) _mm_prefetch(reinterpret_cast<const char*>(p + dist + i), _MM_HINT_T0);
}

// The f16 scales of 8 blocks kBlock bytes apart, as floats.
template <size_t kBlock>
TD_FN __m256 block_scales8(const uint8_t* blk) {
  const __m256i idx = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(kBlock));
  const __m256i words = _mm256_i32gather_epi32(reinterpret_cast<const int*>(blk), idx, 1);
  return _mm256_cvtph_ps(_mm256_cvtepi32_epi16(words));
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
      dw[i] = block_scales8<Conv::kBlock>(blk);
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
      const float dw = f16(blk);
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
    const __m256 dw = _mm256_cvtph_ps(_mm256_cvtepi32_epi16(h));
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

// 16 int32 lanes of I and 4 of M to (float(I), float(M)) in lanes 0 and 1.
TD_FN __m128 hsum_pair(__m512i isum, __m128i msum) {
  const __m256i s8 = _mm256_add_epi32(_mm512_castsi512_si256(isum), _mm512_extracti64x4_epi64(isum, 1));
  const __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s8), _mm256_extracti128_si256(s8, 1));
  const __m128i h = _mm_hadd_epi32(s4, msum);
  return _mm_cvtepi32_ps(_mm_hadd_epi32(h, h));
}

// k4_unpack_words in a register: the 8 scales (bytes 0..7) and 8 mins (8..15)
// of a q4_K / q5_K super-block from its 12 packed bytes (p; the 4 bytes after
// them are read and ignored). Computed in a register rather than through
// memory, where four word stores read back as one vector cannot be
// store-forwarded.
TD_FN __m128i k4_scales_mins(const uint8_t* p) {
  const __m128i w = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));  // words w0 w1 w2 (.)
  const __m128i lo6 = _mm_set1_epi32(0x3f3f3f3f), lo4 = _mm_set1_epi32(0x0f0f0f0f), lo2 = _mm_set1_epi32(0x03030303);
  const __m128i r02 = _mm_and_si128(w, lo6);  // [r0, r2]
  // [r1, r3] = [w2 & lo4, (w2 >> 4) & lo4] | [(w0 >> 6) & lo2, (w1 >> 6) & lo2] << 4
  const __m128i w22 = _mm_srlv_epi32(_mm_shuffle_epi32(w, _MM_SHUFFLE(2, 2, 2, 2)), _mm_setr_epi32(0, 4, 0, 0));
  const __m128i top = _mm_slli_epi32(_mm_and_si128(_mm_srli_epi32(w, 6), lo2), 4);
  const __m128i r13 = _mm_ternarylogic_epi32(w22, lo4, top, 0xEA);  // (w22 & lo4) | top
  return _mm_unpacklo_epi32(r02, r13);
}

// k4_scales_mins for four super-blocks at once, block k's 16 bytes in 128-bit
// lane k of p (all the operations stay within lanes).
TD_FN __m512i k4_scales_mins4(__m512i w) {
  const __m512i lo6 = _mm512_set1_epi32(0x3f3f3f3f), lo4 = _mm512_set1_epi32(0x0f0f0f0f), lo2 = _mm512_set1_epi32(0x03030303);
  const __m512i r02 = _mm512_and_si512(w, lo6);
  const __m512i w22 = _mm512_srlv_epi32(_mm512_shuffle_epi32(w, _MM_PERM_CCCC),
                                        _mm512_setr_epi32(0, 4, 0, 0, 0, 4, 0, 0, 0, 4, 0, 0, 0, 4, 0, 0));
  const __m512i top = _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(w, 6), lo2), 4);
  const __m512i r13 = _mm512_ternarylogic_epi32(w22, lo4, top, 0xEA);
  return _mm512_unpacklo_epi32(r02, r13);
}

// The 256 weight quants of a q4_K / q5_K super-block: q[c] holds elements
// 64c .. 64c + 63 in order.
template <typename Block>
TD_FN void k4_quants(const uint8_t* blk, __m512i q[4]) {
  const __m512i m4 = _mm512_set1_epi8(0x0F);
  // qs[32c + l] holds element 64c + l (low nibble) and 64c + 32 + l (high):
  // broadcast the 32 bytes to both halves (a load, no shuffle) and shift the
  // upper copy down a nibble.
  for (int c = 0; c < 4; ++c) {
    const __m512i z = _mm512_broadcast_i64x4(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + offsetof(Block, qs) + 32 * c)));
    q[c] = _mm512_and_si512(_mm512_mask_srli_epi16(z, 0xFFFF0000u, z, 4), m4);
  }
  if constexpr (sizeof(Block) == sizeof(BlockQ5K)) {
    // Bit j of qh[l] is the fifth bit of element 32j + l.
    const __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + offsetof(BlockQ5K, qh))));
    for (int c = 0; c < 4; ++c) {
      const __mmask64 hit = _mm512_test_epi8_mask(
          qh, _mm512_inserti64x4(_mm512_set1_epi8(static_cast<char>(1 << (2 * c))),
                                 _mm256_set1_epi8(static_cast<char>(1 << (2 * c + 1))), 1));
      q[c] = _mm512_mask_add_epi8(q[c], hit, q[c], _mm512_set1_epi8(0x10));
    }
  }
}

// Word w of 128-bit lane L of packs(dp[2c], dp[2c+1]) holds lane 4L + w%4 of
// dp[2c + w/4], i.e. sub-block 4c + 2(w/4) + L/2: its scale byte,
// zero-extended (odd bytes are -1: zeros from a byte shuffle). c = 0 here;
// c = 1 adds 4 to the even bytes.
TD_FN __m512i k4_scale_index01() {
  return _mm512_set_epi8(-1, 3, -1, 3, -1, 3, -1, 3, -1, 1, -1, 1, -1, 1, -1, 1, -1, 3, -1, 3, -1, 3, -1, 3, -1, 1, -1, 1,
                         -1, 1, -1, 1, -1, 2, -1, 2, -1, 2, -1, 2, -1, 0, -1, 0, -1, 0, -1, 0, -1, 2, -1, 2, -1, 2, -1, 2,
                         -1, 0, -1, 0, -1, 0, -1, 0);
}

// 16 lanes summing to I = sum_j sc_j * S_j of one super-block. A dpbusd lane
// (4 products of a 4- or 5-bit and an 8-bit quant, |sum| <= 4 * 31 * 128)
// fits in int16: packs put two vectors in one (exactly), and dpwssd
// multiplies each lane by its sub-block's scale and adds them up: no 32-bit
// multiplies, no spread of the scales.
TD_FN __m512i k4_isum(const __m512i q[4], const int8_t* a, __m512i sc01, __m512i sc23) {
  __m512i dp[4];
  for (int x = 0; x < 4; ++x) dp[x] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), q[x], _mm512_loadu_si512(a + 64 * x));
  const __m512i s = _mm512_dpwssd_epi32(_mm512_setzero_si512(), _mm512_packs_epi32(dp[0], dp[1]), sc01);
  return _mm512_dpwssd_epi32(s, _mm512_packs_epi32(dp[2], dp[3]), sc23);
}

// Four super-blocks b .. b + 3 of one weight row x NA activation rows. The
// per-block horizontal sums of I and M (most of the single-block loop's
// work besides the dot products) are done for the four blocks at once, as
// are the scale unpacking and the d, dmin conversions; the float chain then
// runs in block order as before.
template <typename Block, int NA>
TD_FN void k4_quad(const uint8_t* w, const GemmActs& A, int64_t r, int64_t b, __m256 X[NA], __m256 D[NA], int64_t pf) {
  const uint8_t* blk = w + b * sizeof(Block);
  prefetch_ahead(blk, 4 * sizeof(Block), pf);
  auto scales = [blk](int k) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + k * sizeof(Block) + offsetof(Block, scales))); };
  __m512i sm = _mm512_castsi128_si512(scales(0));
  sm = _mm512_inserti32x4(sm, scales(1), 1);
  sm = _mm512_inserti32x4(sm, scales(2), 2);
  sm = _mm512_inserti32x4(sm, scales(3), 3);
  sm = k4_scales_mins4(sm);  // lane k: block k's scales (bytes 0..7) and mins (8..15)
  // Each lane's mins, zero-extended to words.
  const __m512i mins = _mm512_shuffle_epi8(
      sm, _mm512_set4_epi32(static_cast<int>(0x800F800E), static_cast<int>(0x800D800C), static_cast<int>(0x800B800A),
                            static_cast<int>(0x80098008)));
  // d, dmin of the four blocks as floats: d0, dmin0, d1, dmin1, ...
  int32_t dpair[4];
  for (int k = 0; k < 4; ++k) std::memcpy(&dpair[k], blk + k * sizeof(Block) + offsetof(Block, d), 4);
  const __m128i dw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(dpair));
  const __m256 dd = _mm256_cvtph_ps(dw);
  // Each lane's scales, zero-extended to words; vpermw then spreads block k's
  // (words 8k .. 8k + 7) like the byte shuffle of the one-block loop.
  const __m512i scw = _mm512_shuffle_epi8(
      sm, _mm512_set4_epi32(static_cast<int>(0x80078006), static_cast<int>(0x80058004), static_cast<int>(0x80038002),
                            static_cast<int>(0x80018000)));
  const __m512i widx01 = _mm512_and_si512(k4_scale_index01(), _mm512_set1_epi16(0xFF));
  __m512i S[NA][4];
  for (int k = 0; k < 4; ++k) {
    __m512i q[4];
    k4_quants<Block>(blk + k * sizeof(Block), q);
    const __m512i i01 = _mm512_add_epi16(widx01, _mm512_set1_epi16(static_cast<short>(8 * k)));
    const __m512i sc01 = _mm512_permutexvar_epi16(i01, scw);
    const __m512i sc23 = _mm512_permutexvar_epi16(_mm512_add_epi16(i01, _mm512_set1_epi16(4)), scw);
    for (int m = 0; m < NA; ++m) S[m][k] = k4_isum(q, A.qgroup(r + m) + (b + k) * kQKK, sc01, sc23);
  }
  for (int m = 0; m < NA; ++m) {
    // Lane group k of mv: block k's 4 partial min products; transposed, lane
    // group L holds partial L of blocks 0..3, like v below.
    const __m512i mv = _mm512_madd_epi16(mins, _mm512_loadu_si512(A.egroup(r + m) + b * 4));
    const __m512i mt = _mm512_permutexvar_epi32(_mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), mv);
    const __m512i v = lane_sums4(S[m]);  // lane group L: partial L of blocks 0..3
    // Sum the four lane groups of v (to I0..I3) and of mt (to M0..M3).
    const __m512i h = _mm512_add_epi32(_mm512_shuffle_i64x2(v, mt, _MM_SHUFFLE(1, 0, 1, 0)),
                                       _mm512_shuffle_i64x2(v, mt, _MM_SHUFFLE(3, 2, 3, 2)));
    const __m512i im = _mm512_add_epi32(h, _mm512_shuffle_i64x2(h, h, _MM_SHUFFLE(2, 3, 0, 1)));
    const __m128 fi = _mm_cvtepi32_ps(_mm512_castsi512_si128(im));
    // -float(M): fnmadd(M, x, acc) and fma(-M, x, acc) round alike.
    const __m128 fm = _mm_xor_ps(_mm_cvtepi32_ps(_mm512_extracti32x4_epi32(im, 2)), _mm_set1_ps(-0.0f));
    const __m128 da = _mm_loadu_ps(A.sgroup(r + m) + b);  // one activation scale per block
    X[m] = _mm256_set_m128(_mm_unpackhi_ps(fi, fm), _mm_unpacklo_ps(fi, fm));
    D[m] = _mm256_mul_ps(dd, _mm256_set_m128(_mm_unpackhi_ps(da, da), _mm_unpacklo_ps(da, da)));
  }
}

// The float chain over n blocks' terms: acc = fma(x_j, d_j, acc), j = 0..N-1.
template <int N>
TD_FN __m128 fma_chain(const float* xs, const float* ds, __m128 acc) {
  // Read the lanes back from memory (load ports) rather than let the
  // compiler extract them with shuffles that compete with the integer work's.
  asm volatile("" : : "m"(*(const float(*)[N])xs), "m"(*(const float(*)[N])ds) : "memory");
  for (int j = 0; j < N; ++j) acc = _mm_fmadd_ss(_mm_load_ss(xs + j), _mm_load_ss(ds + j), acc);
  return acc;
}

// The float chain of a quad's terms: 8 for q4_K / q5_K (I and -M of 4
// blocks), 4 for q6_K.
TD_FN __m128 quad_chain(__m256 x, __m256 d, __m128 acc) {
  alignas(32) float xs[8], ds[8];
  _mm256_store_ps(xs, x);
  _mm256_store_ps(ds, d);
  return fma_chain<8>(xs, ds, acc);
}
TD_FN __m128 quad_chain(__m128 x, __m128 d, __m128 acc) {
  alignas(16) float xs[4], ds[4];
  _mm_store_ps(xs, x);
  _mm_store_ps(ds, d);
  return fma_chain<4>(xs, ds, acc);
}

// One weight row's super-blocks four at a time, for NA activation rows:
// Quad::run<NA>(w, A, r, b, X, D, pf) leaves each activation row's chain
// terms of blocks b .. b + 3 in X and D. Each quad's chain runs after the
// next quad's integer work is issued, so that the two overlap (run right
// away, the chain's dependent FMAs showed in the time per quad: q4_K from
// L2 24.4 -> 22.8 us). Returns the first block left for the caller.
template <typename Quad, int NA>
TD_FN int64_t run_quads(const uint8_t* w, const GemmActs& A, int64_t r, int64_t pf, __m128 acc[NA]) {
  using V = typename Quad::V;
  V X[NA], D[NA];
  int64_t b = 0;
  for (; b + 4 <= A.nb; b += 4) {
    V nx[NA], nd[NA];
    Quad::template run<NA>(w, A, r, b, nx, nd, pf);
    for (int m = 0; m < NA; ++m) {
      if (b > 0) acc[m] = quad_chain(X[m], D[m], acc[m]);
      X[m] = nx[m];
      D[m] = nd[m];
    }
  }
  if (b > 0)
    for (int m = 0; m < NA; ++m) acc[m] = quad_chain(X[m], D[m], acc[m]);
  return b;
}

template <typename Block>
struct K4Quad {
  using V = __m256;
  template <int NA>
  TD_FN static void run(const uint8_t* w, const GemmActs& A, int64_t r, int64_t b, V X[NA], V D[NA], int64_t pf) {
    k4_quad<Block, NA>(w, A, r, b, X, D, pf);
  }
};

// q4_K / q5_K: one weight row (K4Tile reads them one at a time) x NA
// activation rows; four super-blocks at a time, then one by one.
template <typename Block, int NW, int NA>
TD_FN void k4_tile(const uint8_t* const w[NW], const GemmActs& A, int64_t r, float* y, int64_t ldy, int64_t pf) {
  static_assert(NW == 1);
  __m128 acc[NA];
  for (int m = 0; m < NA; ++m) acc[m] = _mm_setzero_ps();
  int64_t b = run_quads<K4Quad<Block>, NA>(w[0], A, r, pf, acc);
  const __m512i idx01 = k4_scale_index01();
  const __m512i idx23 = _mm512_add_epi8(idx01, _mm512_maskz_set1_epi8(0x5555555555555555ull, 4));
  for (; b < A.nb; ++b) {
    const uint8_t* blk = w[0] + b * sizeof(Block);
    prefetch_ahead(blk, sizeof(Block), pf);
    __m512i q[4];
    k4_quants<Block>(blk, q);
    const __m128i sm = k4_scales_mins(blk + offsetof(Block, scales));  // scales 0..7, mins 8..15
    const __m512i smb = _mm512_broadcast_i32x4(sm);
    const __m512i sc01 = _mm512_shuffle_epi8(smb, idx01), sc23 = _mm512_shuffle_epi8(smb, idx23);
    const __m128i mins = _mm_cvtepu8_epi16(_mm_srli_si128(sm, 8));
    const float d = f16(blk + offsetof(Block, d)), dmin = f16(blk + offsetof(Block, dmin));
    for (int m = 0; m < NA; ++m) {
      const __m512i s = k4_isum(q, A.qgroup(r + m) + b * kQKK, sc01, sc23);
      const __m128i bp = _mm_loadu_si128(reinterpret_cast<const __m128i*>(A.egroup(r + m) + b * 4));
      const __m128 im = hsum_pair(s, _mm_madd_epi16(mins, bp));  // float(I), float(M)
      const __m128 da = _mm_set_ss(A.sgroup(r + m)[b]);
      const __m128 x = _mm_fmadd_ss(im, _mm_mul_ss(_mm_set_ss(d), da), acc[m]);
      acc[m] = _mm_fnmadd_ss(_mm_movehdup_ps(im), _mm_mul_ss(_mm_set_ss(dmin), da), x);
    }
  }
  for (int m = 0; m < NA; ++m) y[m * ldy] = _mm_cvtss_f32(acc[m]);
}

// q4_K, 16 weight rows in the tiles layout (kernels/k4_tiles.h): lane n is
// row n throughout. dpbusd against a broadcast of 4 activation quants gives
// the 16 rows' partial sums at once, so the sub-block sums need no
// reduction, the scales multiply whole vectors (one vpmulld per sub-block
// for 16 rows) and the 16 float chains advance in one FMA per term. The
// high nibbles are masked in place (0xF0), which makes their sums 16 times
// too large; the scaled sums of the four high sub-blocks are divided back
// once, exactly (each term is a multiple of 16, and |16 I| < 2^28). Same
// integers I and M, same float steps as the kernels above: the same bits.
template <int NA>
TD_FN void k4_tile16(const uint8_t* tile, const GemmActs& A, int64_t r, float* y, int64_t ldy, int64_t pf) {
  using namespace k4_tiles;
  const __m512i lo4 = _mm512_set1_epi8(0x0F), hi4 = _mm512_set1_epi8(static_cast<char>(0xF0));
  __m512 acc[NA];
  for (int m = 0; m < NA; ++m) acc[m] = _mm512_setzero_ps();
  for (int64_t b = 0; b < A.nb; ++b) {
    const uint8_t* blk = tile + b * kBlockBytes;
    prefetch_ahead(blk, kBlockBytes, pf);
    // d and dmin, at the block's start, first: Zen 4 streamed q6_K worse
    // when a block's end was read before its quants.
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + kD)));
    const __m512 dmin = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + kDmin)));
    const int8_t* a[NA];
    __m512i M[NA], Ilo[NA], Ihi[NA];
    for (int m = 0; m < NA; ++m) {
      a[m] = A.qgroup(r + m) + b * kQKK;
      M[m] = Ilo[m] = Ihi[m] = _mm512_setzero_si512();
    }
    for (int e = 0; e < 4; ++e) {
      const __m512i mw = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + kMins + 32 * e)));
      for (int m = 0; m < NA; ++m) M[m] = _mm512_dpwssd_epi32(M[m], mw, _mm512_set1_epi32(A.egroup(r + m)[b * 4 + e]));
    }
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) {
      __m512i slo[NA], shi[NA];
      for (int m = 0; m < NA; ++m) slo[m] = shi[m] = _mm512_setzero_si512();
#pragma GCC unroll 8
      for (int i = 0; i < 8; ++i) {
        const int p = 8 * j + i;
        const __m512i z = _mm512_loadu_si512(blk + kQ + 64 * p);
        const __m512i lo = _mm512_and_si512(z, lo4), hi = _mm512_and_si512(z, hi4);
        for (int m = 0; m < NA; ++m) {
          int32_t al, ah;
          std::memcpy(&al, a[m] + 4 * p, 4);
          std::memcpy(&ah, a[m] + 128 + 4 * p, 4);
          slo[m] = _mm512_dpbusd_epi32(slo[m], lo, _mm512_set1_epi32(al));
          shi[m] = _mm512_dpbusd_epi32(shi[m], hi, _mm512_set1_epi32(ah));
        }
      }
      const __m512i sl = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + kSc + 16 * j)));
      const __m512i sh = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + kSc + 16 * (j + 4))));
      for (int m = 0; m < NA; ++m) {
        Ilo[m] = _mm512_add_epi32(Ilo[m], _mm512_mullo_epi32(slo[m], sl));
        Ihi[m] = _mm512_add_epi32(Ihi[m], _mm512_mullo_epi32(shi[m], sh));
      }
    }
    for (int m = 0; m < NA; ++m) {
      const __m512i I = _mm512_add_epi32(Ilo[m], _mm512_srai_epi32(Ihi[m], 4));
      const __m512 da = _mm512_set1_ps(A.sgroup(r + m)[b]);
      acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(I), _mm512_mul_ps(d, da), acc[m]);
      acc[m] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(M[m]), _mm512_mul_ps(dmin, da), acc[m]);
    }
  }
  for (int m = 0; m < NA; ++m) _mm512_storeu_ps(y + m * ldy, acc[m]);
}

// The 256 quants of a q6_K super-block, +32 (0..63): q[c] holds elements
// 64c .. 64c + 63 in order.
TD_FN void k6_quants(const uint8_t* blk, __m512i q[4]) {
  const __m512i m4 = _mm512_set1_epi8(0x0F), m2 = _mm512_set1_epi8(3);
  for (int h = 0; h < 2; ++h) {
    // Elements 128h + (0..63) and 128h + (64..127), in order.
    const __m512i l = _mm512_loadu_si512(blk + offsetof(BlockQ6K, ql) + 64 * h);
    const __m256i hb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + offsetof(BlockQ6K, qh) + 32 * h));
    const __m512i qh = _mm512_inserti64x4(_mm512_castsi256_si512(hb), _mm256_srli_epi16(hb, 2), 1);
    q[2 * h] = _mm512_or_si512(_mm512_and_si512(l, m4), _mm512_slli_epi16(_mm512_and_si512(qh, m2), 4));
    q[2 * h + 1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l, 4), m4),
                                   _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(qh, 4), m2), 4));
  }
}

// A q6_K super-block's 16 group scales: sc16 as int32 lanes, and per chunk c
// the dpwssd operand whose lane l carries the scale of group 4c + l/4 in its
// low word (high word 0).
TD_FN void k6_scales(const uint8_t* blk, __m512i& sc16, __m512i sc[4]) {
  sc16 = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + offsetof(BlockQ6K, scales))));
  const __m512i words = _mm512_and_si512(sc16, _mm512_set1_epi32(0xFFFF));
  for (int c = 0; c < 4; ++c)
    sc[c] = _mm512_permutexvar_epi32(
        _mm512_add_epi32(_mm512_set1_epi32(4 * c), _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3)),
        words);
}

// 16 lanes summing to I = sum_j sc_j * S_j of one q6_K super-block. A dpbusd
// lane (4 products of a 6-bit and an 8-bit quant, |sum| <= 4 * 63 * 128)
// fits in int16, so dpwssd against the scale in the low word multiplies and
// adds it (no 32-bit multiplies but the one for the +32 offset's term:
// extra = -32 * group sums).
TD_FN __m512i k6_isum(const __m512i q[4], const int8_t* a, const __m512i sc[4], __m512i sc16, __m512i extra) {
  __m512i s = _mm512_mullo_epi32(sc16, extra);
  for (int c = 0; c < 4; ++c)
    s = _mm512_dpwssd_epi32(s, _mm512_dpbusd_epi32(_mm512_setzero_si512(), q[c], _mm512_loadu_si512(a + 64 * c)), sc[c]);
  return s;
}

// Four q6_K super-blocks b .. b + 3 of one weight row x NA activation rows:
// I of each as k4_quad does (one reduction for the four), then X = float(I)
// and D = d * da for the chain.
template <int NA>
TD_FN void k6_quad(const uint8_t* w, const GemmActs& A, int64_t r, int64_t b, __m128 X[NA], __m128 D[NA], int64_t pf) {
  const uint8_t* blk = w + b * sizeof(BlockQ6K);
  prefetch_ahead(blk, 4 * sizeof(BlockQ6K), pf);
  uint16_t dh[4];
  __m512i S[NA][4];
  for (int k = 0; k < 4; ++k) {
    const uint8_t* bk = blk + k * sizeof(BlockQ6K);
    __m512i q[4], sc[4], sc16;
    k6_quants(bk, q);
    k6_scales(bk, sc16, sc);
    std::memcpy(&dh[k], bk + offsetof(BlockQ6K, d), 2);
    for (int m = 0; m < NA; ++m)
      S[m][k] = k6_isum(q, A.qgroup(r + m) + (b + k) * kQKK, sc, sc16,
                        _mm512_loadu_si512(A.egroup(r + m) + (b + k) * 16));
  }
  const __m128 d = _mm_cvtph_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(dh)));
  for (int m = 0; m < NA; ++m) {
    const __m512i v = lane_sums4(S[m]);  // lane group L: partial L of blocks 0..3
    const __m256i h = _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1));
    X[m] = _mm_cvtepi32_ps(_mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1)));  // I0..I3
    D[m] = _mm_mul_ps(d, _mm_loadu_ps(A.sgroup(r + m) + b));
  }
}

struct K6Quad {
  using V = __m128;
  template <int NA>
  TD_FN static void run(const uint8_t* w, const GemmActs& A, int64_t r, int64_t b, V X[NA], V D[NA], int64_t pf) {
    k6_quad<NA>(w, A, r, b, X, D, pf);
  }
};

// q6_K: one weight row x NA activation rows, four super-blocks at a time,
// then one by one.
template <int NW, int NA>
TD_FN void k6_tile(const uint8_t* const w[NW], const GemmActs& A, int64_t r, float* y, int64_t ldy, int64_t pf) {
  static_assert(NW == 1);
  __m128 acc[NA];
  for (int m = 0; m < NA; ++m) acc[m] = _mm_setzero_ps();
  int64_t b = run_quads<K6Quad, NA>(w[0], A, r, pf, acc);
  for (; b < A.nb; ++b) {
    const uint8_t* blk = w[0] + b * sizeof(BlockQ6K);
    prefetch_ahead(blk, sizeof(BlockQ6K), pf);
    __m512i q[4], sc[4], sc16;
    k6_quants(blk, q);
    k6_scales(blk, sc16, sc);
    const float d = f16(blk + offsetof(BlockQ6K, d));
    for (int m = 0; m < NA; ++m) {
      const __m512i s = k6_isum(q, A.qgroup(r + m) + b * kQKK, sc, sc16, _mm512_loadu_si512(A.egroup(r + m) + b * 16));
      const float x = static_cast<float>(_mm512_reduce_add_epi32(s));
      acc[m] = _mm_set_ss(fma1(x, d * A.sgroup(r + m)[b], _mm_cvtss_f32(acc[m])));
    }
  }
  for (int m = 0; m < NA; ++m) y[m * ldy] = _mm_cvtss_f32(acc[m]);
}

// Walks weight rows [o0, o1) Tile::kRows (1 or 2) at a time and activation
// rows in pairs, calling Tile::run<NW, NA>(w, A, r, y + r * ldy + o, ldy).
// Two weight rows give the q32 kernels two float chains in flight; the
// K-quant kernels have few float steps and gain nothing from two (q4_K with
// two rows measured faster from L2 but not end to end).
template <typename Tile>
TD_FN void quant_rows(const WeightMatrix& W, int64_t o0, int64_t o1, const GemmActs& A, int64_t r0, int64_t r1,
                      float* y, int64_t ldy) {
  const int64_t pf = prefetch_distance(W.row_stride, Tile::kRows, kPrefetchBytesFewRows);
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

template <typename Conv>
struct Q32Tile {
  static constexpr int kRows = 2;
  template <int NW, int NA>
  TD_FN static void run(const uint8_t* const* w, const GemmActs& A, int64_t r, float* y, int64_t ldy, int64_t pf) {
    q32_tile<Conv, NW, NA>(w, A, r, y, ldy, pf);
  }
};
template <typename Block>
struct K4Tile {
  static constexpr int kRows = 1;
  template <int NW, int NA>
  TD_FN static void run(const uint8_t* const* w, const GemmActs& A, int64_t r, float* y, int64_t ldy, int64_t pf) {
    k4_tile<Block, NW, NA>(w, A, r, y, ldy, pf);
  }
};
struct K6Tile {
  static constexpr int kRows = 1;
  template <int NW, int NA>
  TD_FN static void run(const uint8_t* const* w, const GemmActs& A, int64_t r, float* y, int64_t ldy, int64_t pf) {
    k6_tile<NW, NA>(w, A, r, y, ldy, pf);
  }
};

// ---- q4_0, 16 weight rows side by side ----
//
// q4_0 packs a block in 18 bytes, so its decode has twice the blocks per
// byte of q8_0, and the generic kernels above were compute-bound on it
// (~20 GB/s on one Zen 5 core against ~39 of read bandwidth): per 2 blocks
// they spent ~8 shuffles folding 8-lane dpbusd results into block sums and
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

// One step of 4 blocks (or of the first n < 4 blocks; the rest of the
// 72-byte row pieces are zeros) for 16 rows w + i * stride. aq[m]: the 128
// activation quants of the step for activation row m (zeros past block n).
template <int NA, bool kPf>
TD_FN void q40_step16(const uint8_t* w, size_t stride, const int8_t* const aq[NA], const float* const da[NA],
                      const int32_t* const ex[NA], int n, int64_t pf, __m512 acc[NA]) {
  const __m512i m4 = _mm512_set1_epi8(0x0F);
  // 128-bit lane k of the low (high) operand: elements 0..15 (16..31) of block
  // k, i.e. qwords 4k, 4k+1 (4k+2, 4k+3) of the step's 128 bytes.
  const __m512i ilo = _mm512_setr_epi64(0, 1, 4, 5, 8, 9, 12, 13), ihi = _mm512_setr_epi64(2, 3, 6, 7, 10, 11, 14, 15);
  // Block k's scale is in dword dpos[k] = 0, 4, 9, 13 of a row's first 64
  // bytes, in its low word for even k and its high word for odd k. Moved to
  // the reduced sums' layout (lane 4k + j: block k, row j of a group of 4):
  // one permute per pair of rows, even rows from the first table.
  const __m512i idw = _mm512_setr_epi32(0, 16, 0, 16, 4, 20, 4, 20, 9, 25, 9, 25, 13, 29, 13, 29);
  const __m512i hshift = _mm512_setr_epi32(0, 0, 0, 0, 16, 16, 16, 16, 0, 0, 0, 0, 16, 16, 16, 16);
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
        // The 72 bytes of the step touch at most two lines.
        _mm_prefetch(reinterpret_cast<const char*>(row + pf), _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(row + pf + 71), _MM_HINT_T0);
      }
      head[j] = _mm512_loadu_si512(row);
      const uint8_t* q = row + offsetof(BlockQ4_0, qs);
      // Broadcasts from memory place each field in its lane (loads, no shuffle unit).
      __m512i z = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q)));
      z = _mm512_mask_broadcast_i32x4(z, 0x00F0, _mm_loadu_si128(reinterpret_cast<const __m128i*>(q + sizeof(BlockQ4_0))));
      z = _mm512_mask_broadcast_i32x4(z, 0x0F00, _mm_loadu_si128(reinterpret_cast<const __m128i*>(q + 2 * sizeof(BlockQ4_0))));
      z = _mm512_mask_broadcast_i32x4(z, 0xF000, _mm_loadu_si128(reinterpret_cast<const __m128i*>(q + 3 * sizeof(BlockQ4_0))));
      const __m512i lo = _mm512_and_si512(z, m4), hi = _mm512_and_si512(_mm512_srli_epi16(z, 4), m4);
      for (int m = 0; m < NA; ++m)
        P[m][j] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, alo[m]), hi, ahi[m]);
    }
    {
      const __m512i d = _mm512_mask_blend_epi32(0xCCCC, _mm512_permutex2var_epi32(head[0], idw, head[1]),
                                                _mm512_permutex2var_epi32(head[2], idw, head[3]));
      DW[g] = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srlv_epi32(d, hshift)));
    }
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
template <int NA>
TD_FN void q40_tile16(const uint8_t* src, size_t stride, const GemmActs& A, int64_t r, float* y, int64_t ldy,
                      int64_t pf) {
  constexpr size_t kB = sizeof(BlockQ4_0);
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
    q40_step16<NA, true>(src + b * kB, stride, aq, da, ex, 4, pf, acc);
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
    q40_step16<NA, false>(wt[0], 4 * kB, aq, da, ex, n, 0, acc);
  }
  for (int m = 0; m < NA; ++m) _mm512_storeu_ps(y + m * ldy, acc[m]);
}

// 16 weight rows x NA activation rows r.. of a q4_0 / q5_0 (kQ5) matrix from
// one tile of the tiles layout (kernels/q32_tiles.h), lane n = row n, as
// k4_tile16 does for q4_K: per block, 8 dpbusd for the 16 rows, then S +
// extra and one 16-lane FMA. q4_0's high nibbles are masked in place (their
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

// q32 matrices: q4_0 / q5_0 tiles, then q4_0 16 weight rows at a time
// while they last (above); then 8 rows at a time (one FMA per block for all 8
// chains), then the 2-row tiles.
template <typename Conv>
TD_ATTR void rows_q32(const WeightMatrix& W, int64_t o0, int64_t o1, const GemmActs& A, int64_t r0, int64_t r1,
                      float* y, int64_t ldy) {
  int64_t o = o0;
  constexpr bool kQ5 = std::is_same_v<Conv, Q5_0Conv>;
  if constexpr (kQ5 || std::is_same_v<Conv, Q4_0Conv>) {
    if (W.tiles) {
      // Whole tiles come from W.tiles only (their file pages may be gone);
      // o0 is a tile's first row (GemmKernel::rows). One stream, 4 KB ahead
      // where the CPU wants software prefetch; activation rows four at a time.
      const size_t tb = q32_tiles::tile_bytes(A.nb, kQ5);
      const int64_t pft = stream_tuning().software_prefetch ? kPrefetchBytes : 0;
      for (; o + 16 <= o1; o += 16) {
        const uint8_t* tile = W.tiles + (o / 16) * tb;
        float* yo = y + o;
        int64_t r = r0;
        for (; r + 4 <= r1; r += 4) q32_lane16<4, kQ5>(tile, A, r, yo + r * ldy, ldy, pft);
        if (r1 - r == 3) q32_lane16<3, kQ5>(tile, A, r, yo + r * ldy, ldy, pft);
        if (r1 - r == 2) q32_lane16<2, kQ5>(tile, A, r, yo + r * ldy, ldy, pft);
        if (r1 - r == 1) q32_lane16<1, kQ5>(tile, A, r, yo + r * ldy, ldy, pft);
      }
    }
  }
  if constexpr (std::is_same_v<Conv, Q4_0Conv>) {
    const int64_t pf16 = prefetch_distance(W.row_stride, 16);
    for (; o + 16 <= o1; o += 16)
      for (int64_t r = r0; r < r1; r += 2) {
        if (r + 1 < r1) q40_tile16<2>(W.row(o), W.row_stride, A, r, y + r * ldy + o, ldy, pf16);
        else q40_tile16<1>(W.row(o), W.row_stride, A, r, y + r * ldy + o, ldy, pf16);
      }
  }
  const int64_t pf = prefetch_distance(W.row_stride, 8);
  // Gather offsets are int32: row strides past 256 MB take the 2-row tiles.
  if (W.row_stride < (size_t{1} << 28))
    for (; o + 8 <= o1; o += 8)
      for (int64_t r = r0; r < r1; r += 2) {
        if (r + 1 < r1) q32_tile8<Conv, 2>(W.row(o), W.row_stride, A, r, y + r * ldy + o, ldy, pf);
        else q32_tile8<Conv, 1>(W.row(o), W.row_stride, A, r, y + r * ldy + o, ldy, pf);
      }
  if (o < o1) quant_rows<Q32Tile<Conv>>(W, o, o1, A, r0, r1, y, ldy);
}

template <typename Tile>
TD_ATTR void rows_quant(const WeightMatrix& W, int64_t o0, int64_t o1, const GemmActs& A, int64_t r0, int64_t r1,
                        float* y, int64_t ldy) {
  if constexpr (std::is_same_v<Tile, K4Tile<BlockQ4K>>) {
    if (W.tiles) {
      // Whole tiles from W.tiles only (o0 is a tile's first row), one
      // stream; activation rows four at a time, as rows_q32 does.
      const size_t tb = k4_tiles::tile_bytes(A.nb);
      const int64_t pf = stream_tuning().software_prefetch ? kPrefetchBytes : 0;
      for (; o0 + 16 <= o1; o0 += 16) {
        const uint8_t* tile = W.tiles + (o0 / 16) * tb;
        float* yo = y + o0;
        int64_t r = r0;
        for (; r + 4 <= r1; r += 4) k4_tile16<4>(tile, A, r, yo + r * ldy, ldy, pf);
        if (r1 - r == 3) k4_tile16<3>(tile, A, r, yo + r * ldy, ldy, pf);
        if (r1 - r == 2) k4_tile16<2>(tile, A, r, yo + r * ldy, ldy, pf);
        if (r1 - r == 1) k4_tile16<1>(tile, A, r, yo + r * ldy, ldy, pf);
      }
    }
  }
  if (o0 < o1) quant_rows<Tile>(W, o0, o1, A, r0, r1, y, ldy);
}

// ---- float class ----

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

// gemm.h's tree: lanes j + j+8, then j + j+4, j + j+2, 0 + 1.
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
// rows from their tiles four at a time (one stream: kernels/float_tiles.h).
// Only the first group of activation rows prefetches weights: it is the one
// that pulls the block from memory. Later groups find it in L2, and the
// prefetches then only compete with the tile's own loads: dropping them
// took 512-row f16 products from ~160 to ~208 GFLOP/s on one Zen 5 core.
template <typename Load>
TD_ATTR void rows_float(const WeightMatrix& W, int64_t o0, int64_t o1, const GemmActs& A, int64_t r0, int64_t r1,
                        float* y, int64_t ldy) {
  const int64_t K = A.cols;
  const int64_t pf4 = prefetch_distance(W.row_stride, 4);
  const bool single_row = stream_tuning().float_single_row;
  constexpr int64_t kRowStep = 16 * Load::kBytes;
  constexpr int64_t kTileStep = float_tiles::group_step(Load::kBytes);
  // Rows below `tiled` come from W.tiles (o0 is a multiple of 16).
  const int64_t tiled = W.tiles ? W.rows / kGemmTile * kGemmTile : 0;
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
        for (int i = 0; i < 4; ++i) w[i] = float_tiles::row_start(W.tiles, K, Load::kBytes, o + i);
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

GemmKernel avx512_rows_kernel(GgmlType w, GemmKernel k) {
  switch (w) {
    case GgmlType::Q4_0: k.rows = rows_q32<Q4_0Conv>; break;
    case GgmlType::Q5_0: k.rows = rows_q32<Q5_0Conv>; break;
    case GgmlType::Q8_0: k.rows = rows_q32<Q8_0Conv>; break;
    case GgmlType::Q4_K: k.rows = rows_quant<K4Tile<BlockQ4K>>; break;
    case GgmlType::Q5_K: k.rows = rows_quant<K4Tile<BlockQ5K>>; break;
    case GgmlType::Q6_K: k.rows = rows_quant<K6Tile>; break;
    case GgmlType::F32: k.rows = rows_float<LoadF32>; break;
    case GgmlType::F16: k.rows = rows_float<LoadF16>; break;
    case GgmlType::BF16: k.rows = rows_float<LoadBF16>; break;
    default: break;
  }
  return k;
}

}  // namespace tandem::gemm_detail

#endif

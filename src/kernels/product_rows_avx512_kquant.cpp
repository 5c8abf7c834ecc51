// AVX-512 row-wise kernels for q4_K, q5_K and q6_K (product_rows_avx512.cpp
// says what the row-wise path is): one weight row at a time, four
// super-blocks per step with their horizontal sums done together, and q4_K
// 16 rows at a time from its tiles.
#include "kernels/product_rows_avx512.h"

#if defined(__x86_64__)

#include <cstring>
#include <type_traits>

#include "quant/quant_blocks.h"
#include "kernels/simd_avx512.h"
#include "kernels/layout_k4_tiles.h"

namespace tandem::gemm_detail::avx512_rows {
namespace {

using namespace avx512;

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
// away, the chain's dependent FMAs show in the time per quad). Returns the
// first block left for the caller.
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

// q4_K, 16 weight rows in the tiles layout (kernels/layout_k4_tiles.h): lane n is
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

template <typename Tile>
TD_ATTR void rows_quant(const WeightMatrix& W, int64_t o0, int64_t o1, const GemmActs& A, int64_t r0, int64_t r1,
                        float* y, int64_t ldy) {
  if constexpr (std::is_same_v<Tile, K4Tile<BlockQ4K>>) {
    if (W.tiles()) {
      // Whole tiles from W.tiles() only (o0 is a tile's first row), one
      // stream; activation rows four at a time, as rows_q32 (the q32 file) does.
      const size_t tb = k4_tiles::tile_bytes(A.nb);
      const int64_t pf = A.prefetch ? kPrefetchBytes : 0;
      for (; o0 + 16 <= o1; o0 += 16) {
        const uint8_t* tile = W.tiles() + (o0 / 16) * tb;
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

}  // namespace

}  // namespace tandem::gemm_detail::avx512_rows

namespace tandem::builds {

using namespace gemm_detail::avx512_rows;

TypeFns avx512_kquant_rows(GgmlType w) {
  switch (w) {
    case GgmlType::Q4_K: return {.rows = rows_quant<K4Tile<BlockQ4K>>};
    case GgmlType::Q5_K: return {.rows = rows_quant<K4Tile<BlockQ5K>>};
    case GgmlType::Q6_K: return {.rows = rows_quant<K6Tile>};
    default: return {};
  }
}

}  // namespace tandem::builds

#endif

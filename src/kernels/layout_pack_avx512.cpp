// AVX-512 packers (layout_pack_rows.h): the file's rows through one 512-bit
// transpose per 16 x 8 dwords, and the tiles (layout_q32_tiles.h,
// layout_k4_tiles.h), which are already one lane per row.
#include "kernels/simd_avx512.h"

#if defined(__x86_64__)

#include "kernels/layout_k4_tiles.h"
#include "kernels/layout_panels.h"
#include "kernels/layout_q32_tiles.h"
#include "kernels/product_kernels.h"

namespace tandem::gemm_detail::avx512 {
namespace {

// 16 rows of 8 dwords (row n in r[n]) to 8 vectors of 16 dwords, vector g
// holding dword g of every row, stored 64 bytes apart from out. Pairs of rows
// (n, n+8) share a register so the classic 8x8 transpose moves both halves.
TD_FN void transpose_16x8(const __m256i r[16], uint8_t* out) {
  __m512i z[8];
  for (int i = 0; i < 8; ++i) z[i] = _mm512_inserti64x4(_mm512_castsi256_si512(r[i]), r[i + 8], 1);
  const __m512i t0 = _mm512_unpacklo_epi32(z[0], z[1]), t1 = _mm512_unpackhi_epi32(z[0], z[1]);
  const __m512i t2 = _mm512_unpacklo_epi32(z[2], z[3]), t3 = _mm512_unpackhi_epi32(z[2], z[3]);
  const __m512i t4 = _mm512_unpacklo_epi32(z[4], z[5]), t5 = _mm512_unpackhi_epi32(z[4], z[5]);
  const __m512i t6 = _mm512_unpacklo_epi32(z[6], z[7]), t7 = _mm512_unpackhi_epi32(z[6], z[7]);
  // u[e] (e < 4): per 128-bit lane, dword e (lanes 0, 2) or e + 4 (lanes 1, 3)
  // of rows 0-3 / 8-11; u[e + 4] the same for rows 4-7 / 12-15.
  const __m512i u[8] = {_mm512_unpacklo_epi64(t0, t2), _mm512_unpackhi_epi64(t0, t2),
                        _mm512_unpacklo_epi64(t1, t3), _mm512_unpackhi_epi64(t1, t3),
                        _mm512_unpacklo_epi64(t4, t6), _mm512_unpackhi_epi64(t4, t6),
                        _mm512_unpacklo_epi64(t5, t7), _mm512_unpackhi_epi64(t5, t7)};
  const __m512i lo = _mm512_setr_epi64(0, 1, 8, 9, 4, 5, 12, 13);
  const __m512i hi = _mm512_setr_epi64(2, 3, 10, 11, 6, 7, 14, 15);
  for (int e = 0; e < 4; ++e) {
    _mm512_storeu_si512(out + 64 * e, _mm512_permutex2var_epi64(u[e], lo, u[e + 4]));
    _mm512_storeu_si512(out + 64 * (e + 4), _mm512_permutex2var_epi64(u[e], hi, u[e + 4]));
  }
}

// The f16 at rows[n] + off for every n, as 16 floats at out.
TD_FN void pack_f16s(const uint8_t* const rows[16], size_t off, float* out) {
  alignas(32) uint16_t h[16];
  for (int n = 0; n < 16; ++n) std::memcpy(&h[n], rows[n] + off, 2);
  _mm512_store_ps(out, _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(h))));
}

TD_FN __m256i add_fifth_bit(__m256i v, __m256i qh, int j) {
  const __mmask32 bit = _mm256_test_epi8_mask(qh, _mm256_set1_epi8(static_cast<char>(1 << j)));
  return _mm256_mask_add_epi8(v, bit, v, _mm256_set1_epi8(0x10));
}

// Panels from a q4_0 / q5_0 tile (kernels/layout_q32_tiles.h), blocks [b0, b1):
// already one lane per row, so packing copies the scales and splits the
// nibbles (q5_0: adds the fifth bits). The tile is one stream, which the
// hardware prefetchers do not run as far ahead as the file's 16 rows
// (prefill lost speed that way), so each step fetches the one a
// chunk ahead into L2.
TD_FN void pack_q32_tile(const uint8_t* tile, int64_t nb, bool q5, int64_t b0, int64_t b1, uint8_t* panel) {
  using namespace q32_tiles;
  const __m512i m4 = _mm512_set1_epi8(0x0F), bit4 = _mm512_set1_epi8(0x10);
  const int64_t ahead = (b1 - b0) * static_cast<int64_t>(block_bytes(q5));
  for (int64_t b = b0; b < b1; ++b, panel += Q32Panel::kBytes) {
    if (b == b0 || b % kStepBlocks == 0)
      for (size_t i = 0; i < step_bytes(q5); i += 64)
        _mm_prefetch(reinterpret_cast<const char*>(tile + d_offset(b, q5) + ahead + i), _MM_HINT_T1);
    std::memcpy(panel + Q32Panel::kD, tile + d_offset(b, q5), 32);
    const uint8_t* q = tile + q_offset(nb, b, q5);
    const uint8_t* h = q5 ? tile + h_offset(nb, b) : nullptr;
    for (int c = 0; c < 4; ++c) {
      const __m512i z = _mm512_loadu_si512(q + 64 * c);
      __m512i lo = _mm512_and_si512(z, m4), hi = _mm512_and_si512(_mm512_srli_epi16(z, 4), m4);
      if (q5) {
        lo = _mm512_mask_add_epi8(lo, mask64_at(h + 8 * c), lo, bit4);
        hi = _mm512_mask_add_epi8(hi, mask64_at(h + 8 * (c + 4)), hi, bit4);
      }
      _mm512_storeu_si512(panel + Q32Panel::kQ + 64 * c, lo);
      _mm512_storeu_si512(panel + Q32Panel::kQ + 64 * (c + 4), hi);
    }
  }
}

// Panels from a q4_K tile (kernels/layout_k4_tiles.h): already one lane per row,
// so packing only widens the scales and splits the nibbles.
TD_FN void pack_k4_tile(const uint8_t* tile, int64_t b0, int64_t b1, uint8_t* panel) {
  using namespace k4_tiles;
  const __m512i m4 = _mm512_set1_epi8(0x0F);
  for (int64_t b = b0; b < b1; ++b, panel += K4Panel::kBytes) {
    const uint8_t* t = tile + b * kBlockBytes;
    _mm512_storeu_ps(panel + K4Panel::kD, _mm512_cvtph_ps(load256(t + kD)));
    _mm512_storeu_ps(panel + K4Panel::kDmin, _mm512_cvtph_ps(load256(t + kDmin)));
    for (int j = 0; j < 8; ++j)
      _mm512_storeu_si512(panel + K4Panel::kSc + 64 * j,
                          _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(t + kSc + 16 * j))));
    for (int e = 0; e < 4; ++e)
      _mm512_storeu_si512(panel + K4Panel::kMins + 64 * e, _mm512_cvtepu8_epi16(load256(t + kMins + 32 * e)));
    for (int p = 0; p < 32; ++p) {
      const __m512i z = _mm512_loadu_si512(t + kQ + 64 * p);
      _mm512_storeu_si512(panel + K4Panel::kQ + 64 * p, _mm512_and_si512(z, m4));
      _mm512_storeu_si512(panel + K4Panel::kQ + 64 * (p + 32), _mm512_and_si512(_mm512_srli_epi16(z, 4), m4));
    }
  }
}

TD_FN bool pack_from_tiles(const WeightMatrix& W, int64_t o0, int64_t b0, int64_t b1, uint8_t* panel) {
  if (!W.tiles()) return false;
  if (W.type == GgmlType::Q4_K) {
    pack_k4_tile(W.tiles() + (o0 / kGemmTile) * k4_tiles::tile_bytes(W.cols / kQKK), b0, b1, panel);
    return true;
  }
  const int64_t nb = W.cols / kQK;
  const bool q5 = W.type == GgmlType::Q5_0;
  pack_q32_tile(W.tiles() + (o0 / kGemmTile) * q32_tiles::tile_bytes(nb, q5), nb, q5, b0, b1, panel);
  return true;
}

}  // namespace

#include "kernels/layout_pack_rows.h"

}  // namespace tandem::gemm_detail::avx512

#endif

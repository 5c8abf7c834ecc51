// AVX2 packers (layout_pack_rows.h): the file's rows through two 8x8
// transposes per 16 x 8 dwords, one for lanes 0-7 and one for lanes 8-15.
#include "kernels/simd_avx2.h"

#if defined(__x86_64__)

#include "kernels/layout_panels.h"
#include "kernels/product_kernels.h"
#include "kernels/simd_transpose.h"

namespace tandem::gemm_detail::avx2 {
namespace {

// 16 rows of 8 dwords to 8 panel vectors, 64 bytes apart from out.
TD_FN void transpose_16x8(__m256i r[16], uint8_t* out) {
  simd::transpose_8x8_epi32(r);
  simd::transpose_8x8_epi32(r + 8);
  for (int g = 0; g < 8; ++g) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 64 * g), r[g]);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 64 * g + 32), r[8 + g]);
  }
}

// The f16 at rows[n] + off for every n, as 16 floats at out.
TD_FN void pack_f16s(const uint8_t* const rows[16], size_t off, float* out) {
  alignas(32) uint16_t h[16];
  for (int n = 0; n < 16; ++n) std::memcpy(&h[n], rows[n] + off, 2);
  const __m256i v = _mm256_load_si256(reinterpret_cast<const __m256i*>(h));
  _mm256_store_ps(out, _mm256_cvtph_ps(_mm256_castsi256_si128(v)));
  _mm256_store_ps(out + 8, _mm256_cvtph_ps(_mm256_extracti128_si256(v, 1)));
}

TD_FN __m256i add_fifth_bit(__m256i v, __m256i qh, int j) {
  const __m256i bit = _mm256_set1_epi8(static_cast<char>(1 << j));
  return _mm256_or_si256(v, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, bit), bit), _mm256_set1_epi8(0x10)));
}

// No AVX2 kernel reads the tiles.
TD_FN bool pack_from_tiles(const WeightMatrix&, int64_t, int64_t, int64_t, uint8_t*) { return false; }

}  // namespace

#include "kernels/layout_pack_rows.h"

}  // namespace tandem::gemm_detail::avx2

#endif

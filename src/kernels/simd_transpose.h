// 8x8 transpose of 32-bit elements in eight AVX2 registers, shared by the
// packers and the row kernels. Declared for AVX2, so it inlines into AVX2
// and AVX-512 (a superset) functions alike.
#pragma once

#if defined(__x86_64__)

#include <immintrin.h>

namespace tandem::simd {

// In place: afterwards r[k] lane n = old r[n] lane k.
__attribute__((target("avx2"), always_inline)) inline void transpose_8x8_epi32(__m256i r[8]) {
  __m256i t[8], u[8];
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = _mm256_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm256_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  // u[4i + c], 128-bit lane L: rows 4i..4i+3 of column 4L + c.
  for (int i = 0; i < 2; ++i) {
    u[4 * i] = _mm256_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
    u[4 * i + 1] = _mm256_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
    u[4 * i + 2] = _mm256_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
    u[4 * i + 3] = _mm256_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
  }
  for (int c = 0; c < 4; ++c) {
    r[c] = _mm256_permute2x128_si256(u[c], u[4 + c], 0x20);
    r[4 + c] = _mm256_permute2x128_si256(u[c], u[4 + c], 0x31);
  }
}

}  // namespace tandem::simd

#endif

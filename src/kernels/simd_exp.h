// e^x on 16 (AVX-512) or 8 (AVX2) floats, shared by the attention softmax
// (arguments <= 0) and the SiLU (either sign): x = n ln2 + r, Cephes' expf
// polynomial in r, times 2^n. 0 below -87 (where 2^n would be subnormal) and
// for NaN; inf where e^x overflows. Declared for the smallest ISA each needs,
// so it inlines into any function of a superset target.
#pragma once

#if defined(__x86_64__)

#include <immintrin.h>

#include <limits>

namespace tandem::simd {

inline constexpr float kExpLog2e = 1.44269504088896341f;
inline constexpr float kExpLn2Hi = 0.693359375f, kExpLn2Lo = -2.12194440e-4f;
inline constexpr float kExpPoly[] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f,
                                     4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f};
inline constexpr float kExpMin = -87.0f;

__attribute__((target("avx512f"), always_inline)) inline __m512 exp_ps(__m512 x) {
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(kExpLog2e)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kExpLn2Hi), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kExpLn2Lo), r);
  __m512 p = _mm512_set1_ps(kExpPoly[0]);
  for (int i = 1; i < 6; ++i) p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kExpPoly[i]));
  const __m512 y = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  // scalef applies 2^n exactly, overflow to inf included.
  const __mmask16 ok = _mm512_cmp_ps_mask(x, _mm512_set1_ps(kExpMin), _CMP_GE_OQ);
  return _mm512_maskz_scalef_ps(ok, y, n);
}

__attribute__((target("avx2,fma"), always_inline)) inline __m256 exp_ps(__m256 x) {
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(kExpLog2e)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kExpLn2Hi), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kExpLn2Lo), r);
  __m256 p = _mm256_set1_ps(kExpPoly[0]);
  for (int i = 1; i < 6; ++i) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kExpPoly[i]));
  const __m256 y = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  // 2^n through the exponent bits, for n <= 127; n = 128 (x up to 88.8) as
  // 2 * 2^127, which overflows to inf on its own past FLT_MAX; beyond, inf.
  const __m256i ni = _mm256_cvtps_epi32(n);
  const __m256i big = _mm256_cmpgt_epi32(ni, _mm256_set1_epi32(127));
  const __m256i e = _mm256_slli_epi32(
      _mm256_add_epi32(_mm256_sub_epi32(ni, _mm256_and_si256(big, _mm256_set1_epi32(1))), _mm256_set1_epi32(127)), 23);
  __m256 v = _mm256_mul_ps(y, _mm256_castsi256_ps(e));
  v = _mm256_blendv_ps(v, _mm256_add_ps(v, v), _mm256_castsi256_ps(big));
  v = _mm256_blendv_ps(v, _mm256_set1_ps(std::numeric_limits<float>::infinity()),
                       _mm256_cmp_ps(x, _mm256_set1_ps(88.8f), _CMP_GT_OQ));
  return _mm256_and_ps(v, _mm256_cmp_ps(x, _mm256_set1_ps(kExpMin), _CMP_GE_OQ));
}

}  // namespace tandem::simd

#endif

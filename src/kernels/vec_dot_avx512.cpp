// AVX-512 VNNI dot products for the weight types whose products have no row
// kernels of that level (mxfp4): two 32-element blocks per 512-bit register,
// the same bits as the scalar reference.
#include "kernels/kernel_builds.h"

#if defined(__x86_64__)

#include <cmath>

#include "kernels/simd_avx512.h"

namespace tandem::dot_detail::avx512_dot {
namespace {

using namespace gemm_detail::avx512;

// MXFP4 codes of two blocks to their signed values by one in-lane shuffle,
// then signed x signed through dpbusd: |v| against y with v's sign.
TD_FN __m512i mxfp4_pair_sums(const BlockMXFP4& x0, const BlockMXFP4& x1, __m512i y) {
  const __m512i table = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kMxfp4Values)));
  const __m512i v = _mm512_shuffle_epi8(table, nibbles64(x0.qs, x1.qs));
  const __mmask64 neg = _mm512_movepi8_mask(v);
  const __m512i ys = _mm512_mask_sub_epi8(y, neg, _mm512_setzero_si512(), y);
  return _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_abs_epi8(v), ys);
}

// The scalar reference's chain (vec_dot_ref.cpp): two blocks' exact sums
// per register, reduced across lanes, then acc = fma(S, dw * da, acc) in
// block order. An odd last block meets zero activations in the upper half.
TD_FN float dot_mxfp4(int64_t n, const void* w, const void* a) {
  const auto* x = static_cast<const BlockMXFP4*>(w);
  const auto* y = static_cast<const BlockQ8_0*>(a);
  const int64_t nb = n / kQK;
  float acc = 0;
  int64_t b = 0;
  // Four blocks at a time: their sums reduced together (unpacks fold the
  // lanes of blocks b, b+2 and b+1, b+3 side by side), then four FMAs.
  for (; b + 4 <= nb; b += 4) {
    const __m512i s01 = mxfp4_pair_sums(x[b], x[b + 1],
                                        join(load256(reinterpret_cast<const uint8_t*>(y[b].qs)),
                                             load256(reinterpret_cast<const uint8_t*>(y[b + 1].qs))));
    const __m512i s23 = mxfp4_pair_sums(x[b + 2], x[b + 3],
                                        join(load256(reinterpret_cast<const uint8_t*>(y[b + 2].qs)),
                                             load256(reinterpret_cast<const uint8_t*>(y[b + 3].qs))));
    // Per 128-bit chunk k: [s01 sum, s23 sum] in lanes 0, 1 (and again in 2, 3).
    const __m512i p = _mm512_add_epi32(_mm512_unpacklo_epi32(s01, s23), _mm512_unpackhi_epi32(s01, s23));
    const __m512i q = _mm512_add_epi32(_mm512_unpacklo_epi64(p, p), _mm512_unpackhi_epi64(p, p));
    // Chunks 0+1 hold blocks b, b+2; chunks 2+3 blocks b+1, b+3.
    const __m512i r = _mm512_add_epi32(q, _mm512_shuffle_i32x4(q, q, 0xB1));
    const __m128i r02 = _mm512_castsi512_si128(r), r13 = _mm512_extracti32x4_epi32(r, 2);
    const int32_t S[4] = {_mm_cvtsi128_si32(r02), _mm_cvtsi128_si32(r13), _mm_extract_epi32(r02, 1),
                          _mm_extract_epi32(r13, 1)};
    for (int i = 0; i < 4; ++i)
      acc = std::fma(static_cast<float>(S[i]), e8m0_to_f32_half(x[b + i].e) * _cvtsh_ss(y[b + i].d), acc);
  }
  for (; b < nb; b += 2) {
    const bool pair = b + 1 < nb;
    const __m256i y0 = load256(reinterpret_cast<const uint8_t*>(y[b].qs));
    const __m512i yq = pair ? join(y0, load256(reinterpret_cast<const uint8_t*>(y[b + 1].qs)))
                            : _mm512_zextsi256_si512(y0);
    const __m512i s = mxfp4_pair_sums(x[b], x[pair ? b + 1 : b], yq);
    acc = std::fma(static_cast<float>(_mm512_mask_reduce_add_epi32(0x00FF, s)),
                   e8m0_to_f32_half(x[b].e) * _cvtsh_ss(y[b].d), acc);
    if (pair)
      acc = std::fma(static_cast<float>(_mm512_mask_reduce_add_epi32(0xFF00, s)),
                     e8m0_to_f32_half(x[b + 1].e) * _cvtsh_ss(y[b + 1].d), acc);
  }
  return acc;
}

}  // namespace
}  // namespace tandem::dot_detail::avx512_dot

namespace tandem::builds {

TypeFns avx512_dot(GgmlType w) {
  switch (w) {
    case GgmlType::MXFP4: return {.dot = dot_detail::avx512_dot::dot_mxfp4};
    default: return {};
  }
}

}  // namespace tandem::builds

#endif

// AVX-512 VNNI dot products for the weight types whose products have no row
// kernels of that level (mxfp4): two 32-element blocks per 512-bit register.
// As in the AVX2 kernels, each block's int32 sum is exact and only the float
// summation order differs from the scalar reference.
#include "kernels/kernel_builds.h"

#if defined(__x86_64__)

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

// Lanes 0-7 carry block b's sums, 8-15 block b+1's, each scaled by its
// block's e8m0 scale times the activation block's d.
TD_FN float dot_mxfp4(int64_t n, const void* w, const void* a) {
  const auto* x = static_cast<const BlockMXFP4*>(w);
  const auto* y = static_cast<const BlockQ8_0*>(a);
  const int64_t nb = n / kQK;
  __m512 acc = _mm512_setzero_ps();
  int64_t b = 0;
  for (; b + 2 <= nb; b += 2) {
    const __m512i yq = join(load256(reinterpret_cast<const uint8_t*>(y[b].qs)),
                            load256(reinterpret_cast<const uint8_t*>(y[b + 1].qs)));
    const __m512i s = mxfp4_pair_sums(x[b], x[b + 1], yq);
    const __m512 d = _mm512_mask_blend_ps(0xFF00, _mm512_set1_ps(e8m0_to_f32_half(x[b].e) * _cvtsh_ss(y[b].d)),
                                          _mm512_set1_ps(e8m0_to_f32_half(x[b + 1].e) * _cvtsh_ss(y[b + 1].d)));
    acc = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(s), acc);
  }
  if (b < nb) {
    // The last block alone: its activations in the low half, zeros above.
    const __m512i yq = _mm512_castsi256_si512(load256(reinterpret_cast<const uint8_t*>(y[b].qs)));
    const __m512i s = mxfp4_pair_sums(x[b], x[b], _mm512_maskz_mov_epi8(0xFFFFFFFFull, yq));
    const __m512 d = _mm512_maskz_mov_ps(0x00FF, _mm512_set1_ps(e8m0_to_f32_half(x[b].e) * _cvtsh_ss(y[b].d)));
    acc = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(s), acc);
  }
  return _mm512_reduce_add_ps(acc);
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

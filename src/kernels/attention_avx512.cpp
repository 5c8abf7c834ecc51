// AVX-512 (F/BW/VL) attention kernels: attention_chunk.h over 16-lane
// vectors, masked loads for row tails, F16C-style conversion of f16 K/V;
// a second build of it with VNNI's integer dot products.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "kernels/attention_impl.h"
#include "kernels/kernel_builds.h"
#include "kernels/simd_exp.h"

#if defined(__x86_64__)

// GCC 12's AVX-512 intrinsics build some results from a deliberately
// uninitialized vector; -Wuninitialized reports it once inlined here.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <immintrin.h>

namespace tandem::attn_detail {
namespace avx512 {

#define TD_FN __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl"))) inline

struct Ops {
  using V = __m512;
  static constexpr int W = 16, QR = 4, QK = 4, QKQ = 2, PR = 8, PD = 2, PRQ = 4, PDQ = 4;
  TD_FN static __mmask16 lanes_below(int32_t n) { return static_cast<__mmask16>((1u << n) - 1); }
  TD_FN static V zero() { return _mm512_setzero_ps(); }
  TD_FN static V bcast(float f) { return _mm512_set1_ps(f); }
  TD_FN static V load(const float* p) { return _mm512_loadu_ps(p); }
  TD_FN static V load(const uint16_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  TD_FN static V load_part(const float* p, int32_t n) { return _mm512_maskz_loadu_ps(lanes_below(n), p); }
  TD_FN static V load_part(const uint16_t* p, int32_t n) {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(lanes_below(n), p));
  }
  TD_FN static void store(float* p, V v) { _mm512_storeu_ps(p, v); }
  TD_FN static void store_part(float* p, V v, int32_t n) { _mm512_mask_storeu_ps(p, lanes_below(n), v); }
  TD_FN static V add(V a, V b) { return _mm512_add_ps(a, b); }
  TD_FN static V sub(V a, V b) { return _mm512_sub_ps(a, b); }
  TD_FN static V mul(V a, V b) { return _mm512_mul_ps(a, b); }
  TD_FN static V abs(V a) { return _mm512_abs_ps(a); }
  TD_FN static V fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  TD_FN static float reduce(V v) { return _mm512_reduce_add_ps(v); }
  // maxps returns its second operand unless the first is greater (NaN: never).
  TD_FN static V max(V x, V m) { return _mm512_max_ps(x, m); }
  TD_FN static float reduce_max(V v) { return _mm512_reduce_max_ps(v); }
  TD_FN static V exp(V x) { return simd::exp_ps(x); }  // kernels/simd_exp.h
  // Quantized K/V without VNNI: pmaddubsw pairs summed by pmaddwd. Signed
  // q8_0 bytes go in as |k| with their signs moved onto the query's bytes
  // (AVX-512 has no psignb: a masked negation), so no pair can saturate
  // (2 * 128 * 127 < 32768) and no offset is needed.
  using I = __m512i;
  using KW = __m512i;
  struct KS {
    __m512i abs;
    __mmask64 negative;
  };
  static constexpr int32_t kS8Bias = 0;
  TD_FN static I ibcast(int32_t x) { return _mm512_set1_epi32(x); }
  TD_FN static I iadd(I a, I b) { return _mm512_add_epi32(a, b); }
  TD_FN static int32_t ireduce(I x) { return _mm512_reduce_add_epi32(x); }
  TD_FN static V to_float(I x) { return _mm512_cvtepi32_ps(x); }
  TD_FN static I round_int(V x) { return _mm512_cvtps_epi32(x); }
  TD_FN static void store_i8(int8_t* p, I x) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm512_cvtepi32_epi8(x));
  }
  TD_FN static KW load_words(const uint8_t* p) { return _mm512_loadu_si512(p); }
  TD_FN static KW nibbles_lo(KW w) { return _mm512_and_si512(w, _mm512_set1_epi8(15)); }
  TD_FN static KW nibbles_hi(KW w) { return _mm512_and_si512(_mm512_srli_epi16(w, 4), _mm512_set1_epi8(15)); }
  TD_FN static KS signed_words(KW w) { return {_mm512_abs_epi8(w), _mm512_movepi8_mask(w)}; }
  TD_FN static I pairs(I acc, __m512i u, __m512i s) {
    return _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(u, s), _mm512_set1_epi16(1)));
  }
  TD_FN static I dot_u8(I acc, KW k, int32_t q) { return pairs(acc, k, _mm512_set1_epi32(q)); }
  TD_FN static I dot_s8(I acc, KS k, int32_t q) {
    const __m512i qv = _mm512_set1_epi32(q);
    return pairs(acc, k.abs, _mm512_mask_sub_epi8(qv, k.negative, _mm512_setzero_si512(), qv));
  }
};

#include "kernels/attention_chunk.h"
#undef TD_FN

}  // namespace avx512

// The same kernel with AVX512-VNNI's vpdpbusd for quantized K/V: one
// instruction per 4 dimensions of 16 keys and a query row, or 4 slots of 16
// value dimensions and a row's weights. Its unsigned operand takes q8_0
// bytes offset by 128 (the sign bit flipped).
namespace avx512_vnni {

#define TD_FN __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni"))) inline

struct Ops : avx512::Ops {
  using KS = __m512i;
  static constexpr int32_t kS8Bias = 128;
  TD_FN static KS signed_words(KW w) { return _mm512_xor_si512(w, _mm512_set1_epi8(static_cast<char>(0x80))); }
  TD_FN static I dot_u8(I acc, KW k, int32_t q) { return _mm512_dpbusd_epi32(acc, k, _mm512_set1_epi32(q)); }
  TD_FN static I dot_s8(I acc, KS k, int32_t q) { return _mm512_dpbusd_epi32(acc, k, _mm512_set1_epi32(q)); }
};

#include "kernels/attention_chunk.h"
#undef TD_FN

}  // namespace avx512_vnni

}  // namespace tandem::attn_detail

namespace tandem::builds {
LevelFns avx512_attention() { return {.attention_chunk = attn_detail::avx512::chunk_kernel}; }
// The same with vpdpbusd for quantized keys.
LevelFns avx512_vnni_attention() { return {.attention_chunk = attn_detail::avx512_vnni::chunk_kernel}; }
}  // namespace tandem::builds

#endif

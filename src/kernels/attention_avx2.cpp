// AVX2 + FMA + F16C attention kernel: attention_chunk.h over 8-lane vectors.
// Every function carries its target attribute, as in vec_dot_avx2.cpp; the
// dispatcher calls this only after CPUID allows it.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "kernels/attention_impl.h"
#include "kernels/kernel_builds.h"
#include "kernels/simd_exp.h"

#if defined(__x86_64__)
#include <immintrin.h>

namespace tandem::attn_detail {
namespace avx2 {

#define TD_FN __attribute__((target("avx2,fma,f16c"))) inline

struct Ops {
  using V = __m256;
  static constexpr int W = 8, QR = 2, QK = 4, QKQ = 2, PR = 2, PD = 4, PRQ = 2, PDQ = 2;
  TD_FN static __m256i lanes_below(int32_t n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  }
  TD_FN static V zero() { return _mm256_setzero_ps(); }
  TD_FN static V bcast(float f) { return _mm256_set1_ps(f); }
  TD_FN static V load(const float* p) { return _mm256_loadu_ps(p); }
  TD_FN static V load(const uint16_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
  TD_FN static V load_part(const float* p, int32_t n) { return _mm256_maskload_ps(p, lanes_below(n)); }
  TD_FN static V load_part(const uint16_t* p, int32_t n) {
    uint16_t tmp[8] = {};
    std::memcpy(tmp, p, size_t(n) * sizeof(uint16_t));
    return load(tmp);
  }
  TD_FN static void store(float* p, V v) { _mm256_storeu_ps(p, v); }
  TD_FN static void store_part(float* p, V v, int32_t n) { _mm256_maskstore_ps(p, lanes_below(n), v); }
  TD_FN static V add(V a, V b) { return _mm256_add_ps(a, b); }
  TD_FN static V sub(V a, V b) { return _mm256_sub_ps(a, b); }
  TD_FN static V mul(V a, V b) { return _mm256_mul_ps(a, b); }
  TD_FN static V abs(V a) { return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), a); }
  TD_FN static V fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  TD_FN static float reduce(V v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  // maxps returns its second operand unless the first is greater (NaN: never).
  TD_FN static V max(V x, V m) { return _mm256_max_ps(x, m); }
  TD_FN static float reduce_max(V v) {
    const __m128 h = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    const __m128 q = _mm_max_ps(h, _mm_movehl_ps(h, h));
    return _mm_cvtss_f32(_mm_max_ss(q, _mm_movehdup_ps(q)));
  }
  TD_FN static V exp(V x) { return simd::exp_ps(x); }  // kernels/simd_exp.h
  // Quantized K/V (no VNNI here): pmaddubsw pairs, summed by pmaddwd. Signed
  // q8_0 bytes go in as |k| with their signs moved onto the query's (or the
  // weights') bytes, so no pair can saturate (2 * 128 * 127 < 32768) and no
  // offset is needed.
  using I = __m256i;
  using KW = __m256i;
  struct KS {
    __m256i abs, sign;
  };
  static constexpr int32_t kS8Bias = 0;
  TD_FN static I ibcast(int32_t x) { return _mm256_set1_epi32(x); }
  TD_FN static I iadd(I a, I b) { return _mm256_add_epi32(a, b); }
  TD_FN static int32_t ireduce(I x) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(x), _mm256_extracti128_si256(x, 1));
    s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
    return _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32(s, 1)));
  }
  TD_FN static V to_float(I x) { return _mm256_cvtepi32_ps(x); }
  TD_FN static I round_int(V x) { return _mm256_cvtps_epi32(x); }
  TD_FN static void store_i8(int8_t* p, I x) {
    const __m128i w = _mm_packs_epi32(_mm256_castsi256_si128(x), _mm256_extracti128_si256(x, 1));
    _mm_storel_epi64(reinterpret_cast<__m128i*>(p), _mm_packs_epi16(w, w));
  }
  TD_FN static KW load_words(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
  TD_FN static KW nibbles_lo(KW w) { return _mm256_and_si256(w, _mm256_set1_epi8(15)); }
  TD_FN static KW nibbles_hi(KW w) { return _mm256_and_si256(_mm256_srli_epi16(w, 4), _mm256_set1_epi8(15)); }
  TD_FN static KS signed_words(KW w) { return {_mm256_abs_epi8(w), w}; }
  TD_FN static I pairs(I acc, __m256i u, __m256i s) {
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
  }
  TD_FN static I dot_u8(I acc, KW k, int32_t q) { return pairs(acc, k, _mm256_set1_epi32(q)); }
  TD_FN static I dot_s8(I acc, KS k, int32_t q) { return pairs(acc, k.abs, _mm256_sign_epi8(_mm256_set1_epi32(q), k.sign)); }
};

#include "kernels/attention_chunk.h"
#undef TD_FN

}  // namespace avx2

}  // namespace tandem::attn_detail

namespace tandem::builds {
LevelFns avx2_attention() { return {.attention_chunk = attn_detail::avx2::chunk_kernel}; }
}  // namespace tandem::builds

#endif

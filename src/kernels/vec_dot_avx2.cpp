// AVX2 + FMA + F16C kernels (optionally AVX-VNNI for the 32-element formats).
// Every function carries its own target attribute: the library is built for
// baseline x86-64 and these run only after CPUID says they may.
#include "kernels/kernel_builds.h"

#if defined(__x86_64__)

#include <immintrin.h>

#include <cmath>
#include <cstring>
#include <type_traits>

#include "quant/quant_blocks.h"

namespace tandem::dot_detail {
#define TD_AVX2_VARIANTS_BODY "kernels/vec_dot_avx2_q32.h"
#include "kernels/simd_avx2_variants.h"
#undef TD_AVX2_VARIANTS_BODY

namespace avx2_plain {

#define TD_FN __attribute__((target("avx2,fma,f16c"))) inline

TD_FN __m256i load32(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }

// Unsigned quants (< 64) times q8, weighted per 16-element half, into int32.
TD_FN __m256i scaled_dot(__m256i q, const int8_t* y, __m256i scales16) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(q, load32(y)), scales16);
}

// bf16 is the top half of an f32, so widening is a 16-bit shift.
TD_FN float bf16_value(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Loads of each float weight type: 8 elements as floats, and one.
struct LoadF32 {
  using T = float;
  TD_FN static __m256 vec(const float* p) { return _mm256_loadu_ps(p); }
  TD_FN static float one(float v) { return v; }
};
struct LoadF16 {
  using T = uint16_t;
  TD_FN static __m256 vec(const uint16_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  TD_FN static float one(uint16_t h) { return _cvtsh_ss(h); }
};
struct LoadBF16 {
  using T = uint16_t;
  TD_FN static __m256 vec(const uint16_t* p) {
    const __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
  }
  TD_FN static float one(uint16_t h) { return bf16_value(h); }
};

// 4 independent accumulators over 32 elements per step, then 8 at a time,
// then the rest one by one.
template <typename L>
TD_FN float float_dot(int64_t n, const void* w, const void* a) {
  const auto* x = static_cast<const typename L::T*>(w);
  const auto* y = static_cast<const typename L::T*>(a);
  __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
  int64_t i = 0;
  for (; i + 32 <= n; i += 32)
    for (int k = 0; k < 4; ++k) acc[k] = _mm256_fmadd_ps(L::vec(x + i + 8 * k), L::vec(y + i + 8 * k), acc[k]);
  for (; i + 8 <= n; i += 8) acc[0] = _mm256_fmadd_ps(L::vec(x + i), L::vec(y + i), acc[0]);
  float sum = hsum_ps(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
  for (; i < n; ++i) sum += L::one(x[i]) * L::one(y[i]);
  return sum;
}

// The K-quants keep the integer sums of one super-block in an int32 vector
// and scale it into a float accumulator once per super-block. Signed quants
// are handled as unsigned (q + offset) with the offset's share,
// offset * sum(scale * bsum), removed in integers; the mins' term
// dmin * sum(min * bsum) goes to its own float accumulator.

// int16 lanes: scale 2p for the first 16 products of a 32-quant group and
// scale 2p+1 for the last 16, from 16 int16 scales in `sc16`.
TD_FN __m256i pair_scales(__m256i sc16, int p) {
  const __m256i half = p < 4 ? _mm256_permute2x128_si256(sc16, sc16, 0x00) : _mm256_permute2x128_si256(sc16, sc16, 0x11);
  const int k = p % 4;
  const __m256i pick = _mm256_set_m128i(_mm_set1_epi16(static_cast<int16_t>(((4 * k + 3) << 8) | (4 * k + 2))),
                                        _mm_set1_epi16(static_cast<int16_t>(((4 * k + 1) << 8) | (4 * k))));
  return _mm256_shuffle_epi8(half, pick);
}

// int16 scale e (0..7) of `sc8` (8 int16 in both 128-bit lanes), in every lane.
TD_FN __m256i broadcast_scale(__m256i sc8, int e) {
  return _mm256_shuffle_epi8(sc8, _mm256_set1_epi16(static_cast<int16_t>(((2 * e + 1) << 8) | (2 * e))));
}

TD_FN __m256i load_bsums(const BlockQ8K& y) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y.bsums)); }

TD_FN float dot_q2_k(int64_t n, const void* w, const void* a) {
  const auto* xs = static_cast<const BlockQ2K*>(w);
  const auto* ys = static_cast<const BlockQ8K*>(a);
  const __m256i m3 = _mm256_set1_epi8(3);
  const __m128i m4 = _mm_set1_epi8(0x0F);
  __m256 acc = _mm256_setzero_ps(), acc_min = _mm256_setzero_ps();
  for (int64_t b = 0; b < n / kQKK; ++b) {
    const BlockQ2K& x = xs[b];
    const BlockQ8K& y = ys[b];
    const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x.scales));
    const __m256i sc16 = _mm256_cvtepu8_epi16(_mm_and_si128(packed, m4));
    const __m256i min16 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(packed, 4), m4));
    __m256i sums = _mm256_setzero_si256();
    for (int c = 0; c < 2; ++c) {
      const __m256i q = load32(x.qs + 32 * c);
      for (int j = 0; j < 4; ++j) {
        const __m256i qj = _mm256_and_si256(_mm256_srli_epi16(q, 2 * j), m3);
        sums = _mm256_add_epi32(sums, scaled_dot(qj, y.qs + 128 * c + 32 * j, pair_scales(sc16, 4 * c + j)));
      }
    }
    const __m256i mins = _mm256_madd_epi16(min16, load_bsums(y));
    acc = _mm256_fmadd_ps(_mm256_set1_ps(y.d * _cvtsh_ss(x.d)), _mm256_cvtepi32_ps(sums), acc);
    acc_min = _mm256_fmadd_ps(_mm256_set1_ps(y.d * _cvtsh_ss(x.dmin)), _mm256_cvtepi32_ps(mins), acc_min);
  }
  return hsum_ps(acc) - hsum_ps(acc_min);
}

TD_FN float dot_q3_k(int64_t n, const void* w, const void* a) {
  const auto* xs = static_cast<const BlockQ3K*>(w);
  const auto* ys = static_cast<const BlockQ8K*>(a);
  const __m256i m3 = _mm256_set1_epi8(3);
  const __m256i one = _mm256_set1_epi8(1);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t b = 0; b < n / kQKK; ++b) {
    const BlockQ3K& x = xs[b];
    const BlockQ8K& y = ys[b];
    uint32_t sw[4];
    k3_scale_words(x.scales, sw);
    const __m128i sc8 = _mm_sub_epi8(_mm_setr_epi32(static_cast<int>(sw[0]), static_cast<int>(sw[1]),
                                                    static_cast<int>(sw[2]), static_cast<int>(sw[3])),
                                     _mm_set1_epi8(32));
    const __m256i sc16 = _mm256_cvtepi8_epi16(sc8);
    const __m256i hm = load32(x.hmask);
    __m256i sums = _mm256_setzero_si256();
    for (int c = 0; c < 2; ++c) {
      const __m256i q = load32(x.qs + 32 * c);
      for (int j = 0; j < 4; ++j) {
        // Stored q2 + 4*h stands for q2 + 4*h - 4.
        const __m256i h = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hm, 4 * c + j), one), 2);
        const __m256i qj = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 2 * j), m3), h);
        sums = _mm256_add_epi32(sums, scaled_dot(qj, y.qs + 128 * c + 32 * j, pair_scales(sc16, 4 * c + j)));
      }
    }
    sums = _mm256_sub_epi32(sums, _mm256_slli_epi32(_mm256_madd_epi16(sc16, load_bsums(y)), 2));
    acc = _mm256_fmadd_ps(_mm256_set1_ps(_cvtsh_ss(x.d) * y.d), _mm256_cvtepi32_ps(sums), acc);
  }
  return hsum_ps(acc);
}

template <bool kFifthBit, typename Block>
TD_FN float dot_q45_k(int64_t n, const Block* xs, const BlockQ8K* ys) {
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  const __m256i one = _mm256_set1_epi8(1);
  __m256 acc = _mm256_setzero_ps();
  __m128 acc_min = _mm_setzero_ps();
  for (int64_t b = 0; b < n / kQKK; ++b) {
    const Block& x = xs[b];
    const BlockQ8K& y = ys[b];
    uint32_t sm[4];
    k4_unpack_words(x.scales, sm);
    const __m256i sm16 = _mm256_cvtepu8_epi16(_mm_setr_epi32(static_cast<int>(sm[0]), static_cast<int>(sm[1]),
                                                             static_cast<int>(sm[2]), static_cast<int>(sm[3])));
    const __m256i sc8 = _mm256_permute2x128_si256(sm16, sm16, 0x00);
    // min s pairs with bsums 2s and 2s+1 (its 32 quants).
    const __m128i bsum_pairs = _mm_hadd_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(y.bsums)),
                                              _mm_loadu_si128(reinterpret_cast<const __m128i*>(y.bsums + 8)));
    const __m128i mins = _mm_madd_epi16(_mm256_extracti128_si256(sm16, 1), bsum_pairs);
    __m256i sums = _mm256_setzero_si256();
    for (int c = 0; c < 4; ++c) {
      const __m256i q = load32(x.qs + 32 * c);
      __m256i lo = _mm256_and_si256(q, m4);
      __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
      if constexpr (kFifthBit) {
        const __m256i qh = load32(x.qh);
        lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * c), one), 4));
        hi = _mm256_or_si256(hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * c + 1), one), 4));
      }
      sums = _mm256_add_epi32(sums, scaled_dot(lo, y.qs + 64 * c, broadcast_scale(sc8, 2 * c)));
      sums = _mm256_add_epi32(sums, scaled_dot(hi, y.qs + 64 * c + 32, broadcast_scale(sc8, 2 * c + 1)));
    }
    acc = _mm256_fmadd_ps(_mm256_set1_ps(y.d * _cvtsh_ss(x.d)), _mm256_cvtepi32_ps(sums), acc);
    acc_min = _mm_fmadd_ps(_mm_set1_ps(y.d * _cvtsh_ss(x.dmin)), _mm_cvtepi32_ps(mins), acc_min);
  }
  __m128 m = _mm_add_ps(acc_min, _mm_movehl_ps(acc_min, acc_min));
  m = _mm_add_ss(m, _mm_movehdup_ps(m));
  return hsum_ps(acc) - _mm_cvtss_f32(m);
}

TD_FN float dot_q4_k(int64_t n, const void* w, const void* a) {
  return dot_q45_k<false>(n, static_cast<const BlockQ4K*>(w), static_cast<const BlockQ8K*>(a));
}

TD_FN float dot_q5_k(int64_t n, const void* w, const void* a) {
  return dot_q45_k<true>(n, static_cast<const BlockQ5K*>(w), static_cast<const BlockQ8K*>(a));
}

TD_FN float dot_q6_k(int64_t n, const void* w, const void* a) {
  const auto* xs = static_cast<const BlockQ6K*>(w);
  const auto* ys = static_cast<const BlockQ8K*>(a);
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  const __m256i m3 = _mm256_set1_epi8(3);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t b = 0; b < n / kQKK; ++b) {
    const BlockQ6K& x = xs[b];
    const BlockQ8K& y = ys[b];
    const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x.scales)));
    __m256i sums = _mm256_setzero_si256();
    for (int h = 0; h < 2; ++h) {
      const __m256i ql0 = load32(x.ql + 64 * h);
      const __m256i ql1 = load32(x.ql + 64 * h + 32);
      const __m256i qh = load32(x.qh + 32 * h);
      const __m256i nib[4] = {_mm256_and_si256(ql0, m4), _mm256_and_si256(ql1, m4),
                              _mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4),
                              _mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4)};
      for (int k = 0; k < 4; ++k) {
        const __m256i top = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * k), m3), 4);
        const __m256i q = _mm256_or_si256(nib[k], top);  // stored value + 32
        sums = _mm256_add_epi32(sums, scaled_dot(q, y.qs + 128 * h + 32 * k, pair_scales(sc16, 4 * h + k)));
      }
    }
    sums = _mm256_sub_epi32(sums, _mm256_slli_epi32(_mm256_madd_epi16(sc16, load_bsums(y)), 5));
    acc = _mm256_fmadd_ps(_mm256_set1_ps(_cvtsh_ss(x.d) * y.d), _mm256_cvtepi32_ps(sums), acc);
  }
  return hsum_ps(acc);
}

#undef TD_FN

}  // namespace avx2_plain

}  // namespace tandem::dot_detail

namespace tandem::builds {

using namespace dot_detail;

TypeFns avx2_dot(GgmlType w) {
  switch (w) {
    case GgmlType::F32: return {.dot = avx2_plain::float_dot<avx2_plain::LoadF32>};
    case GgmlType::F16: return {.dot = avx2_plain::float_dot<avx2_plain::LoadF16>};
    case GgmlType::BF16: return {.dot = avx2_plain::float_dot<avx2_plain::LoadBF16>};
    case GgmlType::Q4_0: return {.dot = avx2_plain::dot_q4_0};
    case GgmlType::Q4_1: return {.dot = avx2_plain::dot_q4_1};
    case GgmlType::Q5_0: return {.dot = avx2_plain::dot_q5_0};
    case GgmlType::Q5_1: return {.dot = avx2_plain::dot_q5_1};
    case GgmlType::Q8_0: return {.dot = avx2_plain::dot_q8_0};
    case GgmlType::MXFP4: return {.dot = avx2_plain::dot_mxfp4};
    case GgmlType::Q2_K: return {.dot = avx2_plain::dot_q2_k};
    case GgmlType::Q3_K: return {.dot = avx2_plain::dot_q3_k};
    case GgmlType::Q4_K: return {.dot = avx2_plain::dot_q4_k};
    case GgmlType::Q5_K: return {.dot = avx2_plain::dot_q5_k};
    case GgmlType::Q6_K: return {.dot = avx2_plain::dot_q6_k};
    default: return {};
  }
}

// dpbusd changes the 32-element blocks' sums only.
TypeFns avx2_vnni_dot(GgmlType w) {
  switch (w) {
    case GgmlType::Q4_0: return {.dot = avx2_vnni::dot_q4_0};
    case GgmlType::Q4_1: return {.dot = avx2_vnni::dot_q4_1};
    case GgmlType::Q5_0: return {.dot = avx2_vnni::dot_q5_0};
    case GgmlType::Q5_1: return {.dot = avx2_vnni::dot_q5_1};
    case GgmlType::Q8_0: return {.dot = avx2_vnni::dot_q8_0};
    case GgmlType::MXFP4: return {.dot = avx2_vnni::dot_mxfp4};
    default: return {};
  }
}

}  // namespace tandem::builds

#endif

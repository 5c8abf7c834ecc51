// AVX-512 (F/BW/VL) kernels, with AVX512-VNNI for the 32-element formats and
// AVX512-BF16 for bf16 where the CPU has them. Like vec_dot_avx2.cpp, every
// function carries its own target attribute so the library stays baseline
// x86-64; the dispatcher calls these only after CPUID allows it.
#include "kernels/vec_dot_impl.h"

#if defined(__x86_64__)

// GCC 12's AVX-512 intrinsics build some results from a deliberately
// uninitialized vector (the "__Y = __Y" idiom), which -Wuninitialized then
// reports once inlined here. The values are never read.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <immintrin.h>

#include <cstring>

#include "core/quant_blocks.h"

#define TD_AVX512_BASE "avx2,fma,f16c,avx512f,avx512bw,avx512vl"

namespace tandem::dot_detail {
namespace avx512_plain {
#define TD_TARGET TD_AVX512_BASE
#define TD_VNNI 0
#include "kernels/vec_dot_avx512_q32.h"
#undef TD_VNNI
#undef TD_TARGET
}  // namespace avx512_plain

namespace avx512_vnni {
#define TD_TARGET TD_AVX512_BASE ",avx512vnni"
#define TD_VNNI 1
#include "kernels/vec_dot_avx512_q32.h"
#undef TD_VNNI
#undef TD_TARGET
}  // namespace avx512_vnni

namespace avx512_plain {

#define TD_FN __attribute__((target(TD_AVX512_BASE))) inline

// Lanes [0, rest) of a 16- or 32-lane vector, for the tail of a row.
TD_FN __mmask16 tail16(int64_t rest) { return static_cast<__mmask16>((1u << rest) - 1); }
TD_FN __mmask32 tail32(int64_t rest) { return static_cast<__mmask32>((1ull << rest) - 1); }

// Shared loop of the float kernels: 4 independent accumulators over 64
// elements per step, then 16 at a time, then one masked step for the rest.
template <typename Load>
TD_FN float float_dot(int64_t n, const void* w, const void* a, Load load) {
  __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
  int64_t i = 0;
  for (; i + 64 <= n; i += 64)
    for (int k = 0; k < 4; ++k)
      acc[k] = _mm512_fmadd_ps(load(w, i + 16 * k, 0xFFFF), load(a, i + 16 * k, 0xFFFF), acc[k]);
  for (; i + 16 <= n; i += 16) acc[0] = _mm512_fmadd_ps(load(w, i, 0xFFFF), load(a, i, 0xFFFF), acc[0]);
  if (i < n) acc[1] = _mm512_fmadd_ps(load(w, i, tail16(n - i)), load(a, i, tail16(n - i)), acc[1]);
  return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3])));
}

struct LoadF32 {
  TD_FN __m512 operator()(const void* p, int64_t i, __mmask16 m) const {
    return _mm512_maskz_loadu_ps(m, static_cast<const float*>(p) + i);
  }
};
struct LoadF16 {
  TD_FN __m512 operator()(const void* p, int64_t i, __mmask16 m) const {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, static_cast<const uint16_t*>(p) + i));
  }
};
// bf16 is the top half of an f32, so widening is a 16-bit shift.
struct LoadBF16 {
  TD_FN __m512 operator()(const void* p, int64_t i, __mmask16 m) const {
    const __m256i h = _mm256_maskz_loadu_epi16(m, static_cast<const uint16_t*>(p) + i);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
};

TD_FN float dot_f32(int64_t n, const void* w, const void* a) { return float_dot(n, w, a, LoadF32{}); }
TD_FN float dot_f16(int64_t n, const void* w, const void* a) { return float_dot(n, w, a, LoadF16{}); }
TD_FN float dot_bf16(int64_t n, const void* w, const void* a) { return float_dot(n, w, a, LoadBF16{}); }

TD_FN __m512i load64(const void* p) { return _mm512_loadu_si512(p); }
TD_FN __m256i load32(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }

// Unsigned quants (< 64) times 64 q8 values, each product pair weighted by
// its int16 lane of `scales16`, into int32 lanes.
TD_FN __m512i scaled_dot(__m512i q, const int8_t* y, __m512i scales16) {
  return _mm512_madd_epi16(_mm512_maddubs_epi16(q, load64(y)), scales16);
}

// As in vec_dot_avx2.cpp: one int32 vector of integer sums per super-block,
// scaled into float accumulators; offsets and mins via bsums.

// int16 lane i = i / 16 and i / 8: spreads 2 (or 4) consecutive int16
// scales over the maddubs outputs of 32 (or 16) quants each.
alignas(64) constexpr int16_t kSpread2[32] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                                              1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};
alignas(64) constexpr int16_t kSpread4[32] = {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                              2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3};

TD_FN __m512i spread_scales(const int16_t* pattern, int first, __m512i scales16) {
  return _mm512_permutexvar_epi16(_mm512_add_epi16(_mm512_load_si512(pattern), _mm512_set1_epi16(static_cast<int16_t>(first))),
                                  scales16);
}

TD_FN float hsum128(__m128 v) {
  v = _mm_add_ps(v, _mm_movehl_ps(v, v));
  v = _mm_add_ss(v, _mm_movehdup_ps(v));
  return _mm_cvtss_f32(v);
}

template <bool kFifthBit, typename Block>
TD_FN float dot_q45_k(int64_t n, const Block* xs, const BlockQ8K* ys) {
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  const __m256i one = _mm256_set1_epi8(1);
  __m512 acc = _mm512_setzero_ps();
  __m128 acc_min = _mm_setzero_ps();
  for (int64_t b = 0; b < n / kQKK; ++b) {
    const Block& x = xs[b];
    const BlockQ8K& y = ys[b];
    uint32_t sm[4];
    k4_unpack_words(x.scales, sm);
    const __m256i sm16 = _mm256_cvtepu8_epi16(_mm_setr_epi32(static_cast<int>(sm[0]), static_cast<int>(sm[1]),
                                                             static_cast<int>(sm[2]), static_cast<int>(sm[3])));
    const __m512i sc512 = _mm512_zextsi256_si512(sm16);
    // min s pairs with bsums 2s and 2s+1 (its 32 quants).
    const __m128i bsum_pairs = _mm_hadd_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(y.bsums)),
                                              _mm_loadu_si128(reinterpret_cast<const __m128i*>(y.bsums + 8)));
    const __m128i mins = _mm_madd_epi16(_mm256_extracti128_si256(sm16, 1), bsum_pairs);
    __m512i sums = _mm512_setzero_si512();
    for (int c = 0; c < 4; ++c) {
      const __m256i q = load32(x.qs + 32 * c);
      __m256i lo = _mm256_and_si256(q, m4);
      __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
      if constexpr (kFifthBit) {
        const __m256i qh = load32(x.qh);
        lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * c), one), 4));
        hi = _mm256_or_si256(hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * c + 1), one), 4));
      }
      sums = _mm512_add_epi32(sums, scaled_dot(pair(lo, hi), y.qs + 64 * c, spread_scales(kSpread2, 2 * c, sc512)));
    }
    acc = _mm512_fmadd_ps(_mm512_set1_ps(y.d * _cvtsh_ss(x.d)), _mm512_cvtepi32_ps(sums), acc);
    acc_min = _mm_fmadd_ps(_mm_set1_ps(y.d * _cvtsh_ss(x.dmin)), _mm_cvtepi32_ps(mins), acc_min);
  }
  return _mm512_reduce_add_ps(acc) - hsum128(acc_min);
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
  const __m512i m4 = _mm512_set1_epi8(0x0F);
  const __m512i m3 = _mm512_set1_epi8(3);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t b = 0; b < n / kQKK; ++b) {
    const BlockQ6K& x = xs[b];
    const BlockQ8K& y = ys[b];
    const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x.scales)));
    const __m512i sc512 = _mm512_zextsi256_si512(sc16);
    __m512i sums = _mm512_setzero_si512();
    for (int h = 0; h < 2; ++h) {
      // Quarters 0|1 of this half come from the low nibbles of ql and bits
      // 0-1 | 2-3 of qh; quarters 2|3 from the high nibbles and bits 4-5 | 6-7.
      const __m512i ql = load64(x.ql + 64 * h);
      const __m256i qh256 = load32(x.qh + 32 * h);
      const __m512i qh = pair(qh256, _mm256_srli_epi16(qh256, 2));
      const __m512i q01 =
          _mm512_or_si512(_mm512_and_si512(ql, m4), _mm512_slli_epi16(_mm512_and_si512(qh, m3), 4));
      const __m512i q23 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), m4),
                                          _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(qh, 4), m3), 4));
      // Quants are the stored value + 32; the offset comes out below.
      sums = _mm512_add_epi32(sums, scaled_dot(q01, y.qs + 128 * h, spread_scales(kSpread4, 8 * h, sc512)));
      sums = _mm512_add_epi32(sums, scaled_dot(q23, y.qs + 128 * h + 64, spread_scales(kSpread4, 8 * h + 4, sc512)));
    }
    const __m256i offset =
        _mm256_slli_epi32(_mm256_madd_epi16(sc16, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y.bsums))), 5);
    const __m256i total = _mm256_sub_epi32(
        _mm256_add_epi32(_mm512_castsi512_si256(sums), _mm512_extracti64x4_epi64(sums, 1)), offset);
    acc = _mm256_fmadd_ps(_mm256_set1_ps(_cvtsh_ss(x.d) * y.d), _mm256_cvtepi32_ps(total), acc);
  }
  const __m128 h = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
  return hsum128(h);
}

#undef TD_FN

}  // namespace avx512_plain

namespace avx512_bf16 {

#define TD_FN __attribute__((target(TD_AVX512_BASE ",avx512bf16"))) inline

// dpbf16 multiplies bf16 pairs and adds both products into f32 lanes, so no
// widening is needed. It flushes denormals, which only matters for values
// below 2^-126 that no model activation or weight carries meaningfully.
TD_FN __m512bh load_bf16x32(const uint16_t* p, __mmask32 m) {
  return reinterpret_cast<__m512bh>(_mm512_maskz_loadu_epi16(m, p));
}

TD_FN float dot_bf16(int64_t n, const void* w, const void* a) {
  const uint16_t* x = static_cast<const uint16_t*>(w);
  const uint16_t* y = static_cast<const uint16_t*>(a);
  __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
  int64_t i = 0;
  for (; i + 128 <= n; i += 128)
    for (int k = 0; k < 4; ++k)
      acc[k] = _mm512_dpbf16_ps(acc[k], load_bf16x32(x + i + 32 * k, ~0u), load_bf16x32(y + i + 32 * k, ~0u));
  for (; i + 32 <= n; i += 32) acc[0] = _mm512_dpbf16_ps(acc[0], load_bf16x32(x + i, ~0u), load_bf16x32(y + i, ~0u));
  if (i < n) {
    const __mmask32 m = static_cast<__mmask32>((1ull << (n - i)) - 1);
    acc[1] = _mm512_dpbf16_ps(acc[1], load_bf16x32(x + i, m), load_bf16x32(y + i, m));
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3])));
}

#undef TD_FN

}  // namespace avx512_bf16

VecDotFn avx512_fn(GgmlType w, bool vnni, bool bf16) {
  switch (w) {
    case GgmlType::F32: return avx512_plain::dot_f32;
    case GgmlType::F16: return avx512_plain::dot_f16;
    case GgmlType::BF16: return bf16 ? avx512_bf16::dot_bf16 : avx512_plain::dot_bf16;
    case GgmlType::Q4_0: return vnni ? avx512_vnni::dot_q4_0 : avx512_plain::dot_q4_0;
    case GgmlType::Q5_0: return vnni ? avx512_vnni::dot_q5_0 : avx512_plain::dot_q5_0;
    case GgmlType::Q8_0: return vnni ? avx512_vnni::dot_q8_0 : avx512_plain::dot_q8_0;
    case GgmlType::Q4_K: return avx512_plain::dot_q4_k;
    case GgmlType::Q5_K: return avx512_plain::dot_q5_k;
    case GgmlType::Q6_K: return avx512_plain::dot_q6_k;
    default: return nullptr;  // the AVX2 kernel serves
  }
}

}  // namespace tandem::dot_detail

#else

namespace tandem::dot_detail {
VecDotFn avx512_fn(GgmlType, bool, bool) { return nullptr; }
}  // namespace tandem::dot_detail

#endif

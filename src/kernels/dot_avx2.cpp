// AVX2 + FMA + F16C kernels (optionally AVX-VNNI for the 32-element formats).
// Every function carries its own target attribute: the library is built for
// baseline x86-64 and these run only after CPUID says they may.
#include "kernels/dot_impl.h"

#if defined(__x86_64__)

#include <immintrin.h>

#include <cstring>

#include "core/blocks.h"

namespace tandem::dot_detail {
namespace avx2_plain {
#define TD_TARGET "avx2,fma,f16c"
#define TD_VNNI 0
#include "kernels/dot_avx2_q32.h"
#undef TD_VNNI
#undef TD_TARGET
}  // namespace avx2_plain

namespace avx2_vnni {
#define TD_TARGET "avx2,fma,f16c,avxvnni"
#define TD_VNNI 1
#include "kernels/dot_avx2_q32.h"
#undef TD_VNNI
#undef TD_TARGET
}  // namespace avx2_vnni

namespace avx2_plain {

#define TD_FN __attribute__((target("avx2,fma,f16c"))) inline

TD_FN int32_t hsum_epi32(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm_cvtsi128_si32(s);
}

TD_FN __m256i load32(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }

// int16 lanes: `lo` for the first 16 bytes' products, `hi` for the last 16.
TD_FN __m256i scale_pair(int lo, int hi) {
  return _mm256_set_m128i(_mm_set1_epi16(static_cast<int16_t>(hi)), _mm_set1_epi16(static_cast<int16_t>(lo)));
}

// Unsigned quants (< 64) times q8, weighted per 16-element half, into int32.
TD_FN __m256i scaled_dot(__m256i q, const int8_t* y, __m256i scales16) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(q, load32(y)), scales16);
}

TD_FN float dot_f32(int64_t n, const void* w, const void* a) {
  const float* x = static_cast<const float*>(w);
  const float* y = static_cast<const float*>(a);
  __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
  int64_t i = 0;
  for (; i + 32 <= n; i += 32)
    for (int k = 0; k < 4; ++k)
      acc[k] = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 8 * k), _mm256_loadu_ps(y + i + 8 * k), acc[k]);
  for (; i + 8 <= n; i += 8) acc[0] = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i), acc[0]);
  float sum = hsum_ps(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
  for (; i < n; ++i) sum += x[i] * y[i];
  return sum;
}

TD_FN __m256 load_f16(const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

TD_FN float dot_f16(int64_t n, const void* w, const void* a) {
  const uint16_t* x = static_cast<const uint16_t*>(w);
  const uint16_t* y = static_cast<const uint16_t*>(a);
  __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
  int64_t i = 0;
  for (; i + 32 <= n; i += 32)
    for (int k = 0; k < 4; ++k)
      acc[k] = _mm256_fmadd_ps(load_f16(x + i + 8 * k), load_f16(y + i + 8 * k), acc[k]);
  for (; i + 8 <= n; i += 8) acc[0] = _mm256_fmadd_ps(load_f16(x + i), load_f16(y + i), acc[0]);
  float sum = hsum_ps(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
  for (; i < n; ++i) sum += _cvtsh_ss(x[i]) * _cvtsh_ss(y[i]);
  return sum;
}

// bf16 is the top half of an f32, so widening is a 16-bit shift.
TD_FN __m256 load_bf16(const uint16_t* p) {
  const __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
}

TD_FN float bf16_value(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

TD_FN float dot_bf16(int64_t n, const void* w, const void* a) {
  const uint16_t* x = static_cast<const uint16_t*>(w);
  const uint16_t* y = static_cast<const uint16_t*>(a);
  __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
  int64_t i = 0;
  for (; i + 32 <= n; i += 32)
    for (int k = 0; k < 4; ++k)
      acc[k] = _mm256_fmadd_ps(load_bf16(x + i + 8 * k), load_bf16(y + i + 8 * k), acc[k]);
  for (; i + 8 <= n; i += 8) acc[0] = _mm256_fmadd_ps(load_bf16(x + i), load_bf16(y + i), acc[0]);
  float sum = hsum_ps(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
  for (; i < n; ++i) sum += bf16_value(x[i]) * bf16_value(y[i]);
  return sum;
}

// The K-quant kernels keep one int32 vector per super-block, reduce it, and
// scale it with the same float expression as the scalar reference, so they
// reproduce the reference exactly. Signed quants are handled as unsigned
// (q + offset) with the offset's share, offset * sum(scale * bsum), removed
// in integers afterwards.

TD_FN float dot_q2_k(int64_t n, const void* w, const void* a) {
  const auto* xs = static_cast<const BlockQ2K*>(w);
  const auto* ys = static_cast<const BlockQ8K*>(a);
  const __m256i m3 = _mm256_set1_epi8(3);
  float sum = 0;
  for (int64_t b = 0; b < n / kQKK; ++b) {
    const BlockQ2K& x = xs[b];
    const BlockQ8K& y = ys[b];
    __m256i acc = _mm256_setzero_si256();
    for (int c = 0; c < 2; ++c) {
      const __m256i q = load32(x.qs + 32 * c);
      for (int j = 0; j < 4; ++j) {
        const int s = 8 * c + 2 * j;
        const __m256i qj = _mm256_and_si256(_mm256_srli_epi16(q, 2 * j), m3);
        acc = _mm256_add_epi32(
            acc, scaled_dot(qj, y.qs + 128 * c + 32 * j, scale_pair(x.scales[s] & 0xF, x.scales[s + 1] & 0xF)));
      }
    }
    int32_t msum = 0;
    for (int s = 0; s < 16; ++s) msum += (x.scales[s] >> 4) * y.bsums[s];
    sum += y.d * (_cvtsh_ss(x.d) * static_cast<float>(hsum_epi32(acc)) -
                  _cvtsh_ss(x.dmin) * static_cast<float>(msum));
  }
  return sum;
}

TD_FN float dot_q3_k(int64_t n, const void* w, const void* a) {
  const auto* xs = static_cast<const BlockQ3K*>(w);
  const auto* ys = static_cast<const BlockQ8K*>(a);
  const __m256i m3 = _mm256_set1_epi8(3);
  const __m256i one = _mm256_set1_epi8(1);
  float sum = 0;
  for (int64_t b = 0; b < n / kQKK; ++b) {
    const BlockQ3K& x = xs[b];
    const BlockQ8K& y = ys[b];
    int8_t sc[16];
    k3_scales(x.scales, sc);
    const __m256i hm = load32(x.hmask);
    __m256i acc = _mm256_setzero_si256();
    for (int c = 0; c < 2; ++c) {
      const __m256i q = load32(x.qs + 32 * c);
      for (int j = 0; j < 4; ++j) {
        const int s = 8 * c + 2 * j;
        // Stored value q2 + 4*h stands for q2 + 4*h - 4.
        const __m256i h = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hm, 4 * c + j), one), 2);
        const __m256i qj = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 2 * j), m3), h);
        acc = _mm256_add_epi32(acc, scaled_dot(qj, y.qs + 128 * c + 32 * j, scale_pair(sc[s], sc[s + 1])));
      }
    }
    int32_t offset = 0;
    for (int s = 0; s < 16; ++s) offset += sc[s] * y.bsums[s];
    sum += _cvtsh_ss(x.d) * y.d * static_cast<float>(hsum_epi32(acc) - 4 * offset);
  }
  return sum;
}

template <bool kFifthBit, typename Block>
TD_FN float dot_q45_k(int64_t n, const Block* xs, const BlockQ8K* ys) {
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  const __m256i one = _mm256_set1_epi8(1);
  float sum = 0;
  for (int64_t b = 0; b < n / kQKK; ++b) {
    const Block& x = xs[b];
    const BlockQ8K& y = ys[b];
    uint8_t sc[8], m[8];
    for (int s = 0; s < 8; ++s) k4_scale_min(s, x.scales, &sc[s], &m[s]);
    __m256i acc = _mm256_setzero_si256();
    for (int c = 0; c < 4; ++c) {
      const __m256i q = load32(x.qs + 32 * c);
      __m256i lo = _mm256_and_si256(q, m4);
      __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
      if constexpr (kFifthBit) {
        const __m256i qh = load32(x.qh);
        lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * c), one), 4));
        hi = _mm256_or_si256(hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * c + 1), one), 4));
      }
      acc = _mm256_add_epi32(acc, scaled_dot(lo, y.qs + 64 * c, _mm256_set1_epi16(sc[2 * c])));
      acc = _mm256_add_epi32(acc, scaled_dot(hi, y.qs + 64 * c + 32, _mm256_set1_epi16(sc[2 * c + 1])));
    }
    int32_t msum = 0;
    for (int s = 0; s < 8; ++s) msum += m[s] * (y.bsums[2 * s] + y.bsums[2 * s + 1]);
    sum += y.d * (_cvtsh_ss(x.d) * static_cast<float>(hsum_epi32(acc)) -
                  _cvtsh_ss(x.dmin) * static_cast<float>(msum));
  }
  return sum;
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
  float sum = 0;
  for (int64_t b = 0; b < n / kQKK; ++b) {
    const BlockQ6K& x = xs[b];
    const BlockQ8K& y = ys[b];
    __m256i acc = _mm256_setzero_si256();
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
        const int s = 8 * h + 2 * k;
        acc = _mm256_add_epi32(acc, scaled_dot(q, y.qs + 128 * h + 32 * k, scale_pair(x.scales[s], x.scales[s + 1])));
      }
    }
    int32_t offset = 0;
    for (int s = 0; s < 16; ++s) offset += x.scales[s] * y.bsums[s];
    sum += _cvtsh_ss(x.d) * y.d * static_cast<float>(hsum_epi32(acc) - 32 * offset);
  }
  return sum;
}

#undef TD_FN

}  // namespace avx2_plain

VecDotFn avx2_fn(GgmlType w, bool vnni) {
  switch (w) {
    case GgmlType::F32: return avx2_plain::dot_f32;
    case GgmlType::F16: return avx2_plain::dot_f16;
    case GgmlType::BF16: return avx2_plain::dot_bf16;
    case GgmlType::Q4_0: return vnni ? avx2_vnni::dot_q4_0 : avx2_plain::dot_q4_0;
    case GgmlType::Q4_1: return vnni ? avx2_vnni::dot_q4_1 : avx2_plain::dot_q4_1;
    case GgmlType::Q5_0: return vnni ? avx2_vnni::dot_q5_0 : avx2_plain::dot_q5_0;
    case GgmlType::Q5_1: return vnni ? avx2_vnni::dot_q5_1 : avx2_plain::dot_q5_1;
    case GgmlType::Q8_0: return vnni ? avx2_vnni::dot_q8_0 : avx2_plain::dot_q8_0;
    case GgmlType::Q2_K: return avx2_plain::dot_q2_k;
    case GgmlType::Q3_K: return avx2_plain::dot_q3_k;
    case GgmlType::Q4_K: return avx2_plain::dot_q4_k;
    case GgmlType::Q5_K: return avx2_plain::dot_q5_k;
    case GgmlType::Q6_K: return avx2_plain::dot_q6_k;
    default: return nullptr;
  }
}

}  // namespace tandem::dot_detail

#else

namespace tandem::dot_detail {
VecDotFn avx2_fn(GgmlType, bool) { return nullptr; }
}  // namespace tandem::dot_detail

#endif

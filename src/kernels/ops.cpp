#include "kernels/ops.h"

#include <cmath>
#include <limits>
#include <vector>

#include "core/quant.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace tandem {

namespace {

// Sum of the float squares x[i] * x[i], accumulated in double as ggml does.
double sum_squares_scalar(const float* x, int64_t n) {
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(x[i] * x[i]);
  return sum;
}

#if defined(__x86_64__)
// The same squares (rounded to float first, like the scalar loop) in 16
// double lanes, combined in a fixed order: sequential double addition is
// one latency-bound chain, and a norm runs over every row several times a
// layer. Only the order of the double additions differs from the scalar
// sum (relative error ~1e-16, below what the float result can show).
__attribute__((target("avx512f"))) double sum_squares_avx512(const float* x, int64_t n) {
  __m512d a0 = _mm512_setzero_pd(), a1 = _mm512_setzero_pd();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 v = _mm512_loadu_ps(x + i);
    const __m512 sq = _mm512_mul_ps(v, v);
    a0 = _mm512_add_pd(a0, _mm512_cvtps_pd(_mm512_castps512_ps256(sq)));
    a1 = _mm512_add_pd(a1, _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(sq), 1))));
  }
  alignas(64) double lanes[8];
  _mm512_store_pd(lanes, _mm512_add_pd(a0, a1));
  double sum = ((lanes[0] + lanes[4]) + (lanes[2] + lanes[6])) + ((lanes[1] + lanes[5]) + (lanes[3] + lanes[7]));
  for (; i < n; ++i) sum += static_cast<double>(x[i] * x[i]);
  return sum;
}

__attribute__((target("avx2"))) double sum_squares_avx2(const float* x, int64_t n) {
  __m256d a0 = _mm256_setzero_pd(), a1 = _mm256_setzero_pd();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    const __m256 sq = _mm256_mul_ps(v, v);
    a0 = _mm256_add_pd(a0, _mm256_cvtps_pd(_mm256_castps256_ps128(sq)));
    a1 = _mm256_add_pd(a1, _mm256_cvtps_pd(_mm256_extractf128_ps(sq, 1)));
  }
  alignas(32) double lanes[4];
  _mm256_store_pd(lanes, _mm256_add_pd(a0, a1));
  double sum = (lanes[0] + lanes[2]) + (lanes[1] + lanes[3]);
  for (; i < n; ++i) sum += static_cast<double>(x[i] * x[i]);
  return sum;
}
#endif

double sum_squares(KernelLevel level, const float* x, int64_t n) {
#if defined(__x86_64__)
  if (level >= KernelLevel::kAvx512) return sum_squares_avx512(x, n);
  if (level >= KernelLevel::kAvx2) return sum_squares_avx2(x, n);
#endif
  (void)level;
  return sum_squares_scalar(x, n);
}

}  // namespace

void rms_norm_at(KernelLevel level, const float* x, const float* w, int64_t n, float eps, float* out) {
  const double sum = sum_squares(level, x, n);
  const float mean = static_cast<float>(sum / static_cast<double>(n));
  const float scale = 1.0f / std::sqrt(mean + eps);
  if (w) {
    for (int64_t i = 0; i < n; ++i) out[i] = x[i] * scale * w[i];
  } else {
    for (int64_t i = 0; i < n; ++i) out[i] = x[i] * scale;
  }
}

void rms_norm(const float* x, const float* w, int64_t n, float eps, float* out) {
  static const KernelLevel level = active_kernel_level();
  rms_norm_at(level, x, w, n, eps, out);
}

void rope_angles(const RopeParams& p, int32_t pos, float* cos_out, float* sin_out) {
  // The angle is advanced by repeated multiplication, in float, as ggml does;
  // computing pow() per pair would differ in the last bits.
  const float theta_scale = std::pow(p.base, -2.0f / static_cast<float>(p.dims));
  float theta = static_cast<float>(pos);
  for (int32_t i = 0; i < p.dims / 2; ++i) {
    const float ff = p.freq_factors ? p.freq_factors[i] : 1.0f;
    const float t = p.scale * (theta / ff);
    cos_out[i] = std::cos(t);
    sin_out[i] = std::sin(t);
    theta *= theta_scale;
  }
}

void rope_apply(const RopeParams& p, const float* c, const float* s, float* v) {
  const int32_t half = p.dims / 2;
  if (p.style == RopeStyle::kNormal) {
    for (int32_t i = 0; i < half; ++i) {
      const float x0 = v[2 * i], x1 = v[2 * i + 1];
      v[2 * i] = x0 * c[i] - x1 * s[i];
      v[2 * i + 1] = x0 * s[i] + x1 * c[i];
    }
  } else {
    for (int32_t i = 0; i < half; ++i) {
      const float x0 = v[i], x1 = v[i + half];
      v[i] = x0 * c[i] - x1 * s[i];
      v[i + half] = x0 * s[i] + x1 * c[i];
    }
  }
}

namespace {

float gelu_exact_tanh(float x) {
  constexpr float kSqrt2OverPi = 0.79788456080286535587989211986876f;
  constexpr float kCoef = 0.044715f;
  return 0.5f * x * (1.0f + std::tanh(kSqrt2OverPi * x * (1.0f + kCoef * x * x)));
}

// llama.cpp evaluates GELU through a 64K-entry table indexed by the input
// rounded to f16 (and stores the result as f16). Using the same table keeps
// Gemma's activations bit-compatible with it. One entry of padding: the SIMD
// paths gather 4 bytes at entry i, which for the last entry reads past it.
const std::vector<uint16_t>& gelu_table() {
  static const std::vector<uint16_t> table = [] {
    std::vector<uint16_t> t((1 << 16) + 1, 0);
    for (uint32_t i = 0; i < (1u << 16); ++i)
      t[i] = f32_to_f16(gelu_exact_tanh(f16_to_f32(static_cast<uint16_t>(i))));
    return t;
  }();
  return table;
}

constexpr float kGeluLo = -10.0f, kGeluHi = 10.0f;  // below: 0, above: x (as ggml)

void gelu_gated_scalar(float* gate, const float* up, int64_t n) {
  for (int64_t i = 0; i < n; ++i) gate[i] = gelu_tanh(gate[i]) * up[i];
}

#if defined(__x86_64__)
__attribute__((target("avx512f,avx512bw,avx512vl,f16c,fma"))) void gelu_gated_avx512(float* gate, const float* up,
                                                                                      int64_t n) {
  const int* table = reinterpret_cast<const int*>(gelu_table().data());
  const __m512 lo = _mm512_set1_ps(kGeluLo), hi = _mm512_set1_ps(kGeluHi);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 x = _mm512_loadu_ps(gate + i);
    const __m512i h = _mm512_cvtepu16_epi32(_mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    const __m512i e = _mm512_i32gather_epi32(h, table, 2);
    __m512 g = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(e));
    g = _mm512_mask_mov_ps(g, _mm512_cmp_ps_mask(x, lo, _CMP_LE_OQ), _mm512_setzero_ps());
    g = _mm512_mask_mov_ps(g, _mm512_cmp_ps_mask(x, hi, _CMP_GE_OQ), x);
    _mm512_storeu_ps(gate + i, _mm512_mul_ps(g, _mm512_loadu_ps(up + i)));
  }
  gelu_gated_scalar(gate + i, up + i, n - i);
}

__attribute__((target("avx2,f16c,fma"))) void gelu_gated_avx2(float* gate, const float* up, int64_t n) {
  const int* table = reinterpret_cast<const int*>(gelu_table().data());
  const __m256 lo = _mm256_set1_ps(kGeluLo), hi = _mm256_set1_ps(kGeluHi);
  const __m256i low16 = _mm256_set1_epi32(0xffff);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 x = _mm256_loadu_ps(gate + i);
    const __m256i h = _mm256_cvtepu16_epi32(_mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    const __m256i e = _mm256_and_si256(_mm256_i32gather_epi32(table, h, 2), low16);
    // Back to 8 f16 values: pack the low halves of the 32-bit entries.
    const __m128i e16 = _mm_packus_epi32(_mm256_castsi256_si128(e), _mm256_extracti128_si256(e, 1));
    __m256 g = _mm256_cvtph_ps(e16);
    g = _mm256_blendv_ps(g, _mm256_setzero_ps(), _mm256_cmp_ps(x, lo, _CMP_LE_OQ));
    g = _mm256_blendv_ps(g, x, _mm256_cmp_ps(x, hi, _CMP_GE_OQ));
    _mm256_storeu_ps(gate + i, _mm256_mul_ps(g, _mm256_loadu_ps(up + i)));
  }
  gelu_gated_scalar(gate + i, up + i, n - i);
}

// e^x for the SiLU, 16 / 8 lanes: x = n ln2 + r with |r| <= ln2/2 (ln2 split
// in two so n ln2 is exact), e^r by its Taylor polynomial to r^7 (truncation
// below 5e-9 relative), times 2^n. Within 2 ulp of expf over the range the
// activations use; e^x overflows to inf above 88.72 and flushes to 0 below
// -87.3, where 1 + e^x no longer changes anyway.
constexpr float kLog2e = 1.44269504088896341f, kLn2Hi = 0.693145751953125f, kLn2Lo = 1.42860682030941723e-6f;
constexpr float kExpC[] = {1.0f / 5040, 1.0f / 720, 1.0f / 120, 1.0f / 24, 1.0f / 6, 0.5f, 1.0f, 1.0f};

__attribute__((target("avx512f"))) inline __m512 exp_avx512(__m512 in) {
  // Clamped where e^x is already 0 or inf, so that r stays finite (+-inf
  // would give inf - inf); scalef then rounds the extremes to 0 and inf.
  const __m512 x = _mm512_min_ps(_mm512_max_ps(in, _mm512_set1_ps(-104.0f)), _mm512_set1_ps(89.0f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(kLog2e)), _MM_FROUND_TO_NEAREST_INT);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Hi), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Lo), r);
  __m512 p = _mm512_set1_ps(kExpC[0]);
  for (int i = 1; i < 8; ++i) p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kExpC[i]));
  const __m512 v = _mm512_scalef_ps(p, n);  // p * 2^n, overflow and underflow included
  return _mm512_mask_mov_ps(v, _mm512_cmp_ps_mask(in, in, _CMP_UNORD_Q), in);  // NaN stays NaN
}

__attribute__((target("avx512f"))) void silu_gated_avx512(float* gate, const float* up, int64_t n) {
  const __m512 one = _mm512_set1_ps(1.0f);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 x = _mm512_loadu_ps(gate + i);
    const __m512 e = exp_avx512(_mm512_sub_ps(_mm512_setzero_ps(), x));
    _mm512_storeu_ps(gate + i, _mm512_mul_ps(_mm512_div_ps(x, _mm512_add_ps(one, e)), _mm512_loadu_ps(up + i)));
  }
  for (; i < n; ++i) gate[i] = silu(gate[i]) * up[i];
}

__attribute__((target("avx2,fma"))) inline __m256 exp_avx2(__m256 x) {
  // Inputs are clamped so that 2^n stays a normal float; the lanes beyond
  // are patched afterwards (inf above, 0 below, NaN kept).
  const __m256 hi = _mm256_set1_ps(88.72f), lo = _mm256_set1_ps(-87.3f);
  const __m256 xc = _mm256_min_ps(_mm256_max_ps(x, lo), hi);
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(xc, _mm256_set1_ps(kLog2e)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Hi), xc);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Lo), r);
  __m256 p = _mm256_set1_ps(kExpC[0]);
  for (int i = 1; i < 8; ++i) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kExpC[i]));
  // 2^n for n in [-126, 128]: 128 (x near 88.72) as 2 * 2^127.
  const __m256i ni = _mm256_cvtps_epi32(n);
  const __m256i big = _mm256_cmpgt_epi32(ni, _mm256_set1_epi32(127));
  const __m256i ne = _mm256_sub_epi32(ni, _mm256_and_si256(big, _mm256_set1_epi32(1)));
  __m256 v = _mm256_mul_ps(p, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(ne, _mm256_set1_epi32(127)), 23)));
  v = _mm256_blendv_ps(v, _mm256_add_ps(v, v), _mm256_castsi256_ps(big));
  v = _mm256_blendv_ps(v, _mm256_set1_ps(std::numeric_limits<float>::infinity()), _mm256_cmp_ps(x, hi, _CMP_GT_OQ));
  v = _mm256_blendv_ps(v, _mm256_setzero_ps(), _mm256_cmp_ps(x, lo, _CMP_LT_OQ));
  return _mm256_blendv_ps(v, x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));  // NaN stays NaN
}

__attribute__((target("avx2,fma"))) void silu_gated_avx2(float* gate, const float* up, int64_t n) {
  const __m256 one = _mm256_set1_ps(1.0f);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 x = _mm256_loadu_ps(gate + i);
    const __m256 e = exp_avx2(_mm256_sub_ps(_mm256_setzero_ps(), x));
    _mm256_storeu_ps(gate + i, _mm256_mul_ps(_mm256_div_ps(x, _mm256_add_ps(one, e)), _mm256_loadu_ps(up + i)));
  }
  for (; i < n; ++i) gate[i] = silu(gate[i]) * up[i];
}
#endif

}  // namespace

float gelu_tanh(float x) {
  if (x <= kGeluLo) return 0.0f;
  if (x >= kGeluHi) return x;
  return f16_to_f32(gelu_table()[f32_to_f16(x)]);
}

float silu(float x) { return x / (1.0f + std::exp(-x)); }

void gated_activation_at(KernelLevel level, Activation act, float* gate, const float* up, int64_t n) {
  if (act == Activation::kGeluTanh) {
#if defined(__x86_64__)
    if (level >= KernelLevel::kAvx512) return gelu_gated_avx512(gate, up, n);
    if (level >= KernelLevel::kAvx2) return gelu_gated_avx2(gate, up, n);
#endif
    return gelu_gated_scalar(gate, up, n);
  }
#if defined(__x86_64__)
  if (level >= KernelLevel::kAvx512) return silu_gated_avx512(gate, up, n);
  if (level >= KernelLevel::kAvx2) return silu_gated_avx2(gate, up, n);
#endif
  for (int64_t i = 0; i < n; ++i) gate[i] = silu(gate[i]) * up[i];
}

void gated_activation(Activation act, float* gate, const float* up, int64_t n) {
  static const KernelLevel level = active_kernel_level();
  gated_activation_at(level, act, gate, up, n);
}

}  // namespace tandem

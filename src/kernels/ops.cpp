#include "kernels/ops.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "quant/quant.h"
#include "kernels/kernel_builds.h"
#include "kernels/simd_exp.h"

#if defined(__x86_64__)
// As in simd_avx512.h: GCC 12's AVX-512 headers trip -Wmaybe-uninitialized when inlined.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
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

}  // namespace

namespace {

float log_sum_exp_scalar(const float* x, int64_t n) {
  float mx = x[0];
  for (int64_t i = 1; i < n; ++i) mx = std::max(mx, x[i]);
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += std::exp(static_cast<double>(x[i] - mx));
  return mx + static_cast<float>(std::log(sum));
}

#if defined(__x86_64__)
// A 262k vocabulary through libm's exp is ~1 ms a row; a prompt scored
// (echo) runs it for every position.
__attribute__((target("avx512f"))) float log_sum_exp_avx512(const float* x, int64_t n) {
  __m512 m = _mm512_set1_ps(x[0]);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) m = _mm512_max_ps(m, _mm512_loadu_ps(x + i));
  float mx = _mm512_reduce_max_ps(m);
  for (; i < n; ++i) mx = std::max(mx, x[i]);
  const __m512 vmx = _mm512_set1_ps(mx);
  __m512d a0 = _mm512_setzero_pd(), a1 = _mm512_setzero_pd();
  for (i = 0; i + 16 <= n; i += 16) {
    const __m512 e = simd::exp_ps(_mm512_sub_ps(_mm512_loadu_ps(x + i), vmx));
    a0 = _mm512_add_pd(a0, _mm512_cvtps_pd(_mm512_castps512_ps256(e)));
    a1 = _mm512_add_pd(a1, _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(e), 1))));
  }
  double sum = _mm512_reduce_add_pd(_mm512_add_pd(a0, a1));
  for (; i < n; ++i) sum += std::exp(static_cast<double>(x[i] - mx));
  return mx + static_cast<float>(std::log(sum));
}

__attribute__((target("avx2,fma"))) float log_sum_exp_avx2(const float* x, int64_t n) {
  __m256 m = _mm256_set1_ps(x[0]);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) m = _mm256_max_ps(m, _mm256_loadu_ps(x + i));
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, m);
  float mx = lanes[0];
  for (float v : lanes) mx = std::max(mx, v);
  for (; i < n; ++i) mx = std::max(mx, x[i]);
  const __m256 vmx = _mm256_set1_ps(mx);
  __m256d a0 = _mm256_setzero_pd(), a1 = _mm256_setzero_pd();
  for (i = 0; i + 8 <= n; i += 8) {
    const __m256 e = simd::exp_ps(_mm256_sub_ps(_mm256_loadu_ps(x + i), vmx));
    a0 = _mm256_add_pd(a0, _mm256_cvtps_pd(_mm256_castps256_ps128(e)));
    a1 = _mm256_add_pd(a1, _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1)));
  }
  alignas(32) double d[4];
  _mm256_store_pd(d, _mm256_add_pd(a0, a1));
  double sum = (d[0] + d[2]) + (d[1] + d[3]);
  for (; i < n; ++i) sum += std::exp(static_cast<double>(x[i] - mx));
  return mx + static_cast<float>(std::log(sum));
}
#endif

}  // namespace

float log_sum_exp_at(KernelLevel level, const float* x, int64_t n) { return level_fns(level).log_sum_exp(x, n); }

float log_sum_exp(const float* x, int64_t n) {
  return log_sum_exp_at(active_kernel_level(), x, n);
}

void rms_norm_at(KernelLevel level, const float* x, const float* w, int64_t n, float eps, float* out) {
  const double sum = level_fns(level).sum_squares(x, n);
  const float mean = static_cast<float>(sum / static_cast<double>(n));
  const float scale = 1.0f / std::sqrt(mean + eps);
  if (w) {
    for (int64_t i = 0; i < n; ++i) out[i] = x[i] * scale * w[i];
  } else {
    for (int64_t i = 0; i < n; ++i) out[i] = x[i] * scale;
  }
}

void rms_norm(const float* x, const float* w, int64_t n, float eps, float* out) {
  rms_norm_at(active_kernel_level(), x, w, n, eps, out);
}

void rope_angles(const RopeParams& p, int32_t pos, float* cos_out, float* sin_out) {
  // The angle is advanced by repeated multiplication, in float, as ggml does;
  // computing pow() per pair would differ in the last bits.
  const float theta_scale = std::pow(p.base, -2.0f / static_cast<float>(p.dims));
  float theta = static_cast<float>(pos);
  for (int32_t i = 0; i < p.dims / 2; ++i) {
    const float ff = p.freq_factors ? p.freq_factors[i] : 1.0f;
    const float extrap = theta / ff;
    float t = p.scale * extrap;
    if (p.yarn) {
      const float y = (static_cast<float>(i) - p.yarn_low) / std::max(0.001f, p.yarn_high - p.yarn_low);
      const float ramp = 1.0f - std::min(1.0f, std::max(0.0f, y));
      t = t * (1.0f - ramp) + extrap * ramp;
    }
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

RopePair rope_pair(const RopeParams& p, int32_t i) {
  const int32_t half = p.dims / 2;
  const double ff = p.freq_factors ? p.freq_factors[i] : 1.0;
  const double rate = p.scale * std::pow(double(p.base), -2.0 * i / p.dims) / ff;
  if (p.style == RopeStyle::kNormal) return {2 * i, 2 * i + 1, rate};
  return {i, i + half, rate};
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

void silu_gated_scalar(float* gate, const float* up, int64_t n) {
  for (int64_t i = 0; i < n; ++i) gate[i] = silu(gate[i]) * up[i];
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

// SiLU with the softmax's e^x (kernels/simd_exp.h): a few ulp from libm's.
__attribute__((target("avx512f"))) void silu_gated_avx512(float* gate, const float* up, int64_t n) {
  const __m512 one = _mm512_set1_ps(1.0f);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 x = _mm512_loadu_ps(gate + i);
    const __m512 e = simd::exp_ps(_mm512_sub_ps(_mm512_setzero_ps(), x));
    _mm512_storeu_ps(gate + i, _mm512_mul_ps(_mm512_div_ps(x, _mm512_add_ps(one, e)), _mm512_loadu_ps(up + i)));
  }
  silu_gated_scalar(gate + i, up + i, n - i);
}

__attribute__((target("avx2,fma"))) void silu_gated_avx2(float* gate, const float* up, int64_t n) {
  const __m256 one = _mm256_set1_ps(1.0f);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 x = _mm256_loadu_ps(gate + i);
    const __m256 e = simd::exp_ps(_mm256_sub_ps(_mm256_setzero_ps(), x));
    _mm256_storeu_ps(gate + i, _mm256_mul_ps(_mm256_div_ps(x, _mm256_add_ps(one, e)), _mm256_loadu_ps(up + i)));
  }
  silu_gated_scalar(gate + i, up + i, n - i);
}
#endif

}  // namespace

float gelu_tanh(float x) {
  if (x <= kGeluLo) return 0.0f;
  if (x >= kGeluHi) return x;
  return f16_to_f32(gelu_table()[f32_to_f16(x)]);
}

float silu(float x) { return x / (1.0f + std::exp(-x)); }

static void swiglu_oai_gated(float* gate, const float* up, int64_t n) {
  constexpr float kAlpha = 1.702f, kLimit = 7.0f;
  for (int64_t i = 0; i < n; ++i) {
    const float x = std::min(gate[i], kLimit);
    const float y = std::clamp(up[i], -kLimit, kLimit);
    gate[i] = x / (1.0f + std::exp(kAlpha * -x)) * (y + 1.0f);
  }
}

void gated_activation_at(KernelLevel level, Activation act, float* gate, const float* up, int64_t n) {
  if (act == Activation::kSwigluOai) return swiglu_oai_gated(gate, up, n);
  const LevelFns& f = level_fns(level);
  (act == Activation::kGeluTanh ? f.gelu_gated : f.silu_gated)(gate, up, n);
}

void gated_activation(Activation act, float* gate, const float* up, int64_t n) {
  gated_activation_at(active_kernel_level(), act, gate, up, n);
}

// This file's part of the builds (kernels/kernel_builds.h).
namespace builds {

LevelFns scalar_ops() {
  return {.sum_squares = sum_squares_scalar, .log_sum_exp = log_sum_exp_scalar, .gelu_gated = gelu_gated_scalar,
          .silu_gated = silu_gated_scalar};
}

#if defined(__x86_64__)
LevelFns avx2_ops() {
  return {.sum_squares = sum_squares_avx2, .log_sum_exp = log_sum_exp_avx2, .gelu_gated = gelu_gated_avx2,
          .silu_gated = silu_gated_avx2};
}

LevelFns avx512_ops() {
  return {.sum_squares = sum_squares_avx512, .log_sum_exp = log_sum_exp_avx512, .gelu_gated = gelu_gated_avx512,
          .silu_gated = silu_gated_avx512};
}
#endif

}  // namespace builds

}  // namespace tandem

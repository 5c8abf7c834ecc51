// Element-wise and per-row operations of the forward pass. They follow ggml's
// arithmetic where it affects results (double-precision sums in RMS norm, the
// iterative rope angle, gelu through an f16 table) so that our logits stay
// close to llama.cpp's.
#pragma once

#include <cstdint>

#include "runtime/cpu_features.h"

namespace tandem {

enum class RopeStyle { kNormal, kNeox };  // adjacent pairs (llama) / two halves (neox)
// kSwigluOai: gpt-oss's clamped SwiGLU (ggml's swiglu_oai, alpha 1.702,
// limit 7): x = min(gate, 7), y = clamp(up, -7, 7), x * sigmoid(1.702 x) * (y + 1).
enum class Activation { kSilu, kGeluTanh, kSwigluOai };

// out = x / rms(x) * w   (w may be null: no weight). out may alias x. The
// sum of squares is in double as in ggml; the SIMD levels add it in a fixed
// lane order instead of one sequential chain.
void rms_norm(const float* x, const float* w, int64_t n, float eps, float* out);
void rms_norm_at(KernelLevel level, const float* x, const float* w, int64_t n, float eps, float* out);

// Rotary position embedding for one head vector of `head_dim` floats, the
// first `rope_dims` rotated. freq_factors (rope_dims/2 entries) may be null.
struct RopeParams {
  RopeStyle style = RopeStyle::kNormal;
  int32_t dims = 0;
  float base = 10000.0f;
  float scale = 1.0f;
  const float* freq_factors = nullptr;
  // YaRN (ggml's rope_yarn with ext_factor 1): pair i's angle blends the
  // interpolated (scaled) and the original one by a ramp that is 1 below
  // pair yarn_low and 0 above yarn_high.
  bool yarn = false;
  float yarn_low = 0.0f, yarn_high = 0.0f;
};
// cos/sin for position `pos`, rope_dims/2 pairs each: computed once per token
// and shared by all heads.
void rope_angles(const RopeParams& p, int32_t pos, float* cos_out, float* sin_out);
void rope_apply(const RopeParams& p, const float* cos_v, const float* sin_v, float* vec);
// Pair i (< dims / 2) of a head: the two elements rope_apply turns together,
// and the angle it turns them by per position, in radians.
struct RopePair {
  int32_t a = 0, b = 0;
  double radians_per_position = 0;
};
RopePair rope_pair(const RopeParams& p, int32_t i);

// gate[i] = act(gate[i]) * up[i], at the active kernel level. The GELU's
// table lookups run 16 (AVX-512) or 8 (AVX2) at a time with hardware f16
// conversions, which round like f32_to_f16: every level gives the same bits.
// The SiLU's SIMD levels use the softmax's e^x, within a few ulp of libm's.
// The clamped SwiGLU is the same scalar code at every level (libm's expf, as
// ggml's CPU op): a few expert rows per token, next to their products.
void gated_activation(Activation act, float* gate, const float* up, int64_t n);
void gated_activation_at(KernelLevel level, Activation act, float* gate, const float* up, int64_t n);

// log(sum_i e^x[i]) over n >= 1 floats: the normalizer of a log-softmax
// (logprobs over a vocabulary). The scalar level sums e^(x - max) in double
// with libm; the SIMD levels use the softmax's e^x on floats, summed in
// double lanes (relative difference ~1e-7).
float log_sum_exp(const float* x, int64_t n);
float log_sum_exp_at(KernelLevel level, const float* x, int64_t n);

float gelu_tanh(float x);  // llama.cpp-equivalent (f16-table) GELU
float silu(float x);

}  // namespace tandem

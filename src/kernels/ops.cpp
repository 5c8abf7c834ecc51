#include "kernels/ops.h"

#include <cmath>
#include <vector>

#include "core/quant.h"

namespace tandem {

void rms_norm(const float* x, const float* w, int64_t n, float eps, float* out) {
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(x[i] * x[i]);
  const float mean = static_cast<float>(sum / static_cast<double>(n));
  const float scale = 1.0f / std::sqrt(mean + eps);
  if (w) {
    for (int64_t i = 0; i < n; ++i) out[i] = x[i] * scale * w[i];
  } else {
    for (int64_t i = 0; i < n; ++i) out[i] = x[i] * scale;
  }
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
// Gemma's activations bit-compatible with it.
const std::vector<uint16_t>& gelu_table() {
  static const std::vector<uint16_t> table = [] {
    std::vector<uint16_t> t(1 << 16);
    for (uint32_t i = 0; i < t.size(); ++i)
      t[i] = f32_to_f16(gelu_exact_tanh(f16_to_f32(static_cast<uint16_t>(i))));
    return t;
  }();
  return table;
}

}  // namespace

float gelu_tanh(float x) {
  if (x <= -10.0f) return 0.0f;
  if (x >= 10.0f) return x;
  return f16_to_f32(gelu_table()[f32_to_f16(x)]);
}

float silu(float x) { return x / (1.0f + std::exp(-x)); }

void gated_activation(Activation act, float* gate, const float* up, int64_t n) {
  if (act == Activation::kGeluTanh) {
    for (int64_t i = 0; i < n; ++i) gate[i] = gelu_tanh(gate[i]) * up[i];
  } else {
    for (int64_t i = 0; i < n; ++i) gate[i] = silu(gate[i]) * up[i];
  }
}

}  // namespace tandem

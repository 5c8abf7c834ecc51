// Element-wise ops: the SIMD paths of the gated activations give the scalar
// reference's bits, on random inputs of odd lengths and on the edges of the
// GELU table (the +-10 clamps, f16 overflow, infinities, signed zeros).
#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "kernels/ops.h"

namespace tandem {
namespace {

std::vector<float> gelu_inputs(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 4.0f);
  const float inf = std::numeric_limits<float>::infinity();
  const float edges[] = {-10.0f, 10.0f, std::nextafter(-10.0f, 0.0f), std::nextafter(10.0f, 0.0f), -0.0f, 0.0f,
                         1e-8f,  -1e-8f, 6e-5f, 65504.0f, 65520.0f, -1e6f, 1e6f, inf, -inf, 3.14159f};
  std::vector<float> x(n);
  for (size_t i = 0; i < n; ++i) x[i] = i % 5 == 0 ? edges[(i / 5) % std::size(edges)] : normal(rng);
  return x;
}

TEST(KernelsOps, GatedGeluEqualsScalarAtEveryLevel) {
  for (KernelLevel level : kAllKernelLevels) {
    if (!cpu_supports_level(level) || level == KernelLevel::kScalar) continue;
    for (size_t n : {1u, 7u, 8u, 15u, 16u, 17u, 33u, 100u, 2049u}) {
      const std::vector<float> x = gelu_inputs(n, static_cast<uint32_t>(n));
      std::vector<float> up = gelu_inputs(n, static_cast<uint32_t>(n + 1000));
      for (float& u : up)
        if (!std::isfinite(u)) u = 1.5f;  // inf * 0 would be NaN on both sides; keep the products finite
      std::vector<float> ref = x, got = x;
      gated_activation_at(KernelLevel::kScalar, Activation::kGeluTanh, ref.data(), up.data(), static_cast<int64_t>(n));
      gated_activation_at(level, Activation::kGeluTanh, got.data(), up.data(), static_cast<int64_t>(n));
      for (size_t i = 0; i < n; ++i) {
        if (std::isnan(ref[i])) {
          EXPECT_TRUE(std::isnan(got[i])) << "level " << kernel_level_name(level) << " x=" << x[i];
          continue;
        }
        uint32_t a, b;
        std::memcpy(&a, &ref[i], 4);
        std::memcpy(&b, &got[i], 4);
        ASSERT_EQ(a, b) << "level " << kernel_level_name(level) << " n=" << n << " i=" << i << " x=" << x[i]
                        << " ref=" << ref[i] << " got=" << got[i];
      }
    }
  }
}

// gpt-oss's clamped SwiGLU (ggml's swiglu_oai): the gate clamped above at 7,
// up clamped to [-7, 7], x * sigmoid(1.702 x) * (up + 1); against double
// arithmetic, every level (the same scalar code at each), odd lengths, inputs
// on both sides of the clamps.
TEST(KernelsOps, ClampedSwigluMatchesDoubleAtEveryLevel) {
  for (KernelLevel level : kAllKernelLevels) {
    if (!cpu_supports_level(level)) continue;
    for (size_t n : {1u, 7u, 17u, 33u, 301u}) {
      std::mt19937 rng(static_cast<uint32_t>(n));
      std::normal_distribution<float> normal(0.0f, 6.0f);
      std::vector<float> x(n), up(n);
      for (size_t i = 0; i < n; ++i) x[i] = normal(rng), up[i] = normal(rng);
      x[0] = 9.0f, up[0] = -11.0f;  // both clamps
      std::vector<float> got = x;
      gated_activation_at(level, Activation::kSwigluOai, got.data(), up.data(), static_cast<int64_t>(n));
      for (size_t i = 0; i < n; ++i) {
        const double g = std::min(double(x[i]), 7.0), u = std::clamp(double(up[i]), -7.0, 7.0);
        const double want = g / (1.0 + std::exp(-1.702 * g)) * (u + 1.0);
        EXPECT_NEAR(got[i], want, 1e-5 * std::max(1.0, std::abs(want))) << kernel_level_name(level) << " i=" << i;
      }
      EXPECT_NEAR(got[0], 7.0 / (1.0 + std::exp(-1.702 * 7.0)) * -6.0, 1e-4);
    }
  }
}

int32_t ulp_distance(float a, float b) {
  int32_t ia, ib;
  std::memcpy(&ia, &a, 4);
  std::memcpy(&ib, &b, 4);
  if ((ia < 0) != (ib < 0)) return a == b ? 0 : INT32_MAX;
  return std::abs(ia - ib);
}

TEST(KernelsOps, RmsNormMatchesScalarAtEveryLevel) {
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  int64_t exact = 0, total = 0;
  for (KernelLevel level : kAllKernelLevels) {
    if (!cpu_supports_level(level) || level == KernelLevel::kScalar) continue;
    for (int64_t n : {1, 3, 8, 15, 16, 17, 31, 64, 100, 256, 640, 2047, 2048}) {
      for (int rep = 0; rep < 20; ++rep) {
        std::vector<float> x(n), w(n), ref(n), got(n);
        for (auto& v : x) v = normal(rng) * (rep % 3 == 0 ? 1e3f : rep % 3 == 1 ? 1e-3f : 1.0f);
        for (auto& v : w) v = normal(rng);
        const float* wp = rep % 4 == 3 ? nullptr : w.data();
        rms_norm_at(KernelLevel::kScalar, x.data(), wp, n, 1e-6f, ref.data());
        rms_norm_at(level, x.data(), wp, n, 1e-6f, got.data());
        for (int64_t i = 0; i < n; ++i) {
          // Only the double sum's order differs: at most one float rounding step.
          ASSERT_LE(ulp_distance(ref[i], got[i]), 1) << kernel_level_name(level) << " n=" << n << " i=" << i;
          exact += ref[i] == got[i];
          ++total;
        }
      }
    }
    // In place too.
    std::vector<float> x(33, 1.5f), y(33);
    rms_norm_at(level, x.data(), nullptr, 33, 0.0f, y.data());
    rms_norm_at(level, x.data(), nullptr, 33, 0.0f, x.data());
    EXPECT_EQ(x, y);
    EXPECT_NEAR(y[0], 1.0f, 1e-6f);
  }
  if (total > 0) {
    EXPECT_GT(static_cast<double>(exact) / total, 0.999);
  }
}

TEST(KernelsOps, GeluFollowsTheTableAndClamps) {
  EXPECT_EQ(gelu_tanh(-10.0f), 0.0f);
  EXPECT_EQ(gelu_tanh(-50.0f), 0.0f);
  EXPECT_EQ(gelu_tanh(10.0f), 10.0f);
  EXPECT_EQ(gelu_tanh(1e6f), 1e6f);
  EXPECT_EQ(gelu_tanh(0.0f), 0.0f);
  // GELU(1) = 0.8412, looked up at f16 precision.
  EXPECT_NEAR(gelu_tanh(1.0f), 0.8412f, 1e-3f);
  EXPECT_NEAR(gelu_tanh(-1.0f), -0.1588f, 1e-3f);
  EXPECT_TRUE(std::isnan(gelu_tanh(std::numeric_limits<float>::quiet_NaN())));
}

TEST(KernelsOps, GatedSiluWithinUlpsOfScalarAtEveryLevel) {
  std::mt19937 rng(9);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  const float inf = std::numeric_limits<float>::infinity();
  const float edges[] = {0.0f, -0.0f, 1e-30f, -1e-30f, 87.0f, -87.0f, 88.7f, -88.7f, 89.5f, -89.5f, 103.0f,
                         -103.0f, 200.0f, -200.0f, inf, -inf, 20.0f, -20.0f, 0.6931472f, -15.9f};
  for (KernelLevel level : kAllKernelLevels) {
    if (!cpu_supports_level(level) || level == KernelLevel::kScalar) continue;
    for (int64_t n : {1, 7, 8, 9, 15, 16, 17, 40, 5632 + 3}) {
      std::vector<float> x(n), up(n);
      for (int64_t i = 0; i < n; ++i) {
        x[i] = i % 7 == 3 ? edges[(i / 7) % std::size(edges)] : normal(rng) * (i % 2 ? 1.0f : 8.0f);
        up[i] = i % 5 == 0 ? 1.0f : normal(rng);
      }
      std::vector<float> ref = x, got = x;
      gated_activation_at(KernelLevel::kScalar, Activation::kSilu, ref.data(), up.data(), n);
      gated_activation_at(level, Activation::kSilu, got.data(), up.data(), n);
      for (int64_t i = 0; i < n; ++i) {
        if (std::isnan(ref[i])) {
          EXPECT_TRUE(std::isnan(got[i])) << kernel_level_name(level) << " x=" << x[i];
          continue;
        }
        // A few ulp from the polynomial exp against libm's, through one division.
        ASSERT_LE(ulp_distance(ref[i], got[i]), 4)
            << kernel_level_name(level) << " x=" << x[i] << " ref=" << ref[i] << " got=" << got[i];
      }
    }
  }
  // NaN in, NaN out.
  for (KernelLevel level : kAllKernelLevels) {
    if (!cpu_supports_level(level)) continue;
    std::vector<float> g(16, std::numeric_limits<float>::quiet_NaN()), u(16, 1.0f);
    gated_activation_at(level, Activation::kSilu, g.data(), u.data(), 16);
    for (float v : g) EXPECT_TRUE(std::isnan(v)) << kernel_level_name(level);
  }
}

// log(sum e^x) at every level against a double-precision sum, on odd sizes,
// logits-like spreads, a -inf entry (a masked token) and one dominant value.
TEST(KernelsOps, LogSumExpMatchesDoubleAtEveryLevel) {
  std::mt19937 rng(21);
  std::normal_distribution<float> normal(0.0f, 4.0f);
  for (int64_t n : {1, 2, 7, 15, 16, 17, 33, 1001, 32000 + 3, 262144 + 5}) {
    for (int variant = 0; variant < 3; ++variant) {
      std::vector<float> x(n);
      for (float& v : x) v = normal(rng) + (variant == 1 ? 60.0f : 0.0f);
      if (variant == 2) {
        x[n / 2] = 300.0f;  // everything else is e^-300-ish next to it
        if (n > 1) x[0] = -std::numeric_limits<float>::infinity();
      }
      long double sum = 0, mx = *std::max_element(x.begin(), x.end());
      for (float v : x) sum += std::exp(static_cast<long double>(v) - mx);
      const double want = static_cast<double>(mx + std::log(sum));
      for (KernelLevel level : kAllKernelLevels) {
        if (!cpu_supports_level(level)) continue;
        const float got = log_sum_exp_at(level, x.data(), n);
        EXPECT_NEAR(got, want, 2e-6 * std::max(1.0, std::abs(want)))
            << kernel_level_name(level) << " n=" << n << " variant " << variant;
      }
    }
  }
}

TEST(KernelsOps, GatedSiluMultipliesByUp) {
  std::vector<float> gate = {0.0f, 1.0f, -2.0f}, up = {3.0f, 2.0f, 0.5f};
  gated_activation(Activation::kSilu, gate.data(), up.data(), 3);
  EXPECT_EQ(gate[0], 0.0f);
  EXPECT_NEAR(gate[1], 2.0f * 0.7310586f, 1e-6f);
  EXPECT_NEAR(gate[2], 0.5f * -0.2384058f, 1e-6f);
}

}  // namespace
}  // namespace tandem

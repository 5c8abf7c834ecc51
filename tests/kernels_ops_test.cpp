// Element-wise ops: the SIMD paths of the gated activations give the scalar
// reference's bits, on random inputs of odd lengths and on the edges of the
// GELU table (the +-10 clamps, f16 overflow, infinities, signed zeros).
#include <gtest/gtest.h>

#include <cmath>
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

TEST(KernelsOps, GatedSiluMultipliesByUp) {
  std::vector<float> gate = {0.0f, 1.0f, -2.0f}, up = {3.0f, 2.0f, 0.5f};
  gated_activation(Activation::kSilu, gate.data(), up.data(), 3);
  EXPECT_EQ(gate[0], 0.0f);
  EXPECT_NEAR(gate[1], 2.0f * 0.7310586f, 1e-6f);
  EXPECT_NEAR(gate[2], 0.5f * -0.2384058f, 1e-6f);
}

}  // namespace
}  // namespace tandem

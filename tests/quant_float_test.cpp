// IEEE binary16 and bfloat16 conversions: exact values, rounding ties,
// subnormals, overflow, infinities and NaN.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include <gtest/gtest.h>

#include "quant/quant.h"

namespace tandem {
namespace {

float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint32_t to_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
bool is_f16_nan(uint16_t h) { return (h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0; }

TEST(QuantF16, DecodesExactValues) {
  EXPECT_EQ(f16_to_f32(0x3c00), 1.0f);
  EXPECT_EQ(f16_to_f32(0xc000), -2.0f);
  EXPECT_EQ(f16_to_f32(0x7bff), 65504.0f);
  EXPECT_EQ(f16_to_f32(0x3555), 0x1.554p-2f);  // 0.333251953125
  EXPECT_EQ(f16_to_f32(0x0400), std::ldexp(1.0f, -14));  // smallest normal
  EXPECT_EQ(f16_to_f32(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_EQ(f16_to_f32(0x03ff), std::ldexp(1023.0f, -24));  // largest subnormal
  EXPECT_EQ(f16_to_f32(0x8001), -std::ldexp(1.0f, -24));
  EXPECT_EQ(to_bits(f16_to_f32(0x0000)), 0x00000000u);
  EXPECT_EQ(to_bits(f16_to_f32(0x8000)), 0x80000000u);  // -0 keeps its sign
  EXPECT_EQ(f16_to_f32(0x7c00), std::numeric_limits<float>::infinity());
  EXPECT_EQ(f16_to_f32(0xfc00), -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(f16_to_f32(0x7e00)));
  EXPECT_TRUE(std::isnan(f16_to_f32(0x7c01)));  // signalling NaN must not become inf
  EXPECT_TRUE(std::isnan(f16_to_f32(0xffff)));
}

TEST(QuantF16, EncodesExactValuesAndRoundsToNearestEven) {
  EXPECT_EQ(f32_to_f16(1.0f), 0x3c00);
  EXPECT_EQ(f32_to_f16(-2.0f), 0xc000);
  EXPECT_EQ(f32_to_f16(65504.0f), 0x7bff);
  EXPECT_EQ(f32_to_f16(0.1f), 0x2e66);  // 0.1 lies 0.4 ulp above 0x2e66
  EXPECT_EQ(f32_to_f16(-0.0f), 0x8000);
  // Ties: 1 + 2^-11 is halfway between 1 (even) and 1 + 2^-10 (odd).
  EXPECT_EQ(f32_to_f16(1.0f + 0x1p-11f), 0x3c00);
  EXPECT_EQ(f32_to_f16(1.0f + 3 * 0x1p-11f), 0x3c02);  // between 0x3c01 (odd) and 0x3c02
  EXPECT_EQ(f32_to_f16(1.0f + 0x1p-11f + 0x1p-23f), 0x3c01);  // just above the tie
  EXPECT_EQ(f32_to_f16(2049.0f), 0x6800);  // step 2 here: tie between 2048 and 2050
  EXPECT_EQ(f32_to_f16(2051.0f), 0x6802);
  // Overflow: 65520 is the tie between 65504 (odd) and 2^16, so it rounds to inf.
  EXPECT_EQ(f32_to_f16(65519.996f), 0x7bff);
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7c00);
  EXPECT_EQ(f32_to_f16(-1e9f), 0xfc00);
  EXPECT_EQ(f32_to_f16(std::numeric_limits<float>::infinity()), 0x7c00);
  EXPECT_EQ(f32_to_f16(-std::numeric_limits<float>::infinity()), 0xfc00);
  // Subnormals, in units of 2^-24.
  EXPECT_EQ(f32_to_f16(0x1p-24f), 0x0001);
  EXPECT_EQ(f32_to_f16(0x1p-25f), 0x0000);  // tie between 0 (even) and 1
  EXPECT_EQ(f32_to_f16(0x1.000002p-25f), 0x0001);  // just above the tie
  EXPECT_EQ(f32_to_f16(3 * 0x1p-25f), 0x0002);  // tie between 1 and 2 (even)
  EXPECT_EQ(f32_to_f16(-5 * 0x1p-25f), 0x8002);  // tie between 2 (even) and 3
  EXPECT_EQ(f32_to_f16(1e-10f), 0x0000);
  EXPECT_EQ(f32_to_f16(std::numeric_limits<float>::denorm_min()), 0x0000);
  EXPECT_EQ(f32_to_f16(std::ldexp(1023.0f, -24)), 0x03ff);
  EXPECT_EQ(f32_to_f16(0x1p-14f - 0x1p-25f), 0x0400);  // tie rounds up into the normals
  // NaN stays NaN, whatever its payload (a truncating conversion would give inf).
  EXPECT_TRUE(is_f16_nan(f32_to_f16(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_TRUE(is_f16_nan(f32_to_f16(from_bits(0x7f800001))));
  EXPECT_TRUE(is_f16_nan(f32_to_f16(from_bits(0xff800100))));
}

TEST(QuantF16, EveryHalfRoundTrips) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = f16_to_f32(static_cast<uint16_t>(h));
    if (is_f16_nan(static_cast<uint16_t>(h))) {
      ASSERT_TRUE(std::isnan(f)) << std::hex << h;
      ASSERT_TRUE(is_f16_nan(f32_to_f16(f))) << std::hex << h;
    } else {
      ASSERT_EQ(f32_to_f16(f), h) << std::hex << h;
    }
  }
}

// For any finite float, the encoding must be one of the two neighbouring halves
// and the nearer one. Checked against double arithmetic on a sweep of bit patterns.
TEST(QuantF16, EncodingIsNearestOnASweepOfFloats) {
  for (uint64_t u = 0; u < 0x80000000ull; u += 9973) {
    const float f = from_bits(static_cast<uint32_t>(u));
    if (std::isnan(f)) continue;
    const uint16_t h = f32_to_f16(f);
    const double x = f, got = f16_to_f32(h);
    if (std::isinf(got)) {
      ASSERT_GE(x, 65520.0) << std::hex << u;
      continue;
    }
    const double next_up = f16_to_f32(static_cast<uint16_t>(h + 1));
    const double next_down = h > 0 ? f16_to_f32(static_cast<uint16_t>(h - 1)) : -next_up;
    const double err = std::fabs(got - x);
    ASSERT_LE(err, std::fabs(next_up - x)) << std::hex << u;
    ASSERT_LE(err, std::fabs(next_down - x)) << std::hex << u;
    const bool tie = x != got && (err == std::fabs(next_up - x) || err == std::fabs(next_down - x));
    if (tie) {
      ASSERT_EQ(h & 1, 0) << "tie not to even " << std::hex << u;
    }
  }
}

TEST(QuantBf16, ExactValuesTiesAndSpecials) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(f32_to_bf16(-2.0f), 0xc000);
  EXPECT_EQ(bf16_to_f32(0x3f80), 1.0f);
  EXPECT_EQ(bf16_to_f32(0xc000), -2.0f);
  EXPECT_EQ(bf16_to_f32(0x4049), 3.140625f);
  EXPECT_EQ(f32_to_bf16(3.14159265f), 0x4049);
  // Ties to even: 0x3f808000 is halfway between 0x3f80 and 0x3f81.
  EXPECT_EQ(f32_to_bf16(from_bits(0x3f808000)), 0x3f80);
  EXPECT_EQ(f32_to_bf16(from_bits(0x3f818000)), 0x3f82);
  EXPECT_EQ(f32_to_bf16(from_bits(0x3f808001)), 0x3f81);
  EXPECT_EQ(f32_to_bf16(from_bits(0x3f807fff)), 0x3f80);
  // Rounding past the largest finite value gives inf; inf stays inf.
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::max()), 0x7f80);
  EXPECT_EQ(f32_to_bf16(-std::numeric_limits<float>::infinity()), 0xff80);
  EXPECT_EQ(bf16_to_f32(0x7f80), std::numeric_limits<float>::infinity());
  // Subnormals round like everything else (no flush to zero).
  EXPECT_EQ(f32_to_bf16(from_bits(0x00018000)), 0x0002);
  EXPECT_EQ(f32_to_bf16(from_bits(0x00008000)), 0x0000);
  EXPECT_EQ(f32_to_bf16(from_bits(0x80010000)), 0x8001);
  // A NaN whose payload lies only in the low half must not round or truncate to inf.
  EXPECT_EQ(f32_to_bf16(from_bits(0x7f800001)), 0x7fc0);
  EXPECT_EQ(f32_to_bf16(from_bits(0xffffffff)), 0xffff);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
}

TEST(QuantBf16, EveryBf16RoundTrips) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = bf16_to_f32(static_cast<uint16_t>(h));
    ASSERT_EQ(to_bits(f), h << 16);
    const bool nan = (h & 0x7f80) == 0x7f80 && (h & 0x7f) != 0;
    if (nan) {
      ASSERT_EQ(f32_to_bf16(f), h | 0x40) << std::hex << h;  // quieted
    } else {
      ASSERT_EQ(f32_to_bf16(f), h) << std::hex << h;
    }
  }
}

}  // namespace
}  // namespace tandem

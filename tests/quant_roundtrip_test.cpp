// Quantizers: agreement with ggml's reference quantizers (golden hashes),
// hand-checked small cases, quantize -> dequantize error bounds, and errors.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/error.h"
#include "quant/ggml_type.h"
#include "quant/quant.h"
#include "quant_test_data.h"

namespace tandem {
namespace {

using quant_test::fnv1a;
using quant_test::make_input;

std::vector<uint8_t> quantize(GgmlType t, const std::vector<float>& x) {
  std::vector<uint8_t> b(row_bytes(t, static_cast<int64_t>(x.size())), 0xcd);
  quantize_row(t, x.data(), b.data(), static_cast<int64_t>(x.size()));
  return b;
}

std::vector<float> roundtrip(GgmlType t, const std::vector<float>& x) {
  const auto b = quantize(t, x);
  std::vector<float> y(x.size());
  dequantize_row(t, b.data(), y.data(), static_cast<int64_t>(x.size()));
  return y;
}

// FNV-1a of the bytes that ggml's quantize_row_*_ref (ggml-org/ggml d99724f,
// built without FMA contraction) writes for make_input(256*11, 2024). Any
// difference in level choice, scale rounding or packing changes these.
TEST(QuantRoundtrip, MatchesGgmlReferenceQuantizers) {
  const struct {
    GgmlType t;
    uint64_t hash;
  } golden[] = {
      {GgmlType::Q4_0, 0xc2d670e210d32845ull}, {GgmlType::Q4_1, 0x092d51fe72167f6eull},
      {GgmlType::Q5_0, 0x422f26b8a6a63d50ull}, {GgmlType::Q5_1, 0x167b38ec53178ff6ull},
      {GgmlType::Q8_0, 0xcb91a36930344009ull}, {GgmlType::Q2_K, 0x0b464c811454be98ull},
      {GgmlType::Q3_K, 0x8fe913578bbf0e8dull}, {GgmlType::Q4_K, 0xa913be733421d0f0ull},
      {GgmlType::Q5_K, 0x0bb223749d8dc48aull}, {GgmlType::Q6_K, 0x00170f21f3cb1361ull},
  };
  const auto x = make_input(256 * 11, 2024);
  for (const auto& g : golden)
    EXPECT_EQ(fnv1a(quantize(g.t, x)), g.hash) << type_traits(g.t).name;
}

TEST(QuantRoundtrip, HandCheckedSmallCases) {
  std::vector<float> x(32);
  for (int j = 0; j < 32; ++j) x[j] = static_cast<float>(j - 16);
  // Q8_0: amax 16 -> d = 16/127; element 0 -> -127, element 16 -> 0, element 17 -> round(127/16) = 8.
  auto b = quantize(GgmlType::Q8_0, x);
  EXPECT_EQ((b[0] | b[1] << 8), f32_to_f16(16.0f / 127.0f));
  EXPECT_EQ(static_cast<int8_t>(b[2 + 0]), -127);
  EXPECT_EQ(static_cast<int8_t>(b[2 + 16]), 0);
  EXPECT_EQ(static_cast<int8_t>(b[2 + 17]), 8);
  EXPECT_EQ(static_cast<int8_t>(b[2 + 31]), 119);  // round(15*127/16 = 119.06)
  // Q4_0: the largest magnitude (-16, element 0) maps to level -8, so d = -16/-8 = 2;
  // element j -> trunc((j-16)/2 + 8.5): element 0 -> 0, element 16 -> 8, element 31 -> 16 clamped to 15.
  b = quantize(GgmlType::Q4_0, x);
  EXPECT_EQ((b[0] | b[1] << 8), 0x4000);
  EXPECT_EQ(b[2 + 0], 0x80);   // element 0 -> 0 (low nibble), element 16 -> 8 (high)
  EXPECT_EQ(b[2 + 15], 0xf8);  // element 15 -> trunc(-0.5 + 8.5) = 8, element 31 -> 15
  // All-zero input gives all-zero blocks (d = 0) for every format.
  const std::vector<float> zeros(512, 0.0f);
  for (GgmlType t : {GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q8_0, GgmlType::Q2_K,
                     GgmlType::Q3_K, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::MXFP4}) {
    const auto y = roundtrip(t, zeros);
    EXPECT_TRUE(std::all_of(y.begin(), y.end(), [](float v) { return v == 0.0f; })) << type_traits(t).name;
  }
}

TEST(QuantRoundtrip, PlainTypes) {
  const auto x = make_input(256 * 5, 7);
  EXPECT_EQ(roundtrip(GgmlType::F32, x), x);
  const auto h = roundtrip(GgmlType::F16, x);
  const auto bf = roundtrip(GgmlType::BF16, x);
  for (size_t i = 0; i < x.size(); ++i) {
    EXPECT_EQ(h[i], f16_to_f32(f32_to_f16(x[i])));
    EXPECT_EQ(bf[i], bf16_to_f32(f32_to_bf16(x[i])));
    // Nearest rounding: half an ulp relative (normal range), and an absolute
    // 2^-25 where f16 is subnormal.
    EXPECT_LE(std::fabs(h[i] - x[i]), std::max(std::fabs(x[i]) * 0x1p-11f, 0x1p-25f)) << i;
    EXPECT_LE(std::fabs(bf[i] - x[i]), std::fabs(x[i]) * 0x1p-8f) << i;
  }
}

// The 32-element formats have a per-element bound that follows from how the
// level is picked. With d the exact scale the quantizer used and d16 its f16
// rounding (what dequantization multiplies by):
//   Q8_0: d = amax/127, level = round(x/d)      -> |err| <= d/2 + 127|d16-d|
//   Q4_0: d = -max/8 (max = the signed value of largest magnitude), level in
//         [-8, 7] by round-half-up of x/d: d/2, except x/d > 7.5 (the far side
//         of the extreme value, clamped to 7) where it is d  (+ 8|d16-d|)
//   Q5_0: as Q4_0 with 16 and [-16, 15]                       (+ 16|d16-d|)
//   Q4_1/Q5_1: d = (max-min)/(2^bits-1), level = round((x-min)/d), value =
//         level*d16 + min16 -> d/2 + (2^bits-1)|d16-d| + |min16-min|
// plus a little float slop (relative 1e-5 of the block's magnitude).
struct BlockStats {
  float amax = 0, max = 0, min = 0;
};
BlockStats stats32(const float* x) {
  BlockStats s;
  s.min = x[0];
  s.max = x[0];
  float signed_max = 0;
  for (int j = 0; j < 32; ++j) {
    if (std::fabs(x[j]) > s.amax) {
      s.amax = std::fabs(x[j]);
      signed_max = x[j];
    }
    s.min = std::min(s.min, x[j]);
    s.max = std::max(s.max, x[j]);
  }
  s.amax = signed_max;  // keep the sign: Q4_0/Q5_0 scale by it
  return s;
}

float bound32(GgmlType t, const float* x, int j) {
  const BlockStats s = stats32(x);
  const float amax = std::fabs(s.amax);
  const float slop = 1e-5f * std::max(amax, 1e-30f);
  auto f16r = [](float v) { return f16_to_f32(f32_to_f16(v)); };
  switch (t) {
    case GgmlType::Q8_0: {
      const float d = amax / 127;
      return 0.5f * d + 127 * std::fabs(f16r(d) - d) + slop;
    }
    case GgmlType::Q4_0:
    case GgmlType::Q5_0: {
      const float levels = t == GgmlType::Q4_0 ? 8.0f : 16.0f;
      const float d = s.amax / -levels;
      const bool clamped = d != 0 && x[j] / d > levels - 0.5f;
      return (clamped ? 1.0f : 0.5f) * std::fabs(d) + levels * std::fabs(f16r(d) - d) + slop;
    }
    default: {
      const float top = t == GgmlType::Q4_1 ? 15.0f : 31.0f;
      const float d = (s.max - s.min) / top;
      return 0.5f * d + top * std::fabs(f16r(d) - d) + std::fabs(f16r(s.min) - s.min) + slop;
    }
  }
}

TEST(QuantRoundtrip, SmallBlockFormatsStayWithinTheirBound) {
  for (GgmlType t : {GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q5_0, GgmlType::Q4_1, GgmlType::Q5_1}) {
    for (uint64_t seed : {1u, 2u, 3u, 4u}) {
      const auto x = make_input(32 * 77, seed, static_cast<int>(seed));  // odd block count
      const auto y = roundtrip(t, x);
      float worst = 0;  // error / bound, reported to show the bound is tight
      for (size_t i = 0; i < x.size(); ++i) {
        const float* blk = x.data() + i / 32 * 32;
        const float bound = bound32(t, blk, static_cast<int>(i % 32));
        ASSERT_LE(std::fabs(y[i] - x[i]), bound) << type_traits(t).name << " seed " << seed << " element " << i;
        if (bound > 0) worst = std::max(worst, std::fabs(y[i] - x[i]) / bound);
      }
      EXPECT_GT(worst, 0.5f) << type_traits(t).name << ": bound is far from tight";
    }
  }
}

// K-quants: per super-block RMS error relative to the block's RMS, on
// bell-shaped data like real weights. Measured worst over 1200 such blocks:
// Q6_K 0.020, Q5_K 0.040, Q4_K 0.079, Q3_K 0.169, Q2_K 0.339 (means 0.017,
// 0.035, 0.069, 0.146, 0.288); the limits add about 25%. A packing or scale
// mistake gives errors of order 100%. (Harsher inputs, with outliers or
// sparse blocks, are covered bit-exactly by the golden test above.)
using quant_test::make_bell;
TEST(QuantRoundtrip, KQuantRelativeRmsError) {
  const struct {
    GgmlType t;
    double limit;
  } cases[] = {
      {GgmlType::Q6_K, 0.025}, {GgmlType::Q5_K, 0.05}, {GgmlType::Q4_K, 0.10},
      {GgmlType::Q3_K, 0.21},  {GgmlType::Q2_K, 0.42},
  };
  for (const auto& c : cases) {
    double worst = 0, sum = 0;
    int blocks = 0;
    for (uint64_t seed : {11u, 12u, 13u}) {
      const auto x = make_bell(256 * 13, seed);
      const auto y = roundtrip(c.t, x);
      for (size_t b0 = 0; b0 < x.size(); b0 += 256) {
        double e2 = 0, x2 = 0;
        for (size_t i = b0; i < b0 + 256; ++i) {
          e2 += (double(y[i]) - x[i]) * (double(y[i]) - x[i]);
          x2 += double(x[i]) * x[i];
        }
        if (x2 == 0) {
          EXPECT_EQ(e2, 0.0) << type_traits(c.t).name << " zero block at " << b0;
          continue;
        }
        const double rel = std::sqrt(e2 / x2);
        EXPECT_LT(rel, c.limit) << type_traits(c.t).name << " seed " << seed << " block at " << b0;
        worst = std::max(worst, rel);
        sum += rel;
        ++blocks;
      }
    }
    std::printf("  %s: relative RMS error worst %.4f mean %.4f over %d blocks (limit %.3f)\n",
                std::string(type_traits(c.t).name).c_str(), worst, sum / blocks, blocks, c.limit);
  }
}

// Garbage in (NaN, inf, huge values from a corrupt source tensor) must give
// garbage out, not undefined behaviour; finite blocks elsewhere in the row are
// unaffected.
TEST(QuantRoundtrip, NonFiniteInputStaysContained) {
  auto x = make_bell(512, 5);
  x[3] = std::numeric_limits<float>::quiet_NaN();
  x[40] = std::numeric_limits<float>::infinity();
  x[70] = -std::numeric_limits<float>::infinity();
  x[100] = 3e38f;
  for (GgmlType t : {GgmlType::F16, GgmlType::BF16, GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1,
                     GgmlType::Q8_0, GgmlType::Q2_K, GgmlType::Q3_K, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K}) {
    const auto y = roundtrip(t, x);
    const auto clean = roundtrip(t, std::vector<float>(x.begin() + 256, x.end()));
    for (size_t i = 256; i < 512; ++i) ASSERT_EQ(y[i], clean[i - 256]) << type_traits(t).name;
  }
}

TEST(QuantRoundtrip, RejectsUnsupportedTypesAndPartialBlocks) {
  std::vector<float> x(256, 1.0f);
  std::vector<uint8_t> buf(4096);
  auto kind_of = [](auto fn) {
    try {
      fn();
    } catch (const Error& e) {
      return std::make_pair(e.kind(), std::string(e.what()));
    }
    return std::make_pair(ErrorKind::kIo, std::string("no error"));
  };
  for (GgmlType t : {GgmlType::Q8_1, GgmlType::Q8_K, GgmlType::I8, GgmlType::I32, GgmlType::F64}) {
    const std::string name(type_traits(t).name);
    auto [k1, m1] = kind_of([&] { dequantize_row(t, buf.data(), x.data(), 256); });
    EXPECT_EQ(k1, ErrorKind::kUnsupported) << name;
    EXPECT_NE(m1.find(name), std::string::npos) << m1;
    auto [k2, m2] = kind_of([&] { quantize_row(t, x.data(), buf.data(), 256); });
    EXPECT_EQ(k2, ErrorKind::kUnsupported) << name;
    EXPECT_NE(m2.find(name), std::string::npos) << m2;
  }
  // Ids 4 and 5 were removed from ggml; 99 never existed.
  for (uint32_t id : {4u, 5u, 99u}) {
    auto [k, m] = kind_of([&] { dequantize_row(static_cast<GgmlType>(id), buf.data(), x.data(), 32); });
    EXPECT_EQ(k, ErrorKind::kUnsupported);
    EXPECT_NE(m.find(std::to_string(id)), std::string::npos) << m;
  }
  for (auto [t, n] : {std::pair{GgmlType::Q4_0, int64_t{48}}, std::pair{GgmlType::Q4_K, int64_t{128}},
                      std::pair{GgmlType::Q6_K, int64_t{-256}}}) {
    auto [k1, m1] = kind_of([&] { dequantize_row(t, buf.data(), x.data(), n); });
    EXPECT_EQ(k1, ErrorKind::kInvalidArgument) << m1;
    EXPECT_NE(m1.find(std::string(type_traits(t).name)), std::string::npos) << m1;
    auto [k2, m2] = kind_of([&] { quantize_row(t, x.data(), buf.data(), n); });
    EXPECT_EQ(k2, ErrorKind::kInvalidArgument) << m2;
  }
  // Zero elements is a valid, empty row.
  EXPECT_NO_THROW(dequantize_row(GgmlType::Q4_K, buf.data(), x.data(), 0));
}

}  // namespace
}  // namespace tandem

// Dot-product kernels: the scalar reference against a double-precision dot of
// the dequantized rows, every SIMD level this CPU has against the reference,
// and the activation quantizers against hand-worked blocks.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "quant/quant_blocks.h"
#include "core/error.h"
#include "quant/quant.h"
#include "kernels/vec_dot.h"
#include "kernels/vec_dot_impl.h"

namespace tandem {
namespace {

constexpr GgmlType kWeightTypes[] = {GgmlType::F32,  GgmlType::F16,  GgmlType::BF16, GgmlType::Q4_0,
                                     GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q8_0,
                                     GgmlType::Q2_K, GgmlType::Q3_K, GgmlType::Q4_K, GgmlType::Q5_K,
                                     GgmlType::Q6_K, GgmlType::MXFP4};
// Odd counts, so no kernel can rely on pairs of blocks or a full unroll.
constexpr int64_t kBlockCounts[] = {1, 3, 7, 33};
constexpr uint32_t kSeeds[] = {1, 2, 3};
constexpr double kEps = 1.0 / (1 << 24);  // unit roundoff of float

bool is_float_type(GgmlType t) { return t == GgmlType::F32 || t == GgmlType::F16 || t == GgmlType::BF16; }

std::string name(GgmlType t) { return std::string(type_traits(t).name); }

// Elements for `blocks` blocks; the float types use the count directly (plus
// an odd tail) so vector kernels must handle lengths that are not a multiple
// of their width.
int64_t elems_for(GgmlType t, int64_t blocks) {
  if (is_float_type(t)) return blocks * 37 + 5;
  return blocks * type_traits(t).block_elems;
}

// A row of weights in type t. The quantized formats get random bytes (every
// bit pattern of quants, scales and mins is a valid block) with the half
// scales overwritten by finite values, so kernels meet e.g. q8_0 quants of
// -128 and q6_K scales of -128 that a quantizer would rarely produce.
std::vector<uint8_t> random_weights(GgmlType t, int64_t n, std::mt19937& rng) {
  std::vector<uint8_t> buf(row_bytes(t, n));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> scale(0.001f, 0.05f);
  std::uniform_int_distribution<int> byte(0, 255);
  auto half = [&] { return f32_to_f16(scale(rng) * (byte(rng) & 1 ? 1.0f : -1.0f)); };
  if (is_float_type(t)) {
    for (int64_t i = 0; i < n; ++i) {
      const float v = normal(rng);
      if (t == GgmlType::F32) std::memcpy(&buf[i * 4], &v, 4);
      const uint16_t h = t == GgmlType::F16 ? f32_to_f16(v) : f32_to_bf16(v);
      if (t != GgmlType::F32) std::memcpy(&buf[i * 2], &h, 2);
    }
    return buf;
  }
  for (auto& b : buf) b = static_cast<uint8_t>(byte(rng));
  const int64_t nb = n / type_traits(t).block_elems;
  for (int64_t b = 0; b < nb; ++b) {
    uint8_t* p = buf.data() + b * type_traits(t).block_bytes;
    switch (t) {
      case GgmlType::Q4_0: reinterpret_cast<BlockQ4_0*>(p)->d = half(); break;
      case GgmlType::Q5_0: reinterpret_cast<BlockQ5_0*>(p)->d = half(); break;
      case GgmlType::Q8_0: reinterpret_cast<BlockQ8_0*>(p)->d = half(); break;
      case GgmlType::Q4_1: reinterpret_cast<BlockQ4_1*>(p)->d = half(), reinterpret_cast<BlockQ4_1*>(p)->m = half(); break;
      case GgmlType::Q5_1: reinterpret_cast<BlockQ5_1*>(p)->d = half(), reinterpret_cast<BlockQ5_1*>(p)->m = half(); break;
      case GgmlType::Q2_K: reinterpret_cast<BlockQ2K*>(p)->d = half(), reinterpret_cast<BlockQ2K*>(p)->dmin = half(); break;
      case GgmlType::Q3_K: reinterpret_cast<BlockQ3K*>(p)->d = half(); break;
      case GgmlType::Q4_K: reinterpret_cast<BlockQ4K*>(p)->d = half(), reinterpret_cast<BlockQ4K*>(p)->dmin = half(); break;
      case GgmlType::Q5_K: reinterpret_cast<BlockQ5K*>(p)->d = half(), reinterpret_cast<BlockQ5K*>(p)->dmin = half(); break;
      case GgmlType::Q6_K: reinterpret_cast<BlockQ6K*>(p)->d = half(); break;
      // Exponents around 2^0 (random bytes would overflow the sums), and now
      // and then the subnormal scales of e = 0 and 1.
      case GgmlType::MXFP4: {
        const int r = byte(rng);
        reinterpret_cast<BlockMXFP4*>(p)->e = static_cast<uint8_t>(r < 16 ? r % 2 : 112 + r % 24);
        break;
      }
      default: ADD_FAILURE() << "no generator for " << name(t);
    }
  }
  return buf;
}

// Activations with a spread of magnitudes, one outlier and (when there is
// room) an all-zero stretch, which exercises the quantizers' d = 0 paths.
std::vector<float> random_activations(int64_t n, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(n);
  for (auto& v : x) v = normal(rng) * (rng() % 8 == 0 ? 10.0f : 1.0f);
  x[rng() % n] = 60.0f;
  if (n >= 512)
    for (int64_t i = 256; i < 512; ++i) x[i] = 0.0f;
  return x;
}

// The activation values the kernel sees, i.e. the quantized row read back.
std::vector<float> activation_values(GgmlType act, const std::vector<uint8_t>& a, int64_t n) {
  std::vector<float> v(n);
  if (act == GgmlType::Q8_1) {
    const auto* b = reinterpret_cast<const BlockQ8_1*>(a.data());
    for (int64_t i = 0; i < n; ++i) v[i] = f16_to_f32(b[i / kQK].d) * b[i / kQK].qs[i % kQK];
  } else if (act == GgmlType::Q8_K) {
    const auto* b = reinterpret_cast<const BlockQ8K*>(a.data());
    for (int64_t i = 0; i < n; ++i) v[i] = b[i / kQKK].d * b[i / kQKK].qs[i % kQKK];
  } else {
    dequantize_row(act, a.data(), v.data(), n);
  }
  return v;
}

// For the formats with a separate offset (x = d*q + m, or d*sc*q - dmin*m),
// the offset of each element: the row dequantized with its quant bits zeroed.
// Kernels round the scaled and the offset parts separately, so their error
// scales with |scaled part| + |offset part|, which may exceed |x| a lot.
std::vector<float> element_offsets(GgmlType t, std::vector<uint8_t> w, int64_t n) {
  std::vector<float> off(n, 0.0f);
  const int64_t nb = n / type_traits(t).block_elems;
  for (int64_t b = 0; b < nb; ++b) {
    uint8_t* p = w.data() + b * type_traits(t).block_bytes;
    switch (t) {
      case GgmlType::Q4_1: std::memset(reinterpret_cast<BlockQ4_1*>(p)->qs, 0, 16); break;
      case GgmlType::Q5_1:
        std::memset(reinterpret_cast<BlockQ5_1*>(p)->qs, 0, 16);
        std::memset(reinterpret_cast<BlockQ5_1*>(p)->qh, 0, 4);
        break;
      case GgmlType::Q2_K: std::memset(reinterpret_cast<BlockQ2K*>(p)->qs, 0, 64); break;
      case GgmlType::Q4_K: std::memset(reinterpret_cast<BlockQ4K*>(p)->qs, 0, 128); break;
      case GgmlType::Q5_K:
        std::memset(reinterpret_cast<BlockQ5K*>(p)->qs, 0, 128);
        std::memset(reinterpret_cast<BlockQ5K*>(p)->qh, 0, 32);
        break;
      default: return off;
    }
  }
  dequantize_row(t, w.data(), off.data(), n);
  return off;
}

struct Case {
  GgmlType type;
  int64_t n;
  std::vector<uint8_t> w, a;
  double exact = 0;      // the dequantized rows dotted in double
  double magnitude = 0;  // sum of |w_i a_i|, widened by the offsets (see above)
  double format_slack = 0;  // q8_1's s is rounded to f16 on its own
  int64_t float_ops = 0;    // float additions on the longest accumulation chain
};

Case make_case(GgmlType t, int64_t blocks, uint32_t seed) {
  std::mt19937 rng(seed * 7919 + static_cast<uint32_t>(t) * 131 + static_cast<uint32_t>(blocks));
  Case c;
  c.type = t;
  c.n = elems_for(t, blocks);
  c.w = random_weights(t, c.n, rng);
  const GgmlType act = vec_dot_type(t);
  const std::vector<float> x = random_activations(c.n, rng);
  c.a.resize(row_bytes(act, c.n));
  quantize_activations(act, x.data(), c.a.data(), c.n);

  std::vector<float> wv(c.n);
  dequantize_row(t, c.w.data(), wv.data(), c.n);
  const std::vector<float> av = activation_values(act, c.a, c.n);
  const std::vector<float> off = element_offsets(t, c.w, c.n);
  for (int64_t i = 0; i < c.n; ++i) {
    c.exact += static_cast<double>(wv[i]) * av[i];
    c.magnitude += (std::fabs(static_cast<double>(wv[i])) + 2 * std::fabs(off[i])) * std::fabs(av[i]);
  }
  if (act == GgmlType::Q8_1) {
    const auto* ab = reinterpret_cast<const BlockQ8_1*>(c.a.data());
    for (int64_t b = 0; b < c.n / kQK; ++b) {
      double qsum = 0;
      for (int j = 0; j < kQK; ++j) qsum += ab[b].qs[j];
      const double m = off[b * kQK];
      c.format_slack += std::fabs(m) * std::fabs(f16_to_f32(ab[b].s) - f16_to_f32(ab[b].d) * qsum);
    }
  }
  c.float_ops = is_float_type(t) ? c.n / 8 : c.n / type_traits(t).block_elems;
  return c;
}

// Each float operation on a chain of partial sums, none larger than
// `magnitude`, errs by at most kEps times that; a few more for the scales'
// products and the final reduction.
double rounding_budget(const Case& c) { return (c.float_ops + 16) * kEps * c.magnitude; }

TEST(KernelsDotTest, ScalarRefMatchesDequantizedDot) {
  for (GgmlType t : kWeightTypes)
    for (int64_t blocks : kBlockCounts)
      for (uint32_t seed : kSeeds) {
        const Case c = make_case(t, blocks, seed);
        const float got = vec_dot_ref_fn(t)(c.n, c.w.data(), c.a.data());
        ASSERT_TRUE(std::isfinite(got));
        EXPECT_LE(std::fabs(got - c.exact), rounding_budget(c) + c.format_slack)
            << name(t) << " blocks=" << blocks << " seed=" << seed << " got=" << got << " exact=" << c.exact
            << " magnitude=" << c.magnitude;
      }
}

// SIMD kernels compute the same integer sums as the reference; only the order
// of the float accumulation differs, so each may err by the rounding budget
// and the two by twice that (about 1e-6 of the magnitude for 33 blocks).
TEST(KernelsDotTest, EverySupportedLevelMatchesScalarRef) {
  int levels_run = 0;
  for (KernelLevel level : kAllKernelLevels) {
    if (!cpu_supports_level(level)) continue;
    ++levels_run;
    for (GgmlType t : kWeightTypes) {
      const VecDotFn fn = vec_dot_fn_for_level(t, level);
      ASSERT_NE(fn, nullptr);
      for (int64_t blocks : kBlockCounts)
        for (uint32_t seed : kSeeds) {
          const Case c = make_case(t, blocks, seed);
          const float ref = vec_dot_ref_fn(t)(c.n, c.w.data(), c.a.data());
          const float got = fn(c.n, c.w.data(), c.a.data());
          EXPECT_LE(std::fabs(got - ref), 2 * rounding_budget(c))
              << name(t) << " level=" << kernel_level_name(level) << " blocks=" << blocks << " seed=" << seed
              << " got=" << got << " ref=" << ref << " magnitude=" << c.magnitude;
          // MXFP4's dots all run the reference's one chain: the same bits.
          if (t == GgmlType::MXFP4) {
            EXPECT_EQ(got, ref) << kernel_level_name(level) << " blocks=" << blocks;
          }
        }
    }
  }
  EXPECT_GE(levels_run, 1);
  std::printf("kernel levels tested: %d, dispatcher uses %s\n", levels_run, cpu_kernel_level());
}

TEST(KernelsDotTest, DispatcherUsesSupportedLevel) {
  EXPECT_TRUE(cpu_supports_level(active_kernel_level()));
  EXPECT_STREQ(cpu_kernel_level(), kernel_level_name(active_kernel_level()));
  for (GgmlType t : kWeightTypes) EXPECT_EQ(vec_dot_fn(t), vec_dot_fn_for_level(t, active_kernel_level()));
}

TEST(KernelsDotTest, KernelLevelRequestParsing) {
  const KernelLevel best = best_kernel_level();
  std::string warning;
  EXPECT_EQ(choose_kernel_level("", best, &warning), best);
  EXPECT_EQ(warning, "");
  EXPECT_EQ(choose_kernel_level("scalar", best), KernelLevel::kScalar);
  EXPECT_EQ(choose_kernel_level("bogus", best, &warning), best);
  EXPECT_NE(warning.find("bogus is not one of scalar, avx2, avx512"), std::string::npos) << warning;
  // A level above what the CPU (here: the given best) offers falls back.
  EXPECT_EQ(choose_kernel_level("avx2", KernelLevel::kScalar, &warning), KernelLevel::kScalar);
  EXPECT_NE(warning.find("not supported by this CPU"), std::string::npos) << warning;
  EXPECT_EQ(choose_kernel_level("avx512-vnni", KernelLevel::kScalar), KernelLevel::kScalar);
  if (cpu_supports_level(KernelLevel::kAvx2)) {
    const KernelLevel l = choose_kernel_level("avx2", best);
    EXPECT_TRUE(l == KernelLevel::kAvx2 || l == KernelLevel::kAvx2Vnni);
    EXPECT_EQ(choose_kernel_level("avx2", KernelLevel::kAvx2), KernelLevel::kAvx2);
  }
}

TEST(KernelsDotTest, VecDotTypes) {
  EXPECT_EQ(vec_dot_type(GgmlType::F32), GgmlType::F32);
  EXPECT_EQ(vec_dot_type(GgmlType::F16), GgmlType::F16);
  EXPECT_EQ(vec_dot_type(GgmlType::BF16), GgmlType::BF16);
  for (GgmlType t : {GgmlType::Q4_0, GgmlType::Q5_0, GgmlType::Q8_0, GgmlType::MXFP4})
    EXPECT_EQ(vec_dot_type(t), GgmlType::Q8_0);
  for (GgmlType t : {GgmlType::Q4_1, GgmlType::Q5_1}) EXPECT_EQ(vec_dot_type(t), GgmlType::Q8_1);
  for (GgmlType t : {GgmlType::Q2_K, GgmlType::Q3_K, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K})
    EXPECT_EQ(vec_dot_type(t), GgmlType::Q8_K);
  EXPECT_THROW(vec_dot_type(GgmlType::Q8_K), Error);
  EXPECT_THROW(vec_dot_type(GgmlType::I32), Error);
  EXPECT_THROW(vec_dot_ref_fn(GgmlType::Q8_1), Error);
  EXPECT_THROW(vec_dot_fn(GgmlType::I8), Error);
  std::vector<float> x(33, 1.0f);
  std::vector<uint8_t> out(1024);
  EXPECT_THROW(quantize_activations(GgmlType::Q8_0, x.data(), out.data(), 33), Error);
  EXPECT_THROW(quantize_activations(GgmlType::Q4_0, x.data(), out.data(), 32), Error);
}

// With amax = 127 the q8_0/q8_1 scale is exactly 1, so each quant is just
// x rounded, and ggml's reference rounds halves away from zero.
TEST(KernelsDotTest, QuantizeQ8_0And1ByHand) {
  std::vector<float> x(64, 0.0f);
  const float head[] = {127.0f, -3.4f, 2.6f, 0.5f, -0.5f, 2.5f, -126.6f, 0.49f};
  std::memcpy(x.data(), head, sizeof(head));
  const int8_t want[] = {127, -3, 3, 1, -1, 3, -127, 0};
  // x[32..63] stays zero: that block must get d = 0 and zero quants.

  BlockQ8_0 q0[2];
  quantize_activations(GgmlType::Q8_0, x.data(), q0, 64);
  EXPECT_EQ(f16_to_f32(q0[0].d), 1.0f);
  for (int j = 0; j < 8; ++j) EXPECT_EQ(q0[0].qs[j], want[j]) << j;
  for (int j = 8; j < 32; ++j) EXPECT_EQ(q0[0].qs[j], 0);
  EXPECT_EQ(q0[1].d, 0);
  for (int j = 0; j < 32; ++j) EXPECT_EQ(q0[1].qs[j], 0);

  BlockQ8_1 q1[2];
  quantize_activations(GgmlType::Q8_1, x.data(), q1, 64);
  EXPECT_EQ(f16_to_f32(q1[0].d), 1.0f);
  for (int j = 0; j < 8; ++j) EXPECT_EQ(q1[0].qs[j], want[j]) << j;
  EXPECT_EQ(f16_to_f32(q1[0].s), 127 - 3 + 3 + 1 - 1 + 3 - 127);
  EXPECT_EQ(q1[1].s, 0);

  // s is d*sum with the float d: amax 254 gives d = 2, sum 1 + 127 = 128.
  std::vector<float> y(32, 0.0f);
  y[0] = 254.0f;
  y[1] = 2.0f;
  quantize_activations(GgmlType::Q8_1, y.data(), q1, 32);
  EXPECT_EQ(f16_to_f32(q1[0].d), 2.0f);
  EXPECT_EQ(q1[0].qs[1], 1);
  EXPECT_EQ(f16_to_f32(q1[0].s), 256.0f);
}

// q8_K maps the signed extreme to -127: a positive maximum gives d < 0.
// Rounding is half to even here (ggml's nearest_int).
TEST(KernelsDotTest, QuantizeQ8KByHand) {
  std::vector<float> x(3 * 256, 0.0f);
  x[5] = 127.0f;
  x[0] = 2.5f;
  x[1] = -0.5f;
  x[2] = 1.5f;
  x[17] = -100.2f;
  // Second block: negative extreme, d = 2.
  x[256 + 0] = -254.0f;
  x[256 + 1] = 3.0f;
  x[256 + 2] = 5.0f;
  x[256 + 3] = -1.0f;
  x[256 + 200] = 253.0f;
  // Third block all zero.
  BlockQ8K q[3];
  quantize_activations(GgmlType::Q8_K, x.data(), q, 3 * 256);

  EXPECT_EQ(q[0].d, -1.0f);
  EXPECT_EQ(q[0].qs[5], -127);
  EXPECT_EQ(q[0].qs[0], -2);
  EXPECT_EQ(q[0].qs[1], 0);
  EXPECT_EQ(q[0].qs[2], -2);
  EXPECT_EQ(q[0].qs[17], 100);
  EXPECT_EQ(q[0].bsums[0], -2 + 0 - 2 - 127);
  EXPECT_EQ(q[0].bsums[1], 100);
  for (int g = 2; g < 16; ++g) EXPECT_EQ(q[0].bsums[g], 0);

  EXPECT_EQ(q[1].d, 2.0f);
  EXPECT_EQ(q[1].qs[0], -127);
  EXPECT_EQ(q[1].qs[1], 2);   // 1.5 -> 2
  EXPECT_EQ(q[1].qs[2], 2);   // 2.5 -> 2
  EXPECT_EQ(q[1].qs[3], 0);   // -0.5 -> 0
  EXPECT_EQ(q[1].qs[200], 126);  // 126.5 -> 126
  EXPECT_EQ(q[1].bsums[0], -127 + 2 + 2);
  EXPECT_EQ(q[1].bsums[12], 126);

  EXPECT_EQ(q[2].d, 0.0f);
  for (int j = 0; j < 256; ++j) ASSERT_EQ(q[2].qs[j], 0);
  for (int g = 0; g < 16; ++g) EXPECT_EQ(q[2].bsums[g], 0);
}

// The word-at-a-time scale unpackers the SIMD kernels use agree with the
// one-at-a-time definitions on arbitrary bytes.
TEST(KernelsDotTest, KQuantScaleUnpacking) {
  std::mt19937 rng(5);
  for (int rep = 0; rep < 200; ++rep) {
    uint8_t packed[12];
    for (auto& b : packed) b = static_cast<uint8_t>(rng());
    uint32_t words[4];
    k4_unpack_words(packed, words);
    uint8_t bytes[16];
    std::memcpy(bytes, words, 16);
    for (int j = 0; j < 8; ++j) {
      uint8_t sc, m;
      k4_scale_min(j, packed, &sc, &m);
      ASSERT_EQ(bytes[j], sc) << j;
      ASSERT_EQ(bytes[8 + j], m) << j;
    }
    int8_t q3[16];
    k3_scales(packed, q3);
    for (int j = 0; j < 16; ++j) {
      const int lo = j < 8 ? (packed[j] & 0xF) : (packed[j - 8] >> 4);
      const int hi = (packed[8 + j % 4] >> (2 * (j / 4))) & 3;
      ASSERT_EQ(q3[j], (lo | (hi << 4)) - 32) << j;
    }
  }
}

TEST(KernelsDotTest, FloatActivationsConvert) {
  const float x[4] = {1.0f, -2.5f, 65504.0f, 1.0f / 3};
  uint16_t h[4], b[4];
  float f[4];
  quantize_activations(GgmlType::F16, x, h, 4);
  quantize_activations(GgmlType::BF16, x, b, 4);
  quantize_activations(GgmlType::F32, x, f, 4);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(h[i], f32_to_f16(x[i]));
    EXPECT_EQ(b[i], f32_to_bf16(x[i]));
    EXPECT_EQ(f[i], x[i]);
  }
}

}  // namespace
}  // namespace tandem

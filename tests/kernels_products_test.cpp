// Tiled matmul kernels (kernels/product_kernels.h): every level this CPU runs against the
// scalar reference, bit for bit; batch invariance (a row's outputs do not
// depend on the rows computed with it) and prefill == decode, bit for bit;
// the reference against vec_dot's reference within a float-order bound; the
// activation preparation against quantize_activations; SIMD packers against
// the scalar ones.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "quant/quant_blocks.h"
#include "core/error.h"
#include "quant/quant.h"
#include "runtime/thread_pool.h"
#include "kernels/vec_dot.h"
#include "kernels/kernel_builds.h"
#include "kernels/product_kernels.h"
#include "kernels/products.h"
#include "kernels/vec_dot_impl.h"
#include "kernels/matmul.h"
#include "kernels/stream_tuning.h"

namespace tandem {
namespace {

constexpr GgmlType kTypes[] = {GgmlType::Q4_0, GgmlType::Q5_0, GgmlType::Q8_0, GgmlType::Q4_K,
                               GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::F32,  GgmlType::F16,
                               GgmlType::BF16, GgmlType::MXFP4};
// Row counts on both sides of the 8-row groups, including 1 (decode).
constexpr int64_t kRowCounts[] = {1, 2, 3, 5, 8, 9, 13};
constexpr double kEps = 1.0 / (1 << 24);

std::string name(GgmlType t) { return std::string(type_traits(t).name); }
bool is_float(GgmlType t) { return gemm_class(t) == GemmClass::kFloat; }

std::vector<KernelLevel> levels() {
  std::vector<KernelLevel> out;
  for (KernelLevel l : kAllKernelLevels)
    if (cpu_supports_level(l)) out.push_back(l);
  return out;
}

// Columns: an odd number of blocks; float types get a width that is no
// multiple of any vector length.
int64_t cols_for(GgmlType t, int64_t blocks) {
  return is_float(t) ? blocks * 37 + 5 : blocks * type_traits(t).block_elems;
}

// A matrix of `rows` random rows. Quantized formats get random bytes (every
// bit pattern of quants, scales and mins is a valid block) with finite f16
// scales, so kernels meet extreme quants a quantizer rarely writes.
std::vector<uint8_t> random_matrix(GgmlType t, int64_t rows, int64_t cols, std::mt19937& rng) {
  const size_t rb = row_bytes(t, cols);
  std::vector<uint8_t> buf(rb * rows);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> scale(0.001f, 0.05f);
  auto half = [&] { return f32_to_f16(scale(rng) * (rng() & 1 ? 1.0f : -1.0f)); };
  if (is_float(t)) {
    for (int64_t i = 0; i < rows * cols; ++i) {
      const float v = normal(rng);
      if (t == GgmlType::F32) std::memcpy(&buf[i * 4], &v, 4);
      const uint16_t h = t == GgmlType::F16 ? f32_to_f16(v) : f32_to_bf16(v);
      if (t != GgmlType::F32) std::memcpy(&buf[i * 2], &h, 2);
    }
    return buf;
  }
  for (auto& b : buf) b = static_cast<uint8_t>(rng());
  const size_t bb = type_traits(t).block_bytes;
  for (size_t off = 0; off < buf.size(); off += bb) {
    uint8_t* p = buf.data() + off;
    const uint16_t d = half(), dmin = half();
    switch (t) {
      case GgmlType::Q4_0: reinterpret_cast<BlockQ4_0*>(p)->d = d; break;
      case GgmlType::Q5_0: reinterpret_cast<BlockQ5_0*>(p)->d = d; break;
      case GgmlType::Q8_0: reinterpret_cast<BlockQ8_0*>(p)->d = d; break;
      case GgmlType::Q4_K: reinterpret_cast<BlockQ4K*>(p)->d = d, reinterpret_cast<BlockQ4K*>(p)->dmin = dmin; break;
      case GgmlType::Q5_K: reinterpret_cast<BlockQ5K*>(p)->d = d, reinterpret_cast<BlockQ5K*>(p)->dmin = dmin; break;
      case GgmlType::Q6_K: reinterpret_cast<BlockQ6K*>(p)->d = d; break;
      case GgmlType::MXFP4:
        // Scales 2^-18 .. 2^1, and now and then e = 0 or 1: the subnormal
        // scales whose bf16 panel form must stay exact.
        reinterpret_cast<BlockMXFP4*>(p)->e = static_cast<uint8_t>(rng() % 16 == 0 ? rng() % 2 : 110 + rng() % 20);
        break;
      default: ADD_FAILURE() << "no generator for " << name(t);
    }
  }
  return buf;
}

std::vector<float> random_acts(int64_t rows, int64_t cols, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(rows * cols);
  for (auto& v : x) v = normal(rng) * (rng() % 8 == 0 ? 10.0f : 1.0f);
  // An all-zero block in some row exercises the quantizers' d = 0 paths.
  if (rows > 1 && cols >= 256)
    for (int64_t i = 0; i < 256; ++i) x[cols + i] = 0.0f;
  return x;
}

struct Problem {
  GgmlType type;
  int64_t rows, cols;  // of W
  std::vector<uint8_t> w;
  WeightMatrix W;
};

Problem make_problem(GgmlType t, int64_t rows, int64_t blocks, std::mt19937& rng) {
  Problem p;
  p.type = t;
  p.rows = rows;
  p.cols = cols_for(t, blocks);
  p.w = random_matrix(t, rows, p.cols, rng);
  p.W.type = t;
  p.W.data = p.w.data();
  p.W.cols = p.cols;
  p.W.rows = rows;
  p.W.row_stride = row_bytes(t, p.cols);
  return p;
}

std::vector<float> matmul(const Problem& p, const std::vector<float>& x, int64_t n, KernelLevel level,
                          ThreadPool& pool, const StreamTuning& tuning = stream_tuning()) {
  Matmul mm(level, tuning);
  // Padding the output rows (ldy > W.rows) checks nothing is written past a row.
  const int64_t ldy = p.rows + 3;
  std::vector<float> y(n * ldy, -7.0f);
  mm.run(p.W, x.data(), p.cols, n, y.data(), ldy, pool);
  std::vector<float> out(n * p.rows);
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t o = 0; o < p.rows; ++o) out[r * p.rows + o] = y[r * ldy + o];
    for (int64_t o = p.rows; o < ldy; ++o) EXPECT_EQ(y[r * ldy + o], -7.0f) << "wrote past row " << r;
  }
  return out;
}

bool same_bits(float a, float b) { return std::memcmp(&a, &b, 4) == 0; }

// Every level, every row count: the same bits as the scalar level, and each
// row the same bits as that row computed alone (decode).
TEST(KernelsGemm, EveryLevelBitExactAndBatchInvariant) {
  ThreadPool pool(2);
  std::mt19937 rng(11);
  for (GgmlType t : kTypes) {
    // 37 weight rows: two full tiles and a partial one.
    const Problem p = make_problem(t, 37, 3, rng);
    const int64_t max_rows = kRowCounts[std::size(kRowCounts) - 1];
    const std::vector<float> x = random_acts(max_rows, p.cols, rng);
    const std::vector<float> ref = matmul(p, x, max_rows, KernelLevel::kScalar, pool);
    for (KernelLevel level : levels()) {
      std::vector<std::vector<float>> alone(max_rows);
      for (int64_t r = 0; r < max_rows; ++r) {
        const std::vector<float> xr(x.begin() + r * p.cols, x.begin() + (r + 1) * p.cols);
        alone[r] = matmul(p, xr, 1, level, pool);
      }
      for (int64_t n : kRowCounts) {
        const std::vector<float> y = matmul(p, x, n, level, pool);
        for (int64_t r = 0; r < n; ++r)
          for (int64_t o = 0; o < p.rows; ++o) {
            const float got = y[r * p.rows + o];
            ASSERT_TRUE(same_bits(got, alone[r][o]))
                << name(t) << " " << kernel_level_name(level) << " n=" << n << " r=" << r << " o=" << o << ": "
                << got << " in a batch, " << alone[r][o] << " alone";
            ASSERT_TRUE(same_bits(got, ref[r * p.rows + o]))
                << name(t) << " " << kernel_level_name(level) << " n=" << n << " r=" << r << " o=" << o << ": "
                << got << " vs scalar " << ref[r * p.rows + o];
          }
      }
    }
  }
}

// Every stream tuning (kernels/stream_tuning.h: prefetch or not, float
// decode one weight row at a time or four, one or two panels per kernel
// call from 1 or 9 rows or never) gives the scalar level's bits, so
// a result never depends on which CPU chose which tuning.
TEST(KernelsGemm, EveryStreamTuningGivesTheSameBits) {
  ThreadPool pool(2);
  std::mt19937 rng(17);
  for (GgmlType t : kTypes) {
    // 70 weight rows: four full tiles, a partial one, and single-row tails.
    const Problem p = make_problem(t, 70, 5, rng);
    const std::vector<float> x = random_acts(9, p.cols, rng);
    const std::vector<float> ref = matmul(p, x, 9, KernelLevel::kScalar, pool);
    for (bool prefetch : {false, true})
      for (bool single : {false, true})
        for (int64_t pair_rows : {0, 1, 9}) {
          const StreamTuning tuning{.software_prefetch = prefetch,
                                    .float_single_row = single,
                                    .panel_prefetch_bytes = prefetch ? 2048 : 0,
                                    .panel_prefetch_min_rows = 1,
                                    .panel_pair_min_rows = pair_rows};
          for (KernelLevel level : levels())
            for (int64_t n : {1, 2, 9}) {
              const std::vector<float> y = matmul(p, x, n, level, pool, tuning);
              for (int64_t i = 0; i < n * p.rows; ++i)
                ASSERT_TRUE(same_bits(y[i], ref[i]))
                    << name(t) << " " << kernel_level_name(level) << " n=" << n << " prefetch=" << prefetch
                    << " single_row=" << single << " pair_rows=" << pair_rows << " at " << i << ": " << y[i]
                    << " vs scalar " << ref[i];
            }
        }
  }
}

// The two quantized paths called directly on the same 13 rows: the packed
// kernels (8-row groups) and the row-wise ones (pairs of weight and
// activation rows) give the same bits at every level.
TEST(KernelsGemm, RowwiseAndPackedPathsAgree) {
  std::mt19937 rng(19);
  for (GgmlType t : {GgmlType::Q4_0, GgmlType::Q5_0, GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K,
                     GgmlType::MXFP4}) {
    const Problem p = make_problem(t, 21, 9, rng);  // 9 blocks: one 8-block step and a tail
    const int64_t n = 13;
    const std::vector<float> x = random_acts(n, p.cols, rng);
    for (KernelLevel level : levels()) {
      const GemmKernel k = gemm_kernel(t, level);
      GemmActs plain, grouped;
      gemm_acts_shape(t, n, p.cols, 1, plain);
      gemm_prepare_acts(x.data(), p.cols, 0, plain.groups, plain, level);
      gemm_acts_shape(t, n, p.cols, kGemmMaxRows, grouped);
      gemm_prepare_acts(x.data(), p.cols, 0, grouped.groups, grouped, level);
      std::vector<float> rows(n * p.rows);
      k.rows(p.W, 0, p.rows, plain, 0, n, rows.data(), p.rows);
      std::vector<uint8_t> panel_buf(k.panel_block_bytes * plain.nb + 64);
      uint8_t* panel = panel_buf.data() + (64 - reinterpret_cast<uintptr_t>(panel_buf.data()) % 64) % 64;
      for (int64_t o0 = 0; o0 < p.rows; o0 += kGemmTile) {
        k.pack(p.W, o0, 0, plain.nb, panel);
        std::vector<float> acc(grouped.groups * grouped.slots * kGemmTile, 0.0f);
        for (int64_t g = 0; g < grouped.groups; ++g) {
          // Two K chunks: the second continues the first's chains in place.
          GemmAcc io;
          io.out = acc.data() + g * grouped.slots * kGemmTile;
          const int R = static_cast<int>(std::min<int64_t>(grouped.slots, n - g * grouped.slots));
          const int64_t half = plain.nb / 2;
          k.run(panel, half, grouped, g, R, 0, io);
          io.in = io.out;
          k.run(panel + half * k.panel_block_bytes, plain.nb - half, grouped, g, R, half, io);
        }
        for (int64_t r = 0; r < n; ++r)
          for (int64_t o = o0; o < std::min<int64_t>(p.rows, o0 + kGemmTile); ++o)
            ASSERT_TRUE(same_bits(rows[r * p.rows + o], acc[r * kGemmTile + o - o0]))
                << name(t) << " " << kernel_level_name(level) << " r=" << r << " o=" << o << ": row-wise "
                << rows[r * p.rows + o] << " packed " << acc[r * kGemmTile + o - o0];
      }
    }
  }
}

// The row-wise (decode) kernels over K with every remainder of their block
// steps, and 61 weight rows: three 16-row tiles (q4_0, mxfp4), an 8-row one
// and 2-row tiles with a single row last: the same bits as the scalar level,
// for 1 to 3 activation rows.
TEST(KernelsGemm, RowwiseStepsAndTailsMatchScalar) {
  ThreadPool pool(1);
  std::mt19937 rng(23);
  for (GgmlType t : {GgmlType::Q4_0, GgmlType::Q5_0, GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K,
                     GgmlType::MXFP4}) {
    for (int64_t blocks : {1, 2, 3, 4, 5, 7, 8, 12, 13, 19}) {
      // 256-element blocks: a few suffice (q4_K / q5_K take 4 at a time).
      if (gemm_class(t) != GemmClass::kQ32 && blocks > 5 && blocks != 8) continue;
      const Problem p = make_problem(t, 61, blocks, rng);
      const std::vector<float> x = random_acts(3, p.cols, rng);
      const std::vector<float> ref = matmul(p, x, 3, KernelLevel::kScalar, pool);
      for (KernelLevel level : levels())
        for (int64_t n : {1, 2, 3}) {
          const std::vector<float> y = matmul(p, x, n, level, pool);
          for (int64_t r = 0; r < n; ++r)
            for (int64_t o = 0; o < p.rows; ++o)
              ASSERT_TRUE(same_bits(y[r * p.rows + o], ref[r * p.rows + o]))
                  << name(t) << " " << kernel_level_name(level) << " blocks=" << blocks << " n=" << n << " r=" << r
                  << " o=" << o << ": " << y[r * p.rows + o] << " vs scalar " << ref[r * p.rows + o];
        }
    }
  }
}

// Weight values with the quant bits zeroed: the K-quants' min offsets. The
// kernels round the scaled and the offset parts separately, so the error
// scales with |scaled| + |offset|.
std::vector<float> offsets(GgmlType t, std::vector<uint8_t> w, int64_t n) {
  std::vector<float> off(n, 0.0f);
  if (t != GgmlType::Q4_K && t != GgmlType::Q5_K) return off;
  for (int64_t b = 0; b < n / kQKK; ++b) {
    if (t == GgmlType::Q4_K) std::memset(reinterpret_cast<BlockQ4K*>(w.data())[b].qs, 0, 128);
    if (t == GgmlType::Q5_K) {
      std::memset(reinterpret_cast<BlockQ5K*>(w.data())[b].qs, 0, 128);
      std::memset(reinterpret_cast<BlockQ5K*>(w.data())[b].qh, 0, 32);
    }
  }
  dequantize_row(t, w.data(), off.data(), n);
  return off;
}

std::vector<float> act_values(GgmlType act, const std::vector<uint8_t>& a, int64_t n) {
  std::vector<float> v(n);
  if (act == GgmlType::Q8_K) {
    const auto* b = reinterpret_cast<const BlockQ8K*>(a.data());
    for (int64_t i = 0; i < n; ++i) v[i] = b[i / kQKK].d * b[i / kQKK].qs[i % kQKK];
  } else {
    dequantize_row(act, a.data(), v.data(), n);
  }
  return v;
}

// The scalar tiled path against vec_dot's scalar reference (same quantized
// activations, same integer sums, different float order): each within its
// rounding budget of the exact dot of the dequantized rows.
TEST(KernelsGemm, ScalarPathMatchesVecDotReference) {
  ThreadPool pool(1);
  std::mt19937 rng(5);
  for (GgmlType t : kTypes)
    for (int64_t blocks : {1, 3, 7}) {
      const Problem p = make_problem(t, 19, blocks, rng);
      const int64_t n = 3;
      const std::vector<float> x = random_acts(n, p.cols, rng);
      const std::vector<float> y = matmul(p, x, n, KernelLevel::kScalar, pool);
      const GgmlType at = vec_dot_type(t);
      const int64_t terms = is_float(t) ? p.cols : 2 * p.cols / type_traits(t).block_elems;
      for (int64_t r = 0; r < n; ++r) {
        std::vector<uint8_t> a(row_bytes(at, p.cols));
        quantize_activations(at, x.data() + r * p.cols, a.data(), p.cols);
        const std::vector<float> av = act_values(at, a, p.cols);
        for (int64_t o = 0; o < p.rows; ++o) {
          std::vector<float> wv(p.cols);
          dequantize_row(t, p.W.row(o), wv.data(), p.cols);
          const std::vector<float> off = offsets(t, std::vector<uint8_t>(p.W.row(o), p.W.row(o) + p.W.row_stride), p.cols);
          double mag = 0;
          for (int64_t i = 0; i < p.cols; ++i) mag += (std::fabs(wv[i]) + 2 * std::fabs(off[i])) * std::fabs(av[i]);
          const double bound = 2 * (terms + 16) * kEps * mag;
          const float want = vec_dot_ref_fn(t)(p.cols, p.W.row(o), a.data());
          EXPECT_LE(std::fabs(y[r * p.rows + o] - want), bound)
              << name(t) << " blocks=" << blocks << " r=" << r << " o=" << o << " got " << y[r * p.rows + o]
              << " want " << want;
        }
      }
    }
}

// Thread count and the several-matrices entry point change nothing.
TEST(KernelsGemm, ThreadsAndRunManyChangeNothing) {
  std::mt19937 rng(7);
  for (GgmlType t : {GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::F16}) {
    const Problem a = make_problem(t, 53, 3, rng), b = make_problem(t, 21, 3, rng);
    const int64_t n = 11;
    const std::vector<float> x = random_acts(n, a.cols, rng);
    ThreadPool p1(1), p3(3);
    const std::vector<float> ya = matmul(a, x, n, active_kernel_level(), p1);
    const std::vector<float> yb = matmul(b, x, n, active_kernel_level(), p1);
    EXPECT_EQ(matmul(a, x, n, active_kernel_level(), p3), ya) << name(t);
    std::vector<float> ma(n * a.rows), mb(n * b.rows);
    const WeightMatrix* Ws[] = {&a.W, &b.W};
    float* ys[] = {ma.data(), mb.data()};
    const int64_t lds[] = {a.rows, b.rows};
    Matmul mm;
    mm.run_many(Ws, x.data(), a.cols, n, ys, lds, p3);
    EXPECT_EQ(ma, ya) << name(t);
    EXPECT_EQ(mb, yb) << name(t);
  }
}

// Mixed types are grouped per type; mismatched widths or spans are errors.
TEST(KernelsGemm, RunManyGroupsTypesAndRejectsBadShapes) {
  std::mt19937 rng(3);
  const Problem a = make_problem(GgmlType::Q8_0, 16, 2, rng), b = make_problem(GgmlType::Q4_0, 20, 2, rng);
  const Problem c = make_problem(GgmlType::Q8_0, 16, 3, rng), d = make_problem(GgmlType::Q8_0, 9, 2, rng);
  const int64_t n = 3;
  const std::vector<float> x = random_acts(n, a.cols, rng);
  ThreadPool pool(2);
  Matmul mm;
  {
    const WeightMatrix* Ws[] = {&a.W, &b.W, &d.W};
    std::vector<float> ya(n * 16), yb(n * 20), yd(n * 9);
    float* ys[] = {ya.data(), yb.data(), yd.data()};
    const int64_t lds[] = {16, 20, 9};
    mm.run_many(Ws, x.data(), a.cols, n, ys, lds, pool);
    EXPECT_EQ(ya, matmul(a, x, n, active_kernel_level(), pool));
    EXPECT_EQ(yb, matmul(b, x, n, active_kernel_level(), pool));
    EXPECT_EQ(yd, matmul(d, x, n, active_kernel_level(), pool));
  }
  std::vector<float> y(64);
  {
    const WeightMatrix* Ws[] = {&a.W, &c.W};
    float* ys[] = {y.data(), y.data()};
    const int64_t lds[] = {16, 16};
    EXPECT_THROW(mm.run_many(Ws, x.data(), a.cols, 1, ys, lds, pool), Error);
  }
  const WeightMatrix* Ws[] = {&a.W};
  float* ys[] = {y.data(), y.data()};
  const int64_t lds[] = {16};
  EXPECT_THROW(mm.run_many(Ws, x.data(), a.cols, 1, ys, lds, pool), Error);
}

// Inputs that stress the quantizers: ties at .5, a zero block, NaN and inf,
// huge and tiny values, equal magnitudes of both signs.
std::vector<float> nasty_row(int64_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-3.0f, 3.0f);
  std::vector<float> x(n);
  for (auto& v : x) v = u(rng);
  for (int64_t i = 0; i < n; i += 7) x[i] = std::round(x[i] * 2) / 2;  // halves
  for (int64_t i = 0; i < std::min<int64_t>(n, 32); ++i) x[i] = 0.0f;
  if (n > 300) {
    x[40] = -5.0f, x[41] = 5.0f;  // same magnitude, either sign first
    x[300] = 5.0f, x[301] = -5.0f;
  }
  if (n > 600) {
    x[520] = std::numeric_limits<float>::quiet_NaN();
    x[580] = std::numeric_limits<float>::infinity();
  }
  if (n > 900) {
    x[800] = 3e38f;
    for (int64_t i = 896; i < std::min<int64_t>(n, 928); ++i) x[i] = 1e-30f * static_cast<float>(i - 900);
  }
  return x;
}

TEST(KernelsGemm, PreparedActivationsMatchQuantizeActivations) {
  std::mt19937 rng(9);
  for (GgmlType t : kTypes) {
    const int64_t cols = is_float(t) ? 1029 : 1024;
    const int64_t rows = 11;
    std::vector<float> x(rows * cols);
    for (int64_t r = 0; r < rows; ++r) {
      const std::vector<float> xr = nasty_row(cols, rng);
      std::copy(xr.begin(), xr.end(), x.begin() + r * cols);
    }
    const GgmlType at = vec_dot_type(t);
    for (KernelLevel level : levels())
      for (int64_t max_slots : {int64_t{1}, int64_t{kGemmMaxRows}}) {
      GemmActs A;
      gemm_acts_shape(t, rows, cols, max_slots, A);
      gemm_prepare_acts(x.data(), cols, 0, A.groups, A, level);
      for (int64_t r = 0; r < rows; ++r) {
        std::vector<uint8_t> a(row_bytes(at, cols));
        quantize_activations(at, x.data() + r * cols, a.data(), cols);
        const int64_t G = r / A.slots, s = r % A.slots;
        const std::string where = name(t) + " " + kernel_level_name(level) + " slots " + std::to_string(A.slots) +
                                  " row " + std::to_string(r);
        if (is_float(t)) {
          const float* f = A.fgroup(G) + s;
          for (int64_t i = 0; i < cols; ++i) {
            float want = x[r * cols + i];
            if (at == GgmlType::F16) want = f16_to_f32(reinterpret_cast<const uint16_t*>(a.data())[i]);
            if (at == GgmlType::BF16) want = bf16_to_f32(reinterpret_cast<const uint16_t*>(a.data())[i]);
            ASSERT_TRUE(same_bits(f[i * A.slots], want)) << where << " col " << i;
          }
          continue;
        }
        const int8_t* q = A.qgroup(G);
        for (int64_t i = 0; i < cols; ++i) {
          const int64_t be = A.block_elems;
          const int8_t want = at == GgmlType::Q8_0 ? reinterpret_cast<const BlockQ8_0*>(a.data())[i / be].qs[i % be]
                                                   : reinterpret_cast<const BlockQ8K*>(a.data())[i / be].qs[i % be];
          ASSERT_EQ(q[((i / 4) * A.slots + s) * 4 + i % 4], want) << where << " col " << i;
        }
        for (int64_t b = 0; b < A.nb; ++b) {
          const float want = at == GgmlType::Q8_0 ? f16_to_f32(reinterpret_cast<const BlockQ8_0*>(a.data())[b].d)
                                                  : reinterpret_cast<const BlockQ8K*>(a.data())[b].d;
          ASSERT_TRUE(same_bits(A.sgroup(G)[b * A.slots + s], want)) << where << " block " << b;
          const int32_t* e = A.egroup(G);
          auto extra = [&](int64_t i) { return e[(b * A.extra_per_block + i) * A.slots + s]; };
          if (at == GgmlType::Q8_0) {
            int32_t sum = 0;
            for (int j = 0; j < kQK; ++j) sum += reinterpret_cast<const BlockQ8_0*>(a.data())[b].qs[j];
            EXPECT_EQ(extra(0), -gemm_detail::q32_offset(t) * sum) << where;
          } else {
            const int16_t* bs = reinterpret_cast<const BlockQ8K*>(a.data())[b].bsums;
            for (int i = 0; i < static_cast<int>(A.extra_per_block); ++i) {
              if (t == GgmlType::Q6_K) {
                EXPECT_EQ(extra(i), -32 * bs[i]) << where;
              } else {
                const int32_t lo = bs[4 * i] + bs[4 * i + 1], hi = bs[4 * i + 2] + bs[4 * i + 3];
                EXPECT_EQ(extra(i), static_cast<int32_t>(static_cast<uint16_t>(lo) | (static_cast<uint32_t>(static_cast<uint16_t>(hi)) << 16)))
                    << where;
              }
            }
          }
        }
      }
    }
  }
}

// The builds' table (kernels/kernel_builds.cpp) gives every level each
// function the scalar build has, for every weight type vec_dot knows, and
// the SIMD levels their own row kernels.
TEST(KernelsGemm, EveryLevelHasEverySlotOfTheScalarBuild) {
  const GgmlType all[] = {GgmlType::F32,  GgmlType::F16,  GgmlType::BF16, GgmlType::Q4_0, GgmlType::Q4_1,
                          GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q8_0, GgmlType::Q2_K, GgmlType::Q3_K,
                          GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::MXFP4};
  for (GgmlType t : all) {
    const TypeFns ref = type_fns(t, KernelLevel::kScalar);
    ASSERT_NE(ref.dot, nullptr) << name(t);
    EXPECT_EQ(ref.rows != nullptr, gemm_class(t) != GemmClass::kNone) << name(t);
    for (KernelLevel level : levels()) {
      const TypeFns f = type_fns(t, level);
      const std::string where = name(t) + " " + kernel_level_name(level);
      EXPECT_EQ(f.dot != nullptr, ref.dot != nullptr) << where;
      EXPECT_EQ(f.pack != nullptr, ref.pack != nullptr) << where;
      EXPECT_EQ(f.run != nullptr, ref.run != nullptr) << where;
      EXPECT_EQ(f.rows != nullptr, ref.rows != nullptr) << where;
      EXPECT_EQ(f.prepare != nullptr, ref.prepare != nullptr) << where;
      EXPECT_EQ(f.dot, vec_dot_fn_for_level(t, level)) << where;
      // Only the scalar level runs the scalar products where a SIMD build has them.
      if (level != KernelLevel::kScalar && ref.rows) {
        EXPECT_NE(f.rows, ref.rows) << where;
      }
    }
  }
  for (KernelLevel level : levels()) {
    const LevelFns& f = level_fns(level);
    EXPECT_TRUE(f.attention_chunk && f.sum_squares && f.log_sum_exp && f.gelu_gated && f.silu_gated)
        << kernel_level_name(level);
  }
}

TEST(KernelsGemm, SimdPackersWriteTheScalarBytes) {
  std::mt19937 rng(13);
  for (GgmlType t : kTypes) {
    const Problem p = make_problem(t, 32, 3, rng);
    const GemmKernel ref = gemm_kernel(t, KernelLevel::kScalar);
    if (ref.pack == nullptr) continue;  // the float class is never packed
    const int64_t nb = p.cols / ref.block_elems;
    for (KernelLevel level : levels()) {
      const GemmKernel k = gemm_kernel(t, level);
      ASSERT_EQ(k.panel_block_bytes, ref.panel_block_bytes);
      // Blocks [1, nb) of the second tile: an offset start and full tiles.
      std::vector<uint8_t> want(ref.panel_block_bytes * nb + 64), got(want.size());
      auto aligned = [](std::vector<uint8_t>& v) {
        return v.data() + (64 - reinterpret_cast<uintptr_t>(v.data()) % 64) % 64;
      };
      ref.pack(p.W, 16, 1, nb, aligned(want));
      k.pack(p.W, 16, 1, nb, aligned(got));
      EXPECT_EQ(0, std::memcmp(aligned(want), aligned(got), ref.panel_block_bytes * (nb - 1)))
          << name(t) << " " << kernel_level_name(level);
    }
  }
}

TEST(KernelsGemm, KernelChoiceAndShapeErrors) {
  EXPECT_FALSE(gemm_kernel(GgmlType::Q4_1, active_kernel_level()));
  EXPECT_TRUE(gemm_kernel(GgmlType::Q8_0, active_kernel_level()));
  GemmActs A;
  EXPECT_THROW(gemm_acts_shape(GgmlType::Q8_0, 1, 33, 8, A), Error);
  EXPECT_THROW(gemm_acts_shape(GgmlType::Q4_K, 1, 512 + 32, 8, A), Error);
  EXPECT_THROW(gemm_acts_shape(GgmlType::Q4_1, 1, 64, 8, A), Error);
}

// A type without a tiled kernel still goes through Matmul, batch invariant.
TEST(KernelsGemm, FallbackTypesAreBatchInvariant) {
  std::mt19937 rng(17);
  ThreadPool pool(2);
  const Problem p = [&] {
    Problem q;
    q.type = GgmlType::Q4_1;
    q.rows = 20;
    q.cols = 96;
    q.w.resize(row_bytes(GgmlType::Q4_1, q.cols) * q.rows);
    std::vector<float> src(q.cols);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (int64_t r = 0; r < q.rows; ++r) {
      for (auto& v : src) v = normal(rng);
      quantize_row(GgmlType::Q4_1, src.data(), q.w.data() + r * row_bytes(GgmlType::Q4_1, q.cols), q.cols);
    }
    q.W = {GgmlType::Q4_1, q.w.data(), q.cols, q.rows, row_bytes(GgmlType::Q4_1, q.cols)};
    return q;
  }();
  const std::vector<float> x = random_acts(5, p.cols, rng);
  const std::vector<float> y = matmul(p, x, 5, active_kernel_level(), pool);
  for (int64_t r = 0; r < 5; ++r) {
    const std::vector<float> xr(x.begin() + r * p.cols, x.begin() + (r + 1) * p.cols);
    const std::vector<float> one = matmul(p, xr, 1, active_kernel_level(), pool);
    for (int64_t o = 0; o < p.rows; ++o) EXPECT_TRUE(same_bits(y[r * p.rows + o], one[o]));
  }
}

// Matmul over a matrix with more rows than any tile count, run back to back
// with different row counts on one pool: results equal single-threaded runs.
TEST(KernelsGemm, MatmulSameResultsOnAnyPool) {
  const int64_t rows = 301, cols = 256;
  std::vector<float> src(rows * cols);
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (auto& v : src) v = normal(rng);
  for (GgmlType t : {GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::F16}) {
    const size_t rb = row_bytes(t, cols);
    std::vector<uint8_t> w(rb * rows);
    for (int64_t r = 0; r < rows; ++r) quantize_row(t, src.data() + r * cols, w.data() + r * rb, cols);
    const WeightMatrix W{t, w.data(), cols, rows, rb};
    std::vector<float> x(17 * cols);
    for (auto& v : x) v = normal(rng);
    ThreadPool one(1), three(3);
    Matmul a, b;
    for (int64_t n : {1, 17, 2, 9}) {
      std::vector<float> ya(n * rows), yb(n * rows);
      a.run(W, x.data(), cols, n, ya.data(), rows, one);
      b.run(W, x.data(), cols, n, yb.data(), rows, three);
      EXPECT_EQ(ya, yb) << type_traits(t).name << " n=" << n;
    }
  }
}

// select_product reads one table: the row kernels up to a type's threshold
// (2 rows for the q32 file rows, 5 for the K-quants, 16 / 8 / 64 from the
// q4_0 / q5_0 / q4_K tiles, always for floats), panels past it or whenever
// they were made at load, vec_dot for types without product kernels, and two
// panels a call from the tuning's row count.
TEST(KernelsGemm, SelectFollowsTheTable) {
  const StreamTuning tuning = stream_tuning({.panel_pair_min_rows = 9});
  auto route = [&](GgmlType t, WeightLayout l, int64_t rows, KernelLevel level) {
    return select_product(t, l, rows, level, tuning).route;
  };
  constexpr auto kRows = ProductRoute::kRows, kPanels = ProductRoute::kPanels;
  constexpr auto kFile = WeightLayout::kFileRows, kTiled = WeightLayout::kTiles;
  for (KernelLevel level : levels()) {
    SCOPED_TRACE(kernel_level_name(level));
    EXPECT_EQ(route(GgmlType::Q8_0, kFile, 2, level), kRows);
    EXPECT_EQ(route(GgmlType::Q8_0, kFile, 3, level), kPanels);
    EXPECT_EQ(route(GgmlType::Q8_0, WeightLayout::kPanels, 1, level), kPanels);
    EXPECT_TRUE(select_product(GgmlType::Q8_0, WeightLayout::kPanels, 1, level, tuning).prepacked());
    EXPECT_FALSE(select_product(GgmlType::Q8_0, kFile, 3, level, tuning).prepacked());
    EXPECT_EQ(route(GgmlType::Q6_K, kFile, 5, level), kRows);
    EXPECT_EQ(route(GgmlType::Q6_K, kFile, 6, level), kPanels);
    EXPECT_EQ(route(GgmlType::F16, kFile, 512, level), kRows);
    const Product q41 = select_product(GgmlType::Q4_1, kFile, 7, level, tuning);
    EXPECT_EQ(q41.route, ProductRoute::kVecDot);
    EXPECT_EQ(q41.dot, vec_dot_fn_for_level(GgmlType::Q4_1, level));
    // mxfp4: row kernels up to 2 rows as q4_0, panels (packed per call, or as repacked at load) past them.
    EXPECT_EQ(route(GgmlType::MXFP4, kFile, 1, level), kRows);
    EXPECT_EQ(route(GgmlType::MXFP4, kFile, 2, level), kRows);
    EXPECT_EQ(route(GgmlType::MXFP4, kFile, 3, level), kPanels);
    EXPECT_EQ(route(GgmlType::MXFP4, WeightLayout::kPanels, 1, level), kPanels);
    const Product pair = select_product(GgmlType::Q8_0, kFile, 9, level, tuning);
    EXPECT_EQ(pair.pairs, pair.kernel.run2 != nullptr);
    EXPECT_FALSE(select_product(GgmlType::Q8_0, kFile, 8, level, tuning).pairs);
    if (level >= KernelLevel::kAvx512Vnni) {
      EXPECT_EQ(route(GgmlType::Q4_K, kTiled, 64, level), kRows);
      EXPECT_EQ(route(GgmlType::Q4_K, kTiled, 65, level), kPanels);
      EXPECT_EQ(route(GgmlType::Q4_0, kTiled, 16, level), kRows);
      EXPECT_EQ(route(GgmlType::Q4_0, kTiled, 17, level), kPanels);
      EXPECT_EQ(route(GgmlType::Q5_0, kTiled, 8, level), kRows);
      EXPECT_EQ(route(GgmlType::Q5_0, kTiled, 9, level), kPanels);
      EXPECT_EQ(route(GgmlType::BF16, kTiled, 512, level), kRows);
    } else {
      EXPECT_THROW(route(GgmlType::Q4_K, kTiled, 1, level), Error);  // no kernel of this level reads tiles
    }
  }
  EXPECT_EQ(select_product(GgmlType::Q4_K, kFile, 1, KernelLevel::kScalar, tuning).name(), "rows scalar");
  EXPECT_EQ(select_product(GgmlType::Q8_0, WeightLayout::kPanels, 3, KernelLevel::kScalar, tuning).name(),
            "panels scalar");
  EXPECT_EQ(select_product(GgmlType::Q3_K, kFile, 3, KernelLevel::kScalar, tuning).name(), "vec_dot scalar");
}

}  // namespace
}  // namespace tandem

// Weights repacked at load: products through the prepacked panels equal the
// products that pack on the fly (and the scalar level's), bit for bit, for
// odd shapes, any row count and every kernel level this CPU runs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <random>
#include <vector>

#include "core/aligned_vector.h"
#include "core/error.h"
#include "quant/quant.h"
#include "runtime/thread_pool.h"
#include "kernels/layout_k4_tiles.h"
#include "kernels/matmul.h"
#include "kernels/layouts.h"
#include "kernels/products.h"
#include "kernels/stream_tuning.h"

namespace tandem {
namespace {

struct Packed {
  explicit Packed(size_t n) : p(static_cast<uint8_t*>(std::aligned_alloc(64, (n + 63) / 64 * 64))) {}
  ~Packed() { std::free(p); }
  uint8_t* p;
};

// A rows x cols matrix of normal values quantized to `type` (bytes in `w`).
WeightMatrix quantized(GgmlType type, int64_t rows, int64_t cols, std::mt19937& rng, std::vector<uint8_t>& w) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> src(rows * cols);
  for (auto& v : src) v = normal(rng);
  const size_t rb = row_bytes(type, cols);
  w.assign(rb * rows, 0);
  for (int64_t r = 0; r < rows; ++r) quantize_row(type, src.data() + r * cols, w.data() + r * rb, cols);
  return WeightMatrix{type, w.data(), cols, rows, rb};
}

// Products of W and of its repacked form R, bit for bit, for 1-70 activation
// rows (q4_K tiles take the row-wise path up to 64, then panels packed from the tiles).
void expect_same_products(const WeightMatrix& W, const WeightMatrix& R, KernelLevel level, std::mt19937& rng,
                          ThreadPool& pool) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  Matmul file_layout(level), repacked(level);
  for (int64_t n : {1, 2, 3, 4, 5, 8, 9, 17, 70}) {
    std::vector<float> x(n * W.cols);
    for (auto& v : x) v = normal(rng);
    std::vector<float> ya(n * W.rows), yb(n * W.rows);
    file_layout.run(W, x.data(), W.cols, n, ya.data(), W.rows, pool);
    // The repacked layout streamed with and without software prefetch (17 and
    // 70 rows: several row groups, the last prefetching the next chunk).
    // Two panels per kernel call or one, on either side.
    for (bool prefetch : {false, true})
      for (int64_t pair_rows : {0, 1}) {
        repacked.set_tuning({.software_prefetch = prefetch,
                             .float_single_row = stream_tuning().float_single_row,
                             .panel_prefetch_bytes = prefetch ? 2048 : 0,
                             .panel_prefetch_min_rows = 1,
                             .panel_prefetch_next = prefetch,
                             .panel_pair_min_rows = pair_rows});
        repacked.run(R, x.data(), W.cols, n, yb.data(), W.rows, pool);
        EXPECT_EQ(ya, yb) << type_traits(W.type).name << " level " << static_cast<int>(level) << " " << W.rows
                          << "x" << W.cols << " n=" << n << " prefetch=" << prefetch << " pair_rows=" << pair_rows;
      }
  }
}

// Every type with panels (PrepackMode::kAll; kAuto packs only q8_0).
TEST(KernelsPrepack, PrepackedProductsEqualPackingOnTheFly) {
  std::mt19937 rng(11);
  ThreadPool pool(2);
  const GgmlType types[] = {GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q5_0, GgmlType::Q4_K,
                            GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::MXFP4};
  for (KernelLevel level : kAllKernelLevels) {
    if (!cpu_supports_level(level)) continue;
    for (GgmlType type : types) {
      const bool kq = type == GgmlType::Q4_K || type == GgmlType::Q5_K || type == GgmlType::Q6_K;
      const std::vector<std::pair<int64_t, int64_t>> shapes =
          kq ? std::vector<std::pair<int64_t, int64_t>>{{37, 256}, {16, 512}, {33, 768}}
             : std::vector<std::pair<int64_t, int64_t>>{{37, 96}, {16, 32}, {301, 256}, {5, 2080}};
      for (auto [rows, cols] : shapes) {
        std::vector<uint8_t> w;
        const WeightMatrix W = quantized(type, rows, cols, rng, w);
        const LayoutChoice all = choose_layout(W, level, PrepackMode::kAll);
        const size_t bytes = all.bytes;
        EXPECT_EQ(choose_layout(W, level, PrepackMode::kOff).layout, WeightLayout::kFileRows);
        if (type != GgmlType::Q8_0) {
          EXPECT_NE(choose_layout(W, level, PrepackMode::kAuto).layout, WeightLayout::kPanels);
        }
        ASSERT_EQ(all.layout, WeightLayout::kPanels) << type_traits(type).name;
        ASSERT_EQ(bytes, layout_bytes(W, WeightLayout::kPanels));
        Packed buf(bytes);
        write_layout(W, WeightLayout::kPanels, level, buf.p, 0, layout_tile_count(W, WeightLayout::kPanels), pool);
        WeightMatrix P = W;
        P.set_layout(WeightLayout::kPanels, buf.p);
        P.data = nullptr;  // the raw bytes must not be needed any more
        if (!kq) {
          std::vector<float> raw_row(cols), packed_row(cols);
          for (int64_t r : {int64_t{0}, rows / 2, rows - 1}) {
            dequantize_row(type, W.row(r), raw_row.data(), cols);
            dequantize_weight_row(P, r, packed_row.data());
            EXPECT_EQ(raw_row, packed_row) << "row " << r;
          }
        }
        expect_same_products(W, P, level, rng, pool);
      }
    }
  }
}

// Outputs written with streaming stores (StreamTuning::stream_out_min_bytes,
// a 64-byte aligned output with rows of a multiple of 16 floats) are the
// stored ones, bit for bit: prepacked q8_0 panels and q4_K / q6_K panels
// packed per call, one panel per kernel call or two, whole and partial tiles.
TEST(KernelsPrepack, StreamedOutputsEqualStoredOutputs) {
  std::mt19937 rng(13);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  ThreadPool pool(2);
  int streaming_levels = 0;  // levels whose panel kernels have streaming stores (AVX-512)
  for (KernelLevel level : kAllKernelLevels) {
    if (!cpu_supports_level(level) || level == KernelLevel::kScalar) continue;
    if (level >= KernelLevel::kAvx512) ++streaming_levels;
    for (GgmlType type : {GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q6_K}) {
      for (int64_t rows : {48, 37}) {
        std::vector<uint8_t> w;
        const WeightMatrix W = quantized(type, rows, 512, rng, w);
        WeightMatrix P = W;
        std::unique_ptr<Packed> buf;
        if (type == GgmlType::Q8_0) {
          const LayoutChoice c = choose_layout(W, level, PrepackMode::kAuto);
          ASSERT_EQ(c.layout, WeightLayout::kPanels);
          buf = std::make_unique<Packed>(c.bytes);
          write_layout(W, c.layout, level, buf->p, 0, layout_tile_count(W, c.layout), pool);
          P.set_layout(c.layout, buf->p);
        }
        const int64_t ldy = 64;  // 256 bytes: every output row on a cache line
        Matmul mm(level);
        for (int64_t n : {1, 9, 17, 70}) {
          std::vector<float> x(n * W.cols);
          for (auto& v : x) v = normal(rng);
          for (int64_t pair_rows : {0, 9}) {
            CacheAlignedVector<float> stored(n * ldy, -1.0f), streamed(n * ldy, -1.0f);
            StreamTuning t = stream_tuning();
            t.panel_pair_min_rows = pair_rows;
            t.stream_out_min_bytes = -1;
            mm.set_tuning(t);
            mm.run(P, x.data(), W.cols, n, stored.data(), ldy, pool);
            t.stream_out_min_bytes = 0;
            mm.set_tuning(t);
            mm.run(P, x.data(), W.cols, n, streamed.data(), ldy, pool);
            EXPECT_EQ(stored, streamed) << type_traits(type).name << " level " << static_cast<int>(level) << " "
                                        << rows << " rows, n=" << n << " pair_rows=" << pair_rows;
          }
        }
      }
    }
  }
  if (cpu_supports_level(KernelLevel::kAvx512)) {
    EXPECT_GT(streaming_levels, 0);
  }
}

// The tiles layouts (q4_0, q5_0, q4_K, f16, bf16): the same products and rows
// as the file's layout, with the whole tiles' file bytes overwritten (so a
// read of them shows).
TEST(KernelsPrepack, TilesEqualTheFileLayout) {
  std::mt19937 rng(12);
  ThreadPool pool(2);
  int levels_with_tiles = 0;
  for (GgmlType type : {GgmlType::Q4_0, GgmlType::Q5_0, GgmlType::Q4_K, GgmlType::F16, GgmlType::BF16}) {
    const bool k4 = type == GgmlType::Q4_K;
    const bool fl = type == GgmlType::F16 || type == GgmlType::BF16;
    // Float tiles need a width that is a multiple of 16 (40: none; 67 and 37
    // rows: the last rows stay in the file; 68 rows: 4 whole groups after the tiles).
    const std::vector<std::pair<int64_t, int64_t>> shapes =
        k4 ? std::vector<std::pair<int64_t, int64_t>>{{37, 256}, {16, 512}, {48, 1280}, {5, 256}, {33, 768}}
        : fl ? std::vector<std::pair<int64_t, int64_t>>{{37, 96}, {16, 32}, {67, 2048}, {68, 160}, {20, 40}, {5, 64}}
             : std::vector<std::pair<int64_t, int64_t>>{{37, 96}, {16, 32}, {301, 256}, {5, 2080}, {48, 160}, {33, 2080}};
    for (KernelLevel level : kAllKernelLevels) {
      if (!cpu_supports_level(level)) continue;
      for (auto [rows, cols] : shapes) {
        std::vector<uint8_t> w;
        const WeightMatrix W = quantized(type, rows, cols, rng, w);
        const size_t rb = W.row_stride;
        const LayoutChoice c = choose_layout(W, level, PrepackMode::kAuto);
        const size_t bytes = c.layout == WeightLayout::kTiles ? c.bytes : 0;
        if (bytes == 0) {
          EXPECT_TRUE(rows < 16 || level < KernelLevel::kAvx512Vnni || (fl && cols % 16 != 0)) << rows << " rows";
          continue;
        }
        ++levels_with_tiles;
        // q4_0, q5_0: the file's bytes rearranged; q4_K: 2368 bytes per 16 rows x 256.
        ASSERT_EQ(bytes, static_cast<size_t>(rows / 16) * (k4 ? 2368u * (cols / 256) : 16 * rb));
        Packed buf(bytes);
        write_layout(W, WeightLayout::kTiles, level, buf.p, 0, rows / 16, pool);
        std::vector<uint8_t> spoiled = w;
        std::fill(spoiled.begin(), spoiled.begin() + static_cast<int64_t>(rows / 16 * 16 * rb), 0xFF);  // NaN scales
        WeightMatrix T = W;
        T.data = spoiled.data();
        T.set_layout(WeightLayout::kTiles, buf.p);
        std::vector<float> raw_row(cols), tiled_row(cols);
        for (int64_t r = 0; r < rows; ++r) {
          dequantize_row(type, W.row(r), raw_row.data(), cols);
          dequantize_weight_row(T, r, tiled_row.data());
          ASSERT_EQ(raw_row, tiled_row) << "row " << r;
        }
        expect_same_products(W, T, level, rng, pool);
        // Kernels that do not read the layout refuse it rather than read the spoiled rows.
        Matmul scalar(KernelLevel::kScalar);
        std::vector<float> x(cols, 1.0f), y(rows);
        EXPECT_THROW(scalar.run(T, x.data(), cols, 1, y.data(), rows, pool), Error);
      }
    }
  }
  if (cpu_supports_level(KernelLevel::kAvx512Vnni)) {
    EXPECT_GT(levels_with_tiles, 0);
  }
}

// A q4_K tile block gives back the file's 144 bytes of each of its rows.
TEST(KernelsPrepack, K4TileBlocksRoundTrip) {
  std::mt19937 rng(13);
  std::vector<uint8_t> w;
  const WeightMatrix W = quantized(GgmlType::Q4_K, 16, 512, rng, w);
  // Extreme scales and mins too (6-bit 63 and 0), not only what quantizing normals gives.
  for (int n = 0; n < 16; n += 5) std::fill_n(w.data() + n * W.row_stride + 4, 12, n % 2 ? 0xFF : 0x00);
  const uint8_t* rows[16];
  for (int n = 0; n < 16; ++n) rows[n] = W.row(n);
  std::vector<uint8_t> tile(k4_tiles::kBlockBytes);
  for (int64_t b = 0; b < 2; ++b) {
    k4_tiles::write_block(rows, b, tile.data());
    for (int n = 0; n < 16; ++n) {
      uint8_t back[144];
      k4_tiles::read_block(tile.data(), n, back);
      EXPECT_TRUE(std::equal(back, back + 144, W.row(n) + b * 144)) << "row " << n << " block " << b;
    }
  }
}

TEST(KernelsPrepack, OnlyTypesWhosePanelsAreNotLarger) {
  const std::vector<uint8_t> w(row_bytes(GgmlType::Q4_0, 64) * 16);
  const WeightMatrix q4{GgmlType::Q4_0, w.data(), 64, 16, row_bytes(GgmlType::Q4_0, 64)};
  for (KernelLevel level : kAllKernelLevels) {
    if (!cpu_supports_level(level)) continue;  // e.g. avx2-vnni on AMD Zen 4
    const LayoutChoice c = choose_layout(q4, level, PrepackMode::kAuto);
    EXPECT_NE(c.layout, WeightLayout::kPanels);
    // q4_0 is rearranged, not widened: 16 rows x 2 blocks x 18 bytes.
    EXPECT_EQ(c.layout == WeightLayout::kTiles ? c.bytes : 0u, level >= KernelLevel::kAvx512Vnni ? 16u * 2u * 18u : 0u);
  }
  const std::vector<uint8_t> w8(row_bytes(GgmlType::Q8_0, 64) * 17);
  const WeightMatrix q8{GgmlType::Q8_0, w8.data(), 64, 17, row_bytes(GgmlType::Q8_0, 64)};
  for (KernelLevel level : kAllKernelLevels) {
    if (!cpu_supports_level(level)) continue;
    const LayoutChoice c = choose_layout(q8, level, PrepackMode::kAuto);
    EXPECT_EQ(c.layout, WeightLayout::kPanels);
    EXPECT_EQ(c.bytes, 2u * 2u * 544u);  // 2 tiles (17 rows) x 2 blocks, as many bytes as 32 rows in the file
  }
}

}  // namespace
}  // namespace tandem

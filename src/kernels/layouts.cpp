#include "kernels/layouts.h"

#include <cstring>

#include "core/error.h"
#include "quant/quant.h"
#include "quant/quant_blocks.h"
#include "runtime/thread_pool.h"
#include "kernels/layout_float_tiles.h"
#include "kernels/layout_k4_tiles.h"
#include "kernels/layout_panels.h"
#include "kernels/layout_q32_tiles.h"
#include "kernels/product_kernels.h"

namespace tandem {
namespace {

int64_t block_elems(GgmlType t) { return type_traits(t).block_elems; }

// Bytes of one 16-row tile of W's tiles.
size_t tile_bytes(const WeightMatrix& W) {
  switch (W.type) {
    case GgmlType::Q4_0: return q32_tiles::tile_bytes(W.cols / kQK, false);
    case GgmlType::Q5_0: return q32_tiles::tile_bytes(W.cols / kQK, true);
    case GgmlType::Q4_K: return k4_tiles::tile_bytes(W.cols / kQKK);
    case GgmlType::F16:
    case GgmlType::BF16:
      return W.cols % float_tiles::kChunk == 0 ? static_cast<size_t>(kGemmTile * W.cols) * 2 : 0;
    default: return 0;
  }
}

void write_tiles(const WeightMatrix& W, uint8_t* out, int64_t t0, int64_t t1, ThreadPool& pool) {
  if (W.type == GgmlType::F16 || W.type == GgmlType::BF16) {
    constexpr int64_t kGroups = kGemmTile / float_tiles::kGroupRows;
    pool.parallel_for(t1 - t0, 16, [&](int64_t a, int64_t b) {
      for (int64_t g = (t0 + a) * kGroups; g < (t0 + b) * kGroups; ++g) {
        const uint8_t* rows[float_tiles::kGroupRows];
        for (int i = 0; i < float_tiles::kGroupRows; ++i) rows[i] = W.row(g * float_tiles::kGroupRows + i);
        float_tiles::write_group<2>(rows, W.cols, out, g);
      }
    });
    return;
  }
  const bool k4 = W.type == GgmlType::Q4_K, q5 = W.type == GgmlType::Q5_0;
  const int64_t nb = W.cols / (k4 ? kQKK : kQK);
  const size_t tb = tile_bytes(W);
  pool.parallel_for(t1 - t0, 16, [&](int64_t a, int64_t b) {
    for (int64_t t = t0 + a; t < t0 + b; ++t) {
      const uint8_t* rows[kGemmTile];
      for (int n = 0; n < kGemmTile; ++n) rows[n] = W.row(t * kGemmTile + n);
      uint8_t* tile = out + t * tb;
      if (!k4) {
        q32_tiles::write_tile(rows, nb, q5, tile);
        continue;
      }
      for (int64_t blk = 0; blk < nb; ++blk) k4_tiles::write_block(rows, blk, tile + blk * k4_tiles::kBlockBytes);
    }
  });
}

void write_panels(const WeightMatrix& W, KernelLevel level, uint8_t* out, int64_t t0, int64_t t1,
                  ThreadPool& pool) {
  const GemmKernel k = gemm_kernel(W.type, level);
  const int64_t nb = W.cols / k.block_elems;
  const size_t tb = static_cast<size_t>(nb) * k.panel_block_bytes;
  pool.parallel_for(t1 - t0, 16, [&](int64_t a, int64_t b) {
    for (int64_t t = t0 + a; t < t0 + b; ++t) k.pack(W, t * kGemmTile, 0, nb, out + t * tb);
  });
}

// Row r of q4_0 / q5_0 / q8_0 / mxfp4 panels.
void dequantize_panel_row(const WeightMatrix& W, int64_t r, float* out) {
  using gemm_detail::Q32Panel;
  const int64_t nb = W.cols / kQK;
  const int64_t lane = r % kGemmTile;
  const int32_t offset = gemm_detail::q32_offset(W.type);
  const uint8_t* tile = W.panels() + (r / kGemmTile) * nb * static_cast<int64_t>(Q32Panel::kBytes);
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* p = tile + b * static_cast<int64_t>(Q32Panel::kBytes);
    uint16_t h;
    std::memcpy(&h, p + Q32Panel::kD + 2 * lane, 2);
    const float d = gemm_detail::q32_bf16_scales(W.type) ? bf16_to_f32(h) : f16_to_f32(h);
    for (int g = 0; g < 8; ++g)
      for (int i = 0; i < 4; ++i)
        out[b * 32 + 4 * g + i] = static_cast<float>(p[Q32Panel::kQ + g * 64 + lane * 4 + i] - offset) * d;
  }
}

// Row r of W's tiles (r in a whole tile).
void dequantize_tile_row(const WeightMatrix& W, int64_t r, float* out) {
  if (W.type == GgmlType::F16 || W.type == GgmlType::BF16) {
    const uint8_t* p = float_tiles::row_start(W.tiles(), W.cols, 2, r);
    for (int64_t c = 0; c < W.cols / float_tiles::kChunk; ++c, p += float_tiles::group_step(2))
      dequantize_row(W.type, p, out + c * float_tiles::kChunk, float_tiles::kChunk);
    return;
  }
  if (W.type == GgmlType::Q4_K) {
    const int64_t nb = W.cols / kQKK;
    uint8_t blk[sizeof(BlockQ4K)];
    for (int64_t b = 0; b < nb; ++b) {
      k4_tiles::read_block(k4_tiles::block(W.tiles(), nb, r, b), static_cast<int>(r % k4_tiles::kRows), blk);
      dequantize_row(W.type, blk, out + b * kQKK, kQKK);
    }
    return;
  }
  const int64_t nb = W.cols / kQK;
  const bool q5 = W.type == GgmlType::Q5_0;
  const uint8_t* tile = W.tiles() + (r / q32_tiles::kRows) * q32_tiles::tile_bytes(nb, q5);
  uint8_t blk[sizeof(BlockQ5_0)];
  for (int64_t b = 0; b < nb; ++b) {
    q32_tiles::read_block(tile, nb, q5, static_cast<int>(r % q32_tiles::kRows), b, blk);
    dequantize_row(W.type, blk, out + b * kQK, kQK);
  }
}

}  // namespace

size_t layout_bytes(const WeightMatrix& W, WeightLayout layout) {
  if (W.rows <= 0) return 0;
  switch (layout) {
    case WeightLayout::kFileRows: return 0;
    case WeightLayout::kPanels:
      return static_cast<size_t>(layout_tile_count(W, layout) * (W.cols / block_elems(W.type))) *
             gemm_detail::panel_block_bytes(gemm_class(W.type));
    case WeightLayout::kTiles: return static_cast<size_t>(layout_tile_count(W, layout)) * tile_bytes(W);
  }
  return 0;
}

int64_t layout_tile_count(const WeightMatrix& W, WeightLayout layout) {
  switch (layout) {
    case WeightLayout::kFileRows: return 0;
    case WeightLayout::kPanels: return (W.rows + kGemmTile - 1) / kGemmTile;
    case WeightLayout::kTiles: return W.rows / kGemmTile;
  }
  return 0;
}

void write_layout(const WeightMatrix& W, WeightLayout layout, KernelLevel level, uint8_t* out, int64_t t0,
                  int64_t t1, ThreadPool& pool) {
  if (layout_bytes(W, layout) == 0)
    fail(ErrorKind::kInvalidArgument, "{} weights have no {} layout", type_traits(W.type).name,
         layout == WeightLayout::kPanels ? "panels" : "tiles");
  if (layout == WeightLayout::kPanels) write_panels(W, level, out, t0, t1, pool);
  else write_tiles(W, out, t0, t1, pool);
}

void dequantize_weight_row(const WeightMatrix& W, int64_t r, float* out, const uint8_t* file_row) {
  if (W.panels() && gemm_class(W.type) == GemmClass::kQ32) return dequantize_panel_row(W, r, out);
  if (W.tiles() && r < W.rows / kGemmTile * kGemmTile) return dequantize_tile_row(W, r, out);
  dequantize_row(W.type, file_row ? file_row : W.row(r), out, W.cols);
}

}  // namespace tandem

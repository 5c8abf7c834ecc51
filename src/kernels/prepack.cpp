#include "kernels/prepack.h"

#include <cstring>

#include "core/error.h"
#include "core/quant.h"
#include "core/thread_pool.h"
#include "kernels/gemm.h"
#include "kernels/gemm_pack.h"
#include "kernels/q40_tiles.h"

namespace tandem {

PrepackMode parse_prepack_mode(std::string_view name) {
  if (name == "off") return PrepackMode::kOff;
  if (name == "auto") return PrepackMode::kAuto;
  if (name == "all") return PrepackMode::kAll;
  fail(ErrorKind::kInvalidArgument, "unknown prepack mode '{}' (expected auto, all or off)", name);
}

size_t prepacked_bytes(const WeightMatrix& W, KernelLevel level, PrepackMode mode) {
  if (mode == PrepackMode::kOff || W.rows <= 0) return 0;
  if (mode == PrepackMode::kAuto && W.type != GgmlType::Q8_0) return 0;
  const GemmKernel k = gemm_kernel(W.type, level);
  if (!k.pack || !k.run) return 0;
  const int64_t tiles = (W.rows + kGemmTile - 1) / kGemmTile;
  return static_cast<size_t>(tiles * (W.cols / k.block_elems)) * k.panel_block_bytes;
}

void prepack_tiles(const WeightMatrix& W, KernelLevel level, uint8_t* out, int64_t t0, int64_t t1, ThreadPool& pool) {
  const GemmKernel k = gemm_kernel(W.type, level);
  const int64_t nb = W.cols / k.block_elems;
  const size_t tile_bytes = static_cast<size_t>(nb) * k.panel_block_bytes;
  pool.parallel_for(t1 - t0, 16, [&](int64_t a, int64_t b) {
    for (int64_t t = t0 + a; t < t0 + b; ++t) k.pack(W, t * kGemmTile, 0, nb, out + t * tile_bytes);
  });
}

size_t q40_tiles_bytes(const WeightMatrix& W, KernelLevel level) {
  if (W.type != GgmlType::Q4_0 || W.rows < kGemmTile || !gemm_kernel(W.type, level).reads_tiles) return 0;
  return static_cast<size_t>(q40_tiles::whole_tiles(W.rows)) * q40_tiles::tile_bytes(W.cols / kQK);
}

void write_q40_tiles(const WeightMatrix& W, uint8_t* out, int64_t t0, int64_t t1, ThreadPool& pool) {
  using namespace q40_tiles;
  const int64_t nb = W.cols / kQK, steps = (nb + kStepBlocks - 1) / kStepBlocks;
  pool.parallel_for(t1 - t0, 16, [&](int64_t a, int64_t b) {
    for (int64_t t = t0 + a; t < t0 + b; ++t)
      for (int64_t s = 0; s < steps; ++s)
        for (int j = 0; j < kRows; ++j)
          std::memcpy(out + t * tile_bytes(nb) + step_offset(s) + j * step_row_bytes(nb, s),
                      W.row(t * kRows + j) + s * kRowStepBytes, step_row_bytes(nb, s));
  });
}

void dequantize_prepacked_row(const WeightMatrix& W, KernelLevel level, int64_t r, float* out) {
  using gemm_detail::Q32Panel;
  if (!W.packed) {
    const int64_t nb = W.cols / kQK;
    if (!W.tiles || r >= q40_tiles::whole_tiles(W.rows) * q40_tiles::kRows)
      return dequantize_row(W.type, W.row(r), out, W.cols);
    for (int64_t b = 0; b < nb; ++b) dequantize_row(W.type, q40_tiles::block(W.tiles, nb, r, b), out + b * kQK, kQK);
    return;
  }
  const GemmKernel k = gemm_kernel(W.type, level);
  const int64_t nb = W.cols / k.block_elems;
  const int64_t lane = r % kGemmTile;
  const int32_t offset = gemm_detail::q32_offset(W.type);
  const uint8_t* tile = W.packed + (r / kGemmTile) * nb * static_cast<int64_t>(k.panel_block_bytes);
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* p = tile + b * static_cast<int64_t>(k.panel_block_bytes);
    uint16_t h;
    std::memcpy(&h, p + Q32Panel::kD + 2 * lane, 2);
    const float d = f16_to_f32(h);
    for (int g = 0; g < 8; ++g)
      for (int i = 0; i < 4; ++i)
        out[b * 32 + 4 * g + i] = static_cast<float>(p[Q32Panel::kQ + g * 64 + lane * 4 + i] - offset) * d;
  }
}

void prepack(const WeightMatrix& W, KernelLevel level, uint8_t* out, ThreadPool& pool) {
  prepack_tiles(W, level, out, 0, (W.rows + kGemmTile - 1) / kGemmTile, pool);
}

}  // namespace tandem

#include "kernels/prepack.h"

#include "core/thread_pool.h"
#include "kernels/gemm.h"

namespace tandem {

size_t prepacked_bytes(const WeightMatrix& W, KernelLevel level) {
  if (W.type != GgmlType::Q8_0 || W.rows <= 0) return 0;
  const GemmKernel k = gemm_kernel(W.type, level);
  if (!k.pack || !k.run) return 0;
  const int64_t tiles = (W.rows + kGemmTile - 1) / kGemmTile;
  return static_cast<size_t>(tiles * (W.cols / k.block_elems)) * k.panel_block_bytes;
}

void prepack(const WeightMatrix& W, KernelLevel level, uint8_t* out, ThreadPool& pool) {
  const GemmKernel k = gemm_kernel(W.type, level);
  const int64_t nb = W.cols / k.block_elems;
  const int64_t tiles = (W.rows + kGemmTile - 1) / kGemmTile;
  const size_t tile_bytes = static_cast<size_t>(nb) * k.panel_block_bytes;
  pool.parallel_for(tiles, 16, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) k.pack(W, t * kGemmTile, 0, nb, out + t * tile_bytes);
  });
}

}  // namespace tandem

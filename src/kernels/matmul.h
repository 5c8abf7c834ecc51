// Linear layers: Y = X W^T for a batch of activation rows.
//
// The weight types with tiled kernels (q4_0, q5_0, q8_0, q4_K, q5_K, q6_K,
// f32, f16, bf16; see product_kernels.h) go through one code path for any number of
// rows: tiles of 16 weight rows are packed into panels (one lane per weight
// row) and multiplied by up to kGemmMaxRows activation rows at a time. With
// one row (decode) that streams every weight byte once at memory speed; with
// many (prefill) each packed panel is reused across all rows while it is in
// cache. Matrices repacked at load (WeightMatrix::packed, kernels/layouts.h)
// take the packed path for any number of rows and skip the packing. Each output is one fixed chain of float operations over its row, so
// a row's result never depends on how many rows came with it, where it sat in
// the batch, or the thread count: prefill and decode agree bit for bit.
// Other types fall back to one vec_dot per output, also batch invariant.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "quant/tensor.h"
#include "runtime/cpu_features.h"
#include "kernels/product_kernels.h"
#include "kernels/stream_tuning.h"

namespace tandem {

class ThreadPool;

class Matmul {
 public:
  // Products at `level` (which the CPU must run), streaming memory as `tuning` says.
  explicit Matmul(KernelLevel level = active_kernel_level(), const StreamTuning& tuning = stream_tuning());
  KernelLevel level() const { return level_; }
  const StreamTuning& tuning() const { return tuning_; }
  // Every tuning gives the same bits; change it only while no product runs.
  void set_tuning(const StreamTuning& tuning) { tuning_ = tuning; }

  // y[r * ldy + o] = sum_i W[o][i] * x[r * ldx + i], r < n_rows, o < W.rows.
  void run(const WeightMatrix& W, const float* x, int64_t ldx, int64_t n_rows, float* y, int64_t ldy,
           ThreadPool& pool);

  // Several matrices of the same width applied to the same input (e.g. the
  // Q, K and V projections): the input is quantized once per weight type and
  // the products of each type run in one parallel region. ys[i] has row
  // stride ldys[i]. Results equal separate run() calls bit for bit.
  void run_many(std::span<const WeightMatrix* const> Ws, const float* x, int64_t ldx, int64_t n_rows,
                std::span<float* const> ys, std::span<const int64_t> ldys, ThreadPool& pool);

 private:
  struct alignas(64) Line {
    uint8_t bytes[64];
  };
  struct ThreadScratch {
    std::vector<Line> panel;
    std::vector<float> acc;
  };
  void run_fallback(const WeightMatrix& W, const float* x, int64_t ldx, int64_t n_rows, float* y, int64_t ldy,
                    VecDotFn dot, ThreadPool& pool);

  KernelLevel level_;
  StreamTuning tuning_;
  GemmActs acts_;
  std::vector<ThreadScratch> scratch_;
  std::vector<int64_t> first_tile_;  // per matrix of run_many: its first tile in the shared list
  std::vector<char> stream_y_;       // per matrix of run_many: its outputs written with streaming stores
  std::vector<uint8_t> act_;  // fallback path: activations in the vec_dot type
};

}  // namespace tandem

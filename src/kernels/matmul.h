// Linear layers: Y = X W^T for a batch of activation rows.
//
// One row (decode) is a matrix-vector product: every weight byte is read once
// and the cost is memory bandwidth. Many rows (prefill) reuse each weight row
// across a tile of activation rows while it is in cache: matrix-matrix work,
// bounded by arithmetic. Either way each output element is one vec_dot over
// the whole row, so a row's result never depends on how many rows came with
// it (batch invariance) nor on the thread count.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace tandem {

class ThreadPool;

class Matmul {
 public:
  // y[r * ldy + o] = sum_i W[o][i] * x[r * ldx + i], r < n_rows, o < W.rows.
  void run(const WeightMatrix& W, const float* x, int64_t ldx, int64_t n_rows, float* y, int64_t ldy,
           ThreadPool& pool);

 private:
  std::vector<uint8_t> act_;  // activations converted to the weights' dot type
};

}  // namespace tandem

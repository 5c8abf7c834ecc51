#include "kernels/matmul.h"

#include <algorithm>

#include "core/thread_pool.h"
#include "kernels/dot.h"

namespace tandem {
namespace {

// Weight rows per tile in the many-row path: 16 rows of a 4096-wide Q8_0
// matrix are ~70 KB, which stays in L2 while every activation row passes.
constexpr int64_t kTileRows = 16;

}  // namespace

void Matmul::run(const WeightMatrix& W, const float* x, int64_t ldx, int64_t n_rows, float* y, int64_t ldy,
                 ThreadPool& pool) {
  if (n_rows <= 0) return;
  const GgmlType at = vec_dot_type(W.type);
  const size_t act_stride = row_bytes(at, W.cols);
  if (act_.size() < act_stride * n_rows) act_.resize(act_stride * n_rows);
  uint8_t* act = act_.data();
  pool.parallel_for(n_rows, 1, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) quantize_activations(at, x + r * ldx, act + r * act_stride, W.cols);
  });

  const VecDotFn dot = vec_dot_fn(W.type);
  const int64_t n = W.cols;
  if (n_rows == 1) {
    // Decode: stream the weights once.
    pool.parallel_for(W.rows, kTileRows, [&](int64_t o0, int64_t o1) {
      for (int64_t o = o0; o < o1; ++o) y[o] = dot(n, W.row(o), act);
    });
    return;
  }
  // Prefill: a tile of weight rows meets every activation row before moving on.
  const int64_t n_tiles = (W.rows + kTileRows - 1) / kTileRows;
  pool.parallel_for(n_tiles, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t o0 = t * kTileRows, o1 = std::min(W.rows, o0 + kTileRows);
      for (int64_t r = 0; r < n_rows; ++r) {
        const uint8_t* a = act + r * act_stride;
        float* yr = y + r * ldy;
        for (int64_t o = o0; o < o1; ++o) yr[o] = dot(n, W.row(o), a);
      }
    }
  });
}

}  // namespace tandem

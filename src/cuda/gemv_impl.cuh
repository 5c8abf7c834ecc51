// The matrix-vector kernel, written once over a unit type (formats.cuh) and
// instantiated per weight format in gemv_*.cu.
//
// One warp per weight row; a block of 8 warps takes 8 consecutive rows of
// the (up to three) matrices of one launch, so Q, K and V, or gate and up,
// are one launch. Each lane loads kUnroll aligned 16-byte units of its row
// before using them (enough bytes in flight per warp to stream HBM), and
// uses every loaded unit for all NR activation rows of the launch. The dot
// product of one (weight row, activation row) is: per lane, its units in
// order; then a fixed butterfly over the 32 lanes. Nothing depends on NR or
// on the other rows, so a row's result is the same in any batch.
#pragma once

#include "cuda/formats.cuh"

namespace tandem::cuda {

inline constexpr int kGemvWarps = 8;

struct GemvLaunch {
  GemvJob job[3];
  int64_t start[3];  // first global row of each job
  int64_t total = 0; // rows of all jobs
  int32_t n = 0;
};

template <class U>
__device__ __forceinline__ int64_t gemv_units(const DevMatrix& m) {
  return (m.cols + U::kElems - 1) / U::kElems;
}

template <class U, int NR>
__global__ void __launch_bounds__(kGemvWarps * 32) gemv_kernel(GemvLaunch L, DevActs x, int32_t row0, int32_t nr) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t grow = int64_t{blockIdx.x} * kGemvWarps + warp;
  // The job by constant indices only: a dynamic index into the kernel's
  // parameters would copy them to local memory.
  DevMatrix m = L.job[0].w;
  float* out = L.job[0].out;
  int64_t ld = L.job[0].out_ld, first = 0;
#pragma unroll
  for (int i = 1; i < 3; ++i)
    if (i < L.n && grow >= L.start[i]) m = L.job[i].w, out = L.job[i].out, ld = L.job[i].out_ld, first = L.start[i];
  const bool active = grow < L.total;
  const int64_t n = grow - first;
  if (active) {
    // The weights are never written by earlier kernels: start pulling this
    // row into L2 while the kernel before finishes.
    const int64_t bytes = q_row_bytes(m.type, m.cols);
    for (int64_t off = int64_t{lane} * 128; off < bytes; off += 32 * 128) prefetch_l2(m.q + n * bytes + off);
  }
  pdl_launch_dependents();
  pdl_wait();
  if (!active) return;

  const int64_t units = gemv_units<U>(m);
  float acc[NR];
#pragma unroll
  for (int r = 0; r < NR; ++r) acc[r] = 0.0f;
  for (int64_t base = 0; base < units; base += 32 * U::kUnroll) {
    typename U::Raw raw[U::kUnroll];
#pragma unroll
    for (int k = 0; k < U::kUnroll; ++k) {
      const int64_t u = base + 32 * k + lane;
      if (u < units) raw[k] = U::load(m, n, u);
      else raw[k] = {};
    }
#pragma unroll
    for (int k = 0; k < U::kUnroll; ++k) {
      const int64_t u = base + 32 * k + lane;
      const bool valid = u < units;
#pragma unroll
      for (int r = 0; r < NR; ++r)
        if (r < nr) U::accum(raw[k], m, n, u, x, row0 + r, valid, lane, acc[r]);
    }
  }
#pragma unroll
  for (int r = 0; r < NR; ++r) {
    const float s = warp_sum(acc[r]);
    if (lane == 0 && r < nr) out[(row0 + r) * ld + n] = s;
  }
}

// Launches over rows [row0, row0 + n_rows) in groups of kGemvMaxRows.
template <class U>
void gemv_launch(const GemvLaunch& L, const DevActs& x, int32_t row0, int32_t n_rows, cudaStream_t s) {
  const dim3 grid(static_cast<unsigned>((L.total + kGemvWarps - 1) / kGemvWarps));
  for (int32_t r = 0; r < n_rows; r += kGemvMaxRows) {
    const int32_t nr = n_rows - r < kGemvMaxRows ? n_rows - r : kGemvMaxRows;
    // NR rounds nr up to a power of two: fewer instantiations, and the rows
    // past nr cost nothing but a predicate.
    if (nr == 1) launch(gemv_kernel<U, 1>, grid, dim3(kGemvWarps * 32), 0, s, L, x, row0 + r, nr);
    else if (nr == 2) launch(gemv_kernel<U, 2>, grid, dim3(kGemvWarps * 32), 0, s, L, x, row0 + r, nr);
    else if (nr <= 4) launch(gemv_kernel<U, 4>, grid, dim3(kGemvWarps * 32), 0, s, L, x, row0 + r, nr);
    else launch(gemv_kernel<U, 8>, grid, dim3(kGemvWarps * 32), 0, s, L, x, row0 + r, nr);
  }
}

// Per-file dispatchers (gemv_q.cu, gemv_k.cu, gemv_f.cu): false when the
// type is not theirs.
bool gemv_q32(const GemvLaunch& L, const DevActs& x, int32_t row0, int32_t n_rows, cudaStream_t s);
bool gemv_kquant(const GemvLaunch& L, const DevActs& x, int32_t row0, int32_t n_rows, cudaStream_t s);
bool gemv_float(const GemvLaunch& L, const DevActs& x, int32_t row0, int32_t n_rows, cudaStream_t s);

}  // namespace tandem::cuda

// Microbenchmarks for the two ceilings of the roofline: how fast this machine
// reads memory (the bound on decode) and how many arithmetic operations per
// second the instruction family of a weight type can retire (the bound on
// prefill). Each runs on every thread of the pool, so the numbers are for the
// thread count the model runs with.
//
// Operations are counted the usual way: a multiply-add is 2 operations.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "kernels/vec_dot_impl.h"

namespace tandem {

class ThreadPool;

struct PeakMeasure {
  double value = 0;  // GB/s for bandwidth, G operations/s for compute
  std::string isa;   // the instructions measured, e.g. "avx512 vpdpbusd"
};

// Sums a buffer of `bytes` (rounded up to 4 KiB), split in contiguous slices
// over the threads, `passes` times; the best pass counts. The buffer must be
// far larger than the last-level cache for the result to mean DRAM bandwidth.
PeakMeasure measure_read_bandwidth(ThreadPool& pool, size_t bytes, int passes, KernelLevel level);
// The same over memory the caller owns (e.g. a model's weights, whose pages
// and page sizes are then those a decode reads): the regions' bytes split in
// equal contiguous shares over the threads.
PeakMeasure measure_read_bandwidth_of(ThreadPool& pool, std::span<const std::span<const uint8_t>> regions, int passes,
                                      KernelLevel level);

// Independent accumulator chains, so the result is throughput, not latency.
// `iters` loop iterations per thread per trial; the best of `trials` counts.
PeakMeasure measure_fp32_fma_peak(ThreadPool& pool, int64_t iters, int trials, KernelLevel level);
// u8 x s8 -> s32 dot products: vpdpbusd with VNNI, else vpmaddubsw+vpmaddwd.
PeakMeasure measure_int8_dot_peak(ThreadPool& pool, int64_t iters, int trials, KernelLevel level);
// bf16 pair dot products (vdpbf16ps) when the CPU has AVX512-BF16 and the
// level is avx512-vnni (the level whose kernels use it); otherwise bf16 is
// widened to f32 and multiplied with FMA, so this returns the fp32 peak.
PeakMeasure measure_bf16_dot_peak(ThreadPool& pool, int64_t iters, int trials, KernelLevel level);

}  // namespace tandem

// How the products stream weights from memory, chosen per microarchitecture
// and held by each Matmul. Decode reads every weight once per token, and what
// keeps the memory system busy differs between CPUs of the same ISA: software
// prefetch ahead of the loads helps on AMD Zen 5 (where the kernels were
// tuned) and hurts on Zen 4, whose hardware prefetcher already follows one
// stream per core. Other CPUs keep the Zen 5 tuning. Every tuning gives the
// same bits: it changes the order of memory reads, never of arithmetic.
// Measurements: docs/performance.md.
#pragma once

#include <cstddef>
#include <cstdint>

#include "runtime/options.h"

namespace tandem {

struct StreamTuning {
  // Streaming kernels prefetch the weights ahead of their loads.
  bool software_prefetch = true;
  // Float (f32/f16/bf16) products with one activation row read one weight
  // row at a time (one stream) instead of four side by side (AVX-512 kernels;
  // the AVX2 ones read two or four rows either way).
  bool float_single_row = false;
  // The tiled kernels' repacked panels (q8_0, serving steps): prefetch this
  // many bytes ahead when the first row group has at least this many rows
  // (0 bytes: never).
  int32_t panel_prefetch_bytes = 16384;
  int32_t panel_prefetch_min_rows = 1;
  // Products of more than one row group: the last group, reading the panel
  // chunk from L1, prefetches the next chunk into L2 for the first group.
  bool panel_prefetch_next = true;
  // Products of at least this many rows run two panels (32 weight rows) per
  // kernel call where the kernel has run2 (0: never). Not a streaming
  // choice, but one the tests flip the same way: the same bits either way.
  int64_t panel_pair_min_rows = 9;
  // Products whose outputs take at least this many bytes (and start on a
  // cache line) write them with streaming stores, which skip reading each
  // line before overwriting it: a 16-row step's logits over Gemma 3's
  // 262144-token vocabulary are 16 MiB, nothing a cache keeps (-1: never).
  int64_t stream_out_min_bytes = int64_t{4} << 20;
};

// This CPU's tuning (from CPUID), with the options' overrides: --prefetch off
// turns every software prefetch off, on turns them all on (the panels' at
// this CPU's distance, for any rows); --panel-pairs N sets
// panel_pair_min_rows; --stream-out off turns the outputs' streaming stores off.
StreamTuning stream_tuning(const RuntimeOptions& opts = {});

// The row-wise (decode) kernels prefetch at least this far ahead: the
// hardware prefetcher alone leaves them well short of bandwidth. A kernel
// reading rows o..o+n-1 side by side prefetches the same offsets a whole number of
// n-row groups ahead (prefetch_distance), i.e. bytes a later group will read
// at the same point; a plain "4 KB ahead" would land on the next row of the
// current group, already being read.
constexpr int64_t kPrefetchBytes = 4096;
// Kernels reading only 1 or 2 rows side by side (the K-quants) need more: 4 KB
// ahead is about one memory latency of their single stream.
constexpr int64_t kPrefetchBytesFewRows = 16384;

// 0 (no prefetch) where the CPU streams better without (StreamTuning::
// software_prefetch, which the products pass in `prefetch`).
inline int64_t prefetch_distance(bool prefetch, size_t row_stride, int rows_side_by_side,
                                 int64_t at_least = kPrefetchBytes) {
  if (!prefetch) return 0;
  const int64_t group = static_cast<int64_t>(row_stride) * rows_side_by_side;
  return (at_least + group - 1) / group * group;
}

}  // namespace tandem

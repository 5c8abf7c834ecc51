// Serving metrics: counters, gauges and latency histograms, read by the
// server's /metrics endpoint (Prometheus text format).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "engine/step_log.h"

namespace tandem {

struct Histogram {
  std::vector<double> bounds;     // upper bounds in seconds, ascending (+Inf implied)
  std::vector<uint64_t> counts;   // per bucket (not cumulative), bounds.size() + 1 entries
  double sum = 0;
  uint64_t count = 0;

  explicit Histogram(std::vector<double> b = {}) : bounds(std::move(b)), counts(bounds.size() + 1, 0) {}
  void observe(double v) {
    size_t i = 0;
    while (i < bounds.size() && v > bounds[i]) ++i;
    ++counts[i];
    sum += v;
    ++count;
  }
};

// The KV store (--kv-store; engine/kv_store.h): blocks and bytes read into
// the prefix cache and written out, files refused or not written, and the
// time each side took.
struct KvStoreStats {
  uint64_t blocks_read = 0, bytes_read = 0;
  uint64_t read_failures = 0;  // files refused (corrupt, truncated, another model or format)
  uint64_t blocks_written = 0, bytes_written = 0;
  uint64_t write_failures = 0;  // the OS refused, or the writer's queue was full
  uint64_t blocks_evicted = 0;
  double read_seconds = 0;     // intake: reading, checking and loading files
  double capture_seconds = 0;  // the engine's thread copying blocks out for the writer
  double write_seconds = 0;    // the writer thread: encoding and writing
  int64_t bytes = 0;           // on disk, as this instance knows it
};

struct MetricsSnapshot {
  // gauges
  int64_t running = 0, waiting = 0, swapped = 0;
  int64_t sessions = 0;  // progressive prefill sessions kept
  int64_t kv_blocks_used = 0, kv_blocks_free = 0, kv_blocks_cached = 0, kv_blocks_total = 0;
  // Positions the pool holds with every layer's K/V (blocks x block size / groups).
  int64_t kv_tokens_total = 0;
  int32_t kv_window = 0;  // > 0: sliding-window layers keep this many positions
  int64_t kv_blocks_published = 0;  // in the prefix cache's index, used or free
  bool prefix_caching = true;
  // counters
  uint64_t requests_finished = 0, requests_cancelled = 0, requests_rejected = 0;
  uint64_t prompt_tokens = 0, generation_tokens = 0;
  uint64_t prefix_cache_queried_tokens = 0, prefix_cache_hit_tokens = 0;
  uint64_t preemptions = 0;
  uint64_t swap_outs = 0;  // preemptions that swapped K/V out instead of recomputing
  // Speculative decoding: tokens drafted and kept, and the sequence-steps
  // that verified drafts with the tokens they gave (tokens per step).
  uint64_t spec_drafted = 0, spec_accepted = 0, spec_steps = 0, spec_step_tokens = 0;
  // Sparse attention: blocks (per layer and KV head) its rows read, and the
  // blocks their sequences held then.
  uint64_t sparse_blocks_read = 0, sparse_blocks_held = 0;
  // Forward steps by phase (indexed by Phase): how many, their wall time and
  // rows. Mean step time and rows per step say what the scheduler and pacer
  // made of a load, which the step count alone does not.
  struct PhaseTotals {
    uint64_t steps = 0, rows = 0;
    double seconds = 0;
  };
  std::array<PhaseTotals, 3> phases{};
  uint64_t steps() const {
    uint64_t n = 0;
    for (const PhaseTotals& p : phases) n += p.steps;
    return n;
  }
  bool kv_store = false;  // --kv-store given
  KvStoreStats store;
  // latencies (seconds)
  Histogram ttft{{0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30}};
  Histogram itl{{0.002, 0.005, 0.01, 0.02, 0.04, 0.08, 0.15, 0.3, 0.6, 1.2}};
  Histogram e2e{{0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120}};
};

}  // namespace tandem

// The engine's metrics as they happen: counters and latencies recorded on the
// engine's thread (and rejections on the submitting one), gauges read from
// the block manager and the scheduler after each step; read whole from any
// thread.
#pragma once

#include <cstdint>
#include <mutex>

#include "engine/metrics.h"
#include "engine/step_log.h"

namespace tandem {

class BlockManager;
class Scheduler;

class MetricsRecorder {
 public:
  MetricsSnapshot snapshot() const;
  // The pool's fixed figures, once.
  void set_pool(int64_t blocks_total, int64_t tokens_total, int32_t window, bool prefix_caching);
  // A generated token: the first of its sequence (latency: since arrival) or
  // a later one (latency: since the one before).
  void token(bool first, double latency_s);
  void step(Phase phase, int32_t rows, double seconds, int32_t prompt_rows);
  // A verification of `drafted` drafts that kept `accepted` and gave `tokens`.
  void speculation(int32_t drafted, int32_t accepted, int32_t tokens);
  // Sparse attention's totals so far (Model::sparse_counts).
  void sparse_blocks(int64_t read, int64_t held);
  // A request's last choice ended.
  void request_finished(bool cancelled, double e2e_s);
  void request_rejected();
  void gauges(const BlockManager& blocks, const Scheduler& sched, int64_t sessions);

 private:
  mutable std::mutex mu_;
  MetricsSnapshot m_;
};

}  // namespace tandem

#include "engine/metrics_recorder.h"

#include "engine/scheduler.h"
#include "kv/block_manager.h"

namespace tandem {

MetricsSnapshot MetricsRecorder::snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  return m_;
}

void MetricsRecorder::set_pool(int64_t blocks_total, int64_t tokens_total, int32_t window, bool prefix_caching) {
  std::lock_guard<std::mutex> lock(mu_);
  m_.kv_blocks_total = blocks_total;
  m_.kv_tokens_total = tokens_total;
  m_.kv_window = window;
  m_.prefix_caching = prefix_caching;
}

void MetricsRecorder::token(bool first, double latency_s) {
  std::lock_guard<std::mutex> lock(mu_);
  if (first) m_.ttft.observe(latency_s);
  else m_.itl.observe(latency_s);
  ++m_.generation_tokens;
}

void MetricsRecorder::step(Phase phase, int32_t rows, double seconds, int32_t prompt_rows) {
  std::lock_guard<std::mutex> lock(mu_);
  m_.prompt_tokens += prompt_rows;
  MetricsSnapshot::PhaseTotals& pt = m_.phases[static_cast<size_t>(phase)];
  ++pt.steps;
  pt.rows += rows;
  pt.seconds += seconds;
}

void MetricsRecorder::speculation(int32_t drafted, int32_t accepted, int32_t tokens) {
  std::lock_guard<std::mutex> lock(mu_);
  m_.spec_drafted += drafted;
  m_.spec_accepted += accepted;
  ++m_.spec_steps;
  m_.spec_step_tokens += tokens;
}

void MetricsRecorder::sparse_blocks(int64_t read, int64_t held) {
  std::lock_guard<std::mutex> lock(mu_);
  m_.sparse_blocks_read = static_cast<uint64_t>(read);
  m_.sparse_blocks_held = static_cast<uint64_t>(held);
}

void MetricsRecorder::request_finished(bool cancelled, double e2e_s) {
  std::lock_guard<std::mutex> lock(mu_);
  ++m_.requests_finished;
  if (cancelled) ++m_.requests_cancelled;  // requests, not their choices
  m_.e2e.observe(e2e_s);
}

void MetricsRecorder::request_rejected() {
  std::lock_guard<std::mutex> lock(mu_);
  ++m_.requests_rejected;
}

void MetricsRecorder::gauges(const BlockManager& blocks, const Scheduler& sched, int64_t sessions) {
  const BlockStats bs = blocks.stats();
  std::lock_guard<std::mutex> lock(mu_);
  m_.sessions = sessions;
  m_.running = static_cast<int64_t>(sched.n_running());
  m_.waiting = static_cast<int64_t>(sched.n_waiting());
  m_.swapped = static_cast<int64_t>(sched.n_swapped());
  m_.swap_outs = sched.swap_outs();
  m_.kv_blocks_used = bs.used;
  m_.kv_blocks_free = bs.free;
  m_.kv_blocks_cached = bs.cached_free;
  m_.kv_blocks_published = bs.published;
  m_.prefix_cache_queried_tokens = bs.queried_tokens;
  m_.prefix_cache_hit_tokens = bs.hit_tokens;
  m_.preemptions = sched.preemptions();
}

}  // namespace tandem

// The serving engine: many requests in flight, one forward pass per step.
//
// Every step the scheduler re-forms the batch (iteration-level scheduling):
// decode tokens of running sequences plus prefill chunks of others, within a
// token budget. New requests join at the next step and finished ones leave at
// once. KV memory is a pool of blocks shared through a prefix cache.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "engine/metrics.h"
#include "engine/request.h"
#include "kv/kv_cache.h"

namespace tandem {

class Model;

enum class SchedulePolicy {
  kLatency,     // decodes first, small prefill chunks: chat
  kThroughput,  // large prefill chunks and batches: batch jobs
};

struct EngineConfig {
  int32_t threads = 0;               // 0: physical cores
  int32_t max_context = 0;           // per sequence; 0: min(model's training context, 4096)
  int64_t kv_tokens = 0;             // KV pool size in tokens; 0: from kv_bytes
  int64_t kv_bytes = 0;              // KV pool size in bytes; 0 (and kv_tokens 0): room for max_seqs full contexts, capped at 2 GiB
  int32_t block_size = 16;
  KvType kv_type = KvType::kF16;
  int32_t max_batch_tokens = 0;      // per-step token budget; 0: policy default (latency 256, throughput 1024)
  int32_t max_seqs = 32;             // sequences per step
  int32_t max_waiting = 256;         // bounded wait queue: submit() beyond it is refused
  SchedulePolicy policy = SchedulePolicy::kLatency;
  // Latency policy: a step that prefills next to running decodes aims at this
  // multiple of a decode-only step's time (see engine/prefill_pacer.h);
  // <= 1 turns pacing off (prompt chunks are then sized by tokens alone).
  double step_factor = 1.5;
  bool prefix_caching = true;
  // Host memory for the K/V of preempted sequences (bytes); 0: they are
  // recomputed instead (see engine/scheduler.h).
  int64_t swap_bytes = 0;
  // Stands in for the memory available (RuntimeOptions::memory_available).
  std::optional<uint64_t> memory_available = std::nullopt;
};

class Engine {
 public:
  Engine(Model& model, const EngineConfig& cfg);  // throws tandem::Error
  ~Engine();                                      // stops the loop thread
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Runs the step loop on a thread of its own until stop().
  void start();
  void stop();

  // Thread-safe. Returns the request id. Throws Error(kInvalidArgument) for an
  // empty prompt, a prompt that leaves no room in the context, or bad
  // parameters; Error(kResource) when the wait queue is full (overload).
  uint64_t submit(std::vector<int32_t> prompt, const RequestParams& params, EventSink sink);
  // Thread-safe, idempotent: the request ends with finish_reason "cancelled"
  // and its blocks are freed at the next step.
  void cancel(uint64_t request_id);

  MetricsSnapshot metrics() const;  // thread-safe
  const EngineConfig& config() const { return cfg_; }
  const Model& model() const { return model_; }

  // For tests and offline use without start(): runs one step; false when idle.
  bool step();

 private:
  struct Impl;
  Model& model_;
  EngineConfig cfg_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tandem

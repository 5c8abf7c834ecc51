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
#include <string_view>
#include <thread>
#include <vector>

#include "engine/intake.h"
#include "engine/metrics.h"
#include "engine/request.h"
#include "engine/speculation.h"
#include "kv/block_format.h"
#include "kv/block_manager.h"
#include "kv/kv_cache.h"

namespace tandem {

class Model;
class ThreadPool;

// One request's outcome, whole (Engine::run_one).
struct Completion {
  std::string text;              // the generated text (a stop string not included)
  std::vector<int32_t> tokens;   // the generated ids
  std::string finish_reason;     // as RequestEvent
  std::string stop_cause;
  std::string error;
  RequestTimings timings;
};

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
  KvCacheTypes kv_cache = {};        // element types of K and V (kv/kv_cache.h)
  int32_t max_batch_tokens = 0;      // per-step token budget; 0: policy default (latency 256, throughput 1024)
  int32_t max_seqs = 32;             // sequences per step
  // Bounded wait queue: submit() is refused while this many sequences wait
  // with no free slot among max_seqs to start in.
  int32_t max_waiting = 256;
  SchedulePolicy policy = SchedulePolicy::kLatency;
  // Latency policy: a step that prefills next to running decodes aims at this
  // multiple of a decode-only step's time (see engine/prefill_pacer.h);
  // <= 1 turns pacing off (prompt chunks are then sized by tokens alone).
  double step_factor = 1.5;
  bool prefix_caching = true;
  // Host memory for the K/V of preempted sequences (bytes); 0: they are
  // recomputed instead (see engine/scheduler.h).
  int64_t swap_bytes = 0;
  // A folder of KV blocks that outlives the process (engine/kv_store.h),
  // shared by instances of one model; empty: none. Files beyond
  // kv_store_bytes go, least recently used first.
  std::string kv_store;
  int64_t kv_store_bytes = int64_t{4} << 30;
  // Blocks computed by a prefill instance (RequestParams::kv_import) go into
  // the pool a few per step while sequences decode: each step spends at most
  // this share of its time on them (1: all at intake, whatever it stalls).
  double kv_import_share = 0.1;
  // Speculative decoding (engine/speculation.h); kDraft needs a draft model.
  SpecConfig spec{};
  // Progressive prefill sessions (RequestParams::session): at most this many,
  // each forgotten after this long unused. Each keeps one partial block and
  // a row of logits (1 MiB for Gemma 3's 262k vocabulary).
  int32_t max_sessions = 64;
  double session_ttl_s = 600;
  // Where the forward passes run: "cpu", or "cuda" (model/executor.h).
  std::string device = "cpu";
  // Stands in for the memory available (RuntimeOptions::memory_available).
  std::optional<uint64_t> memory_available = std::nullopt;
};

class Engine {
 public:
  // `draft`: the draft model of SpecMode::kDraft, sharing the model's
  // vocabulary (a difference is an error naming it); it must outlive the engine.
  Engine(Model& model, const EngineConfig& cfg, Model* draft = nullptr);  // throws tandem::Error
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
  int threads() const;  // compute threads
  size_t kv_bytes() const;  // the KV pool
  size_t kv_block_bytes() const;  // one block of it (a page), as exported
  std::string device() const;  // where the forward passes run
  // The compute threads, for work measured beside the engine's (bench's
  // read of the weights); not while the engine steps.
  ThreadPool& compute_pool();
  const Model& model() const { return model_; }
  // Prompts and conversations to token ids, and back (thread-safe).
  const Intake& intake() const;

  // For tests and offline use without start(): runs one step; false when idle.
  bool step();
  // Called on the engine's thread after every step (the live timeline); set
  // before start(). It must be quick: copy what it needs and return.
  void set_step_observer(std::function<void(const StepReport&)> fn);
  // Called on the engine's thread after each step that changed what the
  // prefix cache holds, with the changes in order (KV events, published by
  // server/kv_events.h); hash_seed names the root of every prefix
  // (kv/block_hash.h). Set before start().
  void set_kv_event_sink(std::function<void(std::vector<KvCacheEvent>)> fn, std::string_view hash_seed = "");
  // Thread-safe (asks the engine's thread; not while run_one steps): how many
  // of the prompt's leading full blocks the prefix cache holds, what a KV
  // transfer from another instance can skip. 0 when the loop does not
  // answer within `timeout_s`.
  int32_t cached_blocks(const std::vector<int32_t>& prompt, const std::string& salt, double timeout_s = 5.0);
  // Whether this engine's blocks can be exported and imported
  // (engine/kv_transfer.h): "" when they can, else why not.
  std::string kv_transfer_unsupported() const;
  // What this engine's blocks look like outside it (kv/block_format.h):
  // the model's fingerprint, the cache's format, shape and paging.
  KvBlockLayout kv_block_layout() const;
  // Thread-safe: at the next step, the prefix cache forgets every block no
  // sequence holds (a cold start; AllBlocksCleared when that is all of them).
  void reset_prefix_cache();

  // Waits until the KV store's writer has written every block queued so far
  // (a no-op without --kv-store).
  void flush_kv_store();

  // For tests, between steps: throws std::logic_error naming the first broken
  // invariant of the KV block accounting (BlockManager::check_invariants).
  void check_invariants();
  // One request start to finish on the calling thread, stepping the engine
  // itself (start() must not have been called): what `tandem run` is. on_text
  // gets the text as it is decided (held back while it could be a stop
  // string); returning false cancels the request. Throws like submit().
  Completion run_one(std::vector<int32_t> prompt, const RequestParams& params,
                     const std::function<bool(std::string_view)>& on_text = {});

 private:
  struct Impl;
  Model& model_;
  EngineConfig cfg_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tandem

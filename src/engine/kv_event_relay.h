// KV events: what the prefix cache gained and lost each step, handed to a
// sink between steps (server/kv_events.h publishes them), and the cache
// reset asked for from any thread, done between steps on the engine's.
#pragma once

#include <atomic>
#include <functional>
#include <string_view>
#include <vector>

#include "kv/block_manager.h"

namespace tandem {

class KvEventRelay {
 public:
  using Sink = std::function<void(std::vector<KvCacheEvent>)>;
  explicit KvEventRelay(BlockManager& blocks) : blocks_(blocks) {}
  // hash_seed names the root of every prefix (kv/block_hash.h). Before the
  // engine steps.
  void set_sink(Sink fn, std::string_view hash_seed);
  // Thread-safe.
  void request_reset() { reset_ = true; }
  bool reset_requested() const { return reset_.load(); }
  // Between steps: the prefix cache forgets every block no sequence holds,
  // when that was asked for. True when it did.
  bool reset_if_requested();
  // Between steps, after any reset: the changes since the last call to the sink.
  void publish();

 private:
  BlockManager& blocks_;
  Sink sink_;
  std::atomic<bool> reset_{false};
};

}  // namespace tandem

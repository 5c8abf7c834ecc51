// The engine's KV pool: how many blocks it holds and how its layers are
// paged, from what was asked for (tokens or bytes, or a default) and the
// memory available now.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "kv/kv_cache.h"
#include "model/executor.h"

namespace tandem {

class Model;

struct KvPoolAsk {
  KvCacheTypes kv_cache;
  KvFormat format;             // kv_format(kv_cache)
  int32_t block_size = 16;
  int32_t max_context = 0;     // per sequence
  int32_t max_seqs = 1;
  int64_t kv_tokens = 0;       // 0: from kv_bytes
  int64_t kv_bytes = 0;        // 0 (and kv_tokens 0): max_seqs full contexts, capped at 2 GiB and half the memory
  int64_t swap_bytes = 0;      // host memory beside the pool, counted against what is available
  int32_t prefill_chunk = 0;   // a windowed group holds its window and one prompt chunk
  // Sliding-window layers on pages of their own; false keeps every layer in
  // one group (--swa-full, a streaming window, a device other than the CPU).
  bool page_windowed_layers = true;
  std::optional<uint64_t> memory_available;  // stands in for the memory available
  // Layers whose blocks keep key bounds (sparse attention: kv/key_bounds.h;
  // empty: none), passed on to the plan: their bytes beside every block are
  // part of the pool.
  std::vector<bool> key_bounds;
};

// Bytes of a planned pool: its blocks' K/V and their key bounds.
uint64_t kv_pool_bytes(const KvPlan& plan);

// Throws Error naming the problem: a pool that cannot hold one full context,
// a size beyond the memory available, negative swap space. A size in bytes
// (kv_bytes, or the default's share of the memory) counts the key bounds.
KvPlan size_kv_pool(const Model& model, const KvPoolAsk& ask);

}  // namespace tandem

// A streaming window (--kv-window N --kv-sinks S, StreamingLLM): once a
// sequence holds a block more than S + N positions, the oldest positions
// after the first S go, whole blocks of them, and the keys before the gap
// turn on by as many positions, so that every distance a query sees is the
// one in the cache. With heavy hitters (--kv-heavy H, H2O) H more positions
// are kept between: each eviction takes the block of positions, among the
// H / block + 1 after the sinks, that has had the least attention so far.
#pragma once

#include <cstdint>
#include <string>

#include "engine/speculation.h"
#include "kv/kv_cache.h"

namespace tandem {

class BlockManager;
class Executor;
struct Sequence;

// Throws Error naming what does not fit: negative sizes, heavy hitters
// without a window or off the block size, a window smaller than its sinks or
// larger than the context, a window with a draft model or on a GPU, heavy
// hitters with speculation.
void check_streaming_window(const KvCacheTypes& kc, int32_t block_size, int32_t max_context, SpecMode spec,
                            const std::string& device);

class StreamingWindow {
 public:
  // key_width: the floats of one position's keys over every layer.
  StreamingWindow(const KvCacheTypes& kc, int32_t block_size, int32_t key_width, BlockManager& blocks,
                  Executor& exec);
  // The eviction point: sinks + window + heavy hitters + a block (0: no window).
  int32_t limit() const { return limit_; }
  // Points the forward pass's view of `s` at its attention mass (heavy
  // hitters), sizing it at first use.
  void attach(Sequence& s, SeqKv& kv) const;
  // Evicts what `s` holds past the eviction point, after a step committed
  // its rows; tried again next step when the pool cannot copy a shared block.
  void slide(Sequence& s);

 private:
  int32_t window_, sinks_, heavy_, limit_;
  int32_t key_width_;
  BlockManager& blocks_;
  Executor& exec_;
};

}  // namespace tandem

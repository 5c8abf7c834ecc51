#include "engine/streaming_window.h"

#include <numeric>
#include <vector>

#include "core/error.h"
#include "engine/sequence.h"
#include "kv/block_manager.h"
#include "model/executor.h"

namespace tandem {

void check_streaming_window(const KvCacheTypes& kc, int32_t block_size, int32_t max_context, SpecMode spec,
                            const std::string& device) {
  if (kc.window < 0 || kc.sinks < 0)
    fail(ErrorKind::kInvalidArgument, "--kv-window and --kv-sinks must be >= 0 (got {} and {})", kc.window, kc.sinks);
  if (kc.heavy != 0) {
    if (kc.window <= 0)
      fail(ErrorKind::kInvalidArgument, "--kv-heavy {} needs a streaming window (--kv-window)", kc.heavy);
    if (kc.heavy < 0 || kc.heavy % block_size != 0)
      fail(ErrorKind::kInvalidArgument, "--kv-heavy {} is not a multiple of the block size ({})", kc.heavy,
           block_size);
    // Rejected drafts' rows would add their attention to the positions'
    // mass, and so change what is evicted.
    if (spec != SpecMode::kOff)
      fail(ErrorKind::kInvalidArgument, "--kv-heavy does not combine with speculative decoding (--spec {})",
           spec_mode_name(spec));
  }
  if (kc.window > 0) {
    if (kc.window < kc.sinks)
      fail(ErrorKind::kInvalidArgument, "the streaming window (--kv-window {}) is smaller than its sinks (--kv-sinks {})",
           kc.window, kc.sinks);
    if (stream_positions(kc, block_size) > max_context)
      fail(ErrorKind::kInvalidArgument,
           "a streaming window of {} positions and {} sinks{} needs a context of at least {} tokens, not {}", kc.window,
           kc.sinks, kc.heavy > 0 ? fmt::format(" and {} heavy hitters", kc.heavy) : "",
           stream_positions(kc, block_size), max_context);
    if (device != "cpu") fail(ErrorKind::kUnsupported, "--kv-window runs on the CPU only (--device {})", device);
    if (spec == SpecMode::kDraft)
      fail(ErrorKind::kInvalidArgument, "--kv-window does not combine with a draft model (--spec draft)");
  }
}

StreamingWindow::StreamingWindow(const KvCacheTypes& kc, int32_t block_size, int32_t key_width, BlockManager& blocks,
                                 Executor& exec)
    : window_(kc.window),
      sinks_(kc.sinks),
      heavy_(kc.heavy),
      limit_(static_cast<int32_t>(stream_positions(kc, block_size))),
      key_width_(key_width),
      blocks_(blocks),
      exec_(exec) {}

void StreamingWindow::attach(Sequence& s, SeqKv& kv) const {
  kv.attn_mass = nullptr;
  if (heavy_ <= 0) return;
  if (s.attn_mass.empty()) s.attn_mass.assign(size_t(limit_), 0.0f);
  kv.attn_mass = s.attn_mass.data();
}

void StreamingWindow::slide(Sequence& s) {
  const int32_t bs = blocks_.block_size();
  if (limit_ == 0 || s.blocks.n_computed < limit_ || s.status != SeqStatus::kRunning) return;
  if (heavy_ > 0) s.attn_mass.resize(size_t(limit_), 0.0f);  // (a step has sized it already)
  while (s.blocks.n_computed - sinks_ - heavy_ - window_ >= bs) {
    const int32_t held = s.blocks.n_computed;
    int32_t from = sinks_, count = (held - sinks_ - heavy_ - window_) / bs * bs;
    if (heavy_ > 0) {
      // One block at a time: the candidates' masses change with each.
      count = bs;
      double least = 0;
      for (int32_t a = sinks_; a + bs <= held - window_; a += bs) {
        const double m = std::accumulate(s.attn_mass.begin() + a, s.attn_mass.begin() + a + bs, 0.0);
        if (a == sinks_ || m < least) {
          least = m;
          from = a;
        }
      }
    }
    if (blocks_.evict_cost(s.blocks, from) > blocks_.n_free()) return;
    SeqKv sk;
    sk.blocks = s.blocks.table;
    // The keys before the gap as they are now (slot + evicted rotated),
    // read once.
    const int32_t width = key_width_;
    const int32_t have = static_cast<int32_t>(s.kept_rotation.size());
    if (have < from) {
      s.kept_keys.resize(size_t(from) * size_t(width));
      exec_.read_keys(sk, have, from - have, s.kept_keys.data() + size_t(have) * width);
      for (int32_t i = have; i < from; ++i) s.kept_rotation.push_back(i + s.evicted);
    }
    blocks_.evict(s.blocks, from, count);
    s.evicted += count;
    if (heavy_ > 0) {
      s.attn_mass.erase(s.attn_mass.begin() + from, s.attn_mass.begin() + from + count);
      s.attn_mass.resize(size_t(limit_), 0.0f);
    }
    if (static_cast<int32_t>(s.kept_rotation.size()) > from) {  // the kept copies stop at the gap
      s.kept_rotation.resize(size_t(from));
      s.kept_keys.resize(size_t(from) * size_t(width));
    }
    if (from > 0) {
      std::vector<int32_t> delta(static_cast<size_t>(from));
      for (int32_t i = 0; i < from; ++i) delta[i] = i + s.evicted - s.kept_rotation[i];
      sk.blocks = s.blocks.table;
      exec_.write_keys(sk, 0, from, s.kept_keys.data(), delta.data());
    }
  }
}

}  // namespace tandem

#include "engine/kv_event_relay.h"

namespace tandem {

void KvEventRelay::set_sink(Sink fn, std::string_view hash_seed) {
  sink_ = std::move(fn);
  if (sink_) blocks_.record_events(hash_seed);
}

bool KvEventRelay::reset_if_requested() {
  if (!reset_.exchange(false)) return false;
  blocks_.clear_prefix_cache();
  return true;
}

void KvEventRelay::publish() {
  if (!sink_) return;
  std::vector<KvCacheEvent> ev = blocks_.take_events();
  if (!ev.empty()) sink_(std::move(ev));
}

}  // namespace tandem

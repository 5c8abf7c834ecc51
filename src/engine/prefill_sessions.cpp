#include "engine/prefill_sessions.h"

#include <algorithm>
#include <iterator>

#include "engine/sequence.h"
#include "engine/step_log.h"
#include "model/executor.h"

namespace tandem {

PrefillSessions::PrefillSessions(BlockManager& blocks, Executor& exec, const StepLog& clock, int32_t max_sessions,
                                 double ttl_s)
    : blocks_(blocks), exec_(exec), clock_(clock), max_sessions_(max_sessions), ttl_s_(ttl_s) {}

void PrefillSessions::resume(Sequence& s) {
  if (s.req->params.session.empty() || s.n_generated() > 0) return;
  const auto it = sessions_.find(s.req->params.session);
  if (it == sessions_.end()) return;
  Session& ss = it->second;
  ss.last_used = clock_.now();
  // The prefix cache found the whole blocks the prompt shares with the
  // session (or fewer, if some were evicted). The next block is fresh: copy
  // the session's version of it and keep its positions up to where the two
  // part (an edit, or where the session stopped).
  // With the session's logits for exactly this prompt, its last position
  // needs no computing either.
  const bool same = ss.logits && ss.tokens == s.tokens;
  const int32_t bs = blocks_.block_size(), start = s.n_computed();
  if (start % bs != 0) {
    // A wholly cached prompt: the private copy of its last block holds the
    // last position's K/V too, which would be recomputed for its logits.
    if (same && start + 1 == s.n_prompt) {
      blocks_.commit(s.blocks, s.tokens, s.n_prompt);
      s.start_logits = ss.logits;
      ready_.push_back(&s);
    }
    return;
  }
  const int32_t h = start / bs;
  const int32_t limit =
      std::min({bs, s.n_prompt - (same ? 0 : 1) - start, static_cast<int32_t>(ss.tokens.size()) - start});
  int32_t r = 0;
  while (r < limit && s.tokens[start + r] == ss.tokens[start + r]) ++r;
  if (r <= 0) return;
  const std::vector<int32_t> src = block_copy(ss, h);
  const int32_t nw = blocks_.n_windowed();
  if (static_cast<int32_t>(src.size()) != 1 + nw) return;
  // The windowed groups' tables end at the hits: block h is their next one.
  if (!blocks_.can_append(s.blocks, start + r)) return;
  blocks_.append(s.blocks, start + r);
  exec_.copy_block(src[0], s.blocks.table[h]);
  for (int32_t g = 0; g < nw; ++g) exec_.copy_block(src[1 + g], s.blocks.windowed[g].table[h]);
  blocks_.commit(s.blocks, s.tokens, start + r);
  if (start + r == s.n_prompt) {
    s.start_logits = ss.logits;
    ready_.push_back(&s);
  }
}

std::vector<int32_t> PrefillSessions::block_copy(const Session& ss, int32_t h) const {
  // Its published whole block, or the pinned copy of its partly filled last one.
  std::vector<int32_t> src;
  const int32_t bs = blocks_.block_size(), nw = blocks_.n_windowed();
  if (h < static_cast<int32_t>(ss.whole.size()) && blocks_.holds(ss.whole[h])) {
    src.push_back(ss.whole[h].block);
    for (int32_t g = 0; g < nw; ++g)
      if (blocks_.holds(ss.whole_windowed[g][h])) src.push_back(ss.whole_windowed[g][h].block);
  } else if (h == static_cast<int32_t>(ss.tokens.size()) / bs && !ss.tail.table.empty()) {
    src.push_back(ss.tail.table[0]);
    for (const auto& w : ss.tail.windowed) src.push_back(w.table[0]);
  }
  return src;
}

std::vector<Sequence*> PrefillSessions::take_ready() {
  std::vector<Sequence*> out;
  out.swap(ready_);
  return out;
}

void PrefillSessions::save(Sequence& s, std::shared_ptr<const std::vector<float>> logits) {
  const int32_t n = s.n_computed(), bs = blocks_.block_size();
  if (n <= 0 || s.evicted > 0) return;  // a streaming window's cache no longer holds the prefix
  auto it = sessions_.find(s.req->params.session);
  if (it != sessions_.end()) blocks_.free(it->second.tail);
  Session& ss = sessions_[s.req->params.session];
  ss.tokens.assign(s.tokens.begin(), s.tokens.begin() + n);
  ss.whole.assign(s.blocks.prefix.begin(), s.blocks.prefix.begin() + std::min<size_t>(s.blocks.prefix.size(), n / bs));
  ss.whole_windowed.clear();
  for (const auto& w : s.blocks.windowed)
    ss.whole_windowed.emplace_back(w.prefix.begin(), w.prefix.begin() + std::min<size_t>(w.prefix.size(), n / bs));
  ss.last_used = clock_.now();
  ss.logits = n == static_cast<int32_t>(s.tokens.size()) ? std::move(logits) : nullptr;
  const std::vector<int32_t> slots(static_cast<size_t>(bs), 0);
  if (n % bs != 0 && blocks_.can_allocate(slots, false)) {
    blocks_.allocate(ss.tail, slots, false);
    if (blocks_.can_append(ss.tail, bs)) {
      blocks_.append(ss.tail, bs);  // a page in each windowed group too
      exec_.copy_block(s.blocks.table[n / bs], ss.tail.table[0]);
      for (size_t g = 0; g < ss.tail.windowed.size(); ++g)
        exec_.copy_block(s.blocks.windowed[g].table[n / bs], ss.tail.windowed[g].table[0]);
    } else {
      blocks_.free(ss.tail);
    }
  }
  while (static_cast<int32_t>(sessions_.size()) > max_sessions_) {
    auto oldest = sessions_.begin();
    for (auto i = sessions_.begin(); i != sessions_.end(); ++i)
      if (i->second.last_used < oldest->second.last_used) oldest = i;
    drop(oldest);
  }
}

void PrefillSessions::drop(Map::iterator it) {
  blocks_.free(it->second.tail);
  sessions_.erase(it);
}

void PrefillSessions::expire() {
  const double now = clock_.now();
  if (sessions_.empty() || now - checked_ < 1.0) return;
  checked_ = now;
  for (auto it = sessions_.begin(); it != sessions_.end();) {
    auto next = std::next(it);
    if (now - it->second.last_used > ttl_s_) drop(it);
    it = next;
  }
}

void PrefillSessions::add_live(std::vector<BlockManager::LiveSeq>& live) const {
  for (const auto& [id, ss] : sessions_)
    if (!ss.tail.table.empty()) live.push_back({&ss.tail, {}});
}

}  // namespace tandem

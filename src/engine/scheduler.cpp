#include "engine/scheduler.h"

#include <algorithm>
#include <new>
#include <span>

#include "kv/block_manager.h"

namespace tandem {
namespace {

// Scheduling order: higher priority first, then earlier arrival.
bool before(const Sequence& a, const Sequence& b) {
  if (a.priority() != b.priority()) return a.priority() > b.priority();
  return a.arrival_order < b.arrival_order;
}

}  // namespace

void Scheduler::insert_waiting(std::unique_ptr<Sequence> seq) {
  seq->status = SeqStatus::kWaiting;
  auto it = std::find_if(waiting_.begin(), waiting_.end(), [&](const auto& w) { return before(*seq, *w); });
  waiting_.insert(it, std::move(seq));
}

int32_t Scheduler::n_decoding() const {
  return static_cast<int32_t>(
      std::count_if(running_.begin(), running_.end(), [](const auto& s) { return s->n_uncomputed() == 1 && !s->fork_pending; }));
}

int32_t Scheduler::n_prefilling() const {
  return static_cast<int32_t>(waiting_.size()) +
         static_cast<int32_t>(std::count_if(running_.begin(), running_.end(), [](const auto& s) {
           return s->n_uncomputed() > 1 && !s->fork_pending;
         }));
}

void Scheduler::add(std::unique_ptr<Sequence> seq) { insert_waiting(std::move(seq)); }

void Scheduler::add_running(std::unique_ptr<Sequence> seq) {
  seq->status = SeqStatus::kRunning;
  running_.push_back(std::move(seq));
}

std::unique_ptr<Sequence> Scheduler::remove(Sequence* seq) {
  for (auto* list : {&running_, &swapped_}) {
    auto it = std::find_if(list->begin(), list->end(), [&](const auto& s) { return s.get() == seq; });
    if (it != list->end()) {
      auto out = std::move(*it);
      list->erase(it);
      swap_used_ -= out->swapped_kv.size();
      return out;
    }
  }
  auto it = std::find_if(waiting_.begin(), waiting_.end(), [&](const auto& s) { return s.get() == seq; });
  if (it == waiting_.end()) return nullptr;
  auto out = std::move(*it);
  waiting_.erase(it);
  return out;
}

void Scheduler::preempt(Sequence* seq) {
  auto it = std::find_if(running_.begin(), running_.end(), [&](const auto& s) { return s.get() == seq; });
  if (it == running_.end()) return;
  std::unique_ptr<Sequence> s = std::move(*it);
  running_.erase(it);
  ++preemptions_;
  ++s->preemptions;
  if (swap_out(*s)) {
    s->status = SeqStatus::kSwapped;
    auto at = std::find_if(swapped_.begin(), swapped_.end(), [&](const auto& w) { return before(*s, *w); });
    swapped_.insert(at, std::move(s));
    return;
  }
  blocks_.free(s->blocks);  // recompute: prompt and generated tokens run again as a prefill
  s->evicted = 0;           // (a streaming window evicts again as it goes)
  s->kept_keys.clear();
  s->kept_rotation.clear();
  s->attn_mass.clear();
  insert_waiting(std::move(s));
}

bool Scheduler::swap_out(Sequence& s) {
  const int32_t computed = s.blocks.n_computed;  // slots
  if (swap_.bytes == 0 || computed == 0) return false;
  // Group 0's blocks, then each windowed group's from its window on.
  const int32_t n = blocks_.blocks_for(computed), kept = blocks_.first_kept_block(computed);
  const int32_t n_pages = n + blocks_.n_windowed() * (n - kept);
  const size_t bytes = size_t(n_pages) * swap_.block_bytes;
  if (bytes > swap_.bytes - swap_used_) return false;
  try {
    s.swapped_kv.resize(bytes);
  } catch (const std::bad_alloc&) {
    return false;  // the host is out of memory too: recompute instead
  }
  std::byte* out = s.swapped_kv.data();
  for (int32_t i = 0; i < n; ++i, out += swap_.block_bytes) swap_.save(s.blocks.table[i], out);
  for (const WindowedBlocks& w : s.blocks.windowed)
    for (int32_t i = kept; i < n; ++i, out += swap_.block_bytes) swap_.save(w.table[i], out);
  s.swapped_computed = computed;
  swap_used_ += bytes;
  ++swap_outs_;
  blocks_.free(s.blocks);
  return true;
}

bool Scheduler::swap_in(Sequence& s) {
  // Blocks for every token, as an admission takes: the next one to compute
  // has its slot, so the sequence does not preempt another at its first step.
  // A prompt still being scored must compute what it has not saved.
  // A sequence whose streaming window evicted positions holds fewer slots
  // than tokens, and nothing the prefix cache could give.
  const bool use_cache = !s.wants_prompt_logits() && s.evicted == 0;
  const size_t most = std::max<size_t>(size_t(s.swapped_computed) + 1, slots_at_admission());
  const std::span<const int32_t> slots =
      std::span<const int32_t>(s.tokens).first(std::min(s.tokens.size() - size_t(s.evicted), most));
  const std::string& salt = s.req->params.cache_salt;
  if (!blocks_.can_allocate(slots, use_cache, salt)) return false;
  // Leading blocks still in the prefix cache are shared again as they are;
  // the table from the first writable block on gets the saved K/V.
  blocks_.allocate(s.blocks, slots, use_cache, salt);
  s.blocks.detached = s.evicted > 0;
  const int32_t saved = s.swapped_computed, done = std::max(s.blocks.n_computed, saved);
  if (blocks_.restore_cost(s.blocks, done) > blocks_.n_free()) {
    blocks_.free(s.blocks);  // the windowed groups' pages do not fit yet
    return false;
  }
  blocks_.restore(s.blocks, done);
  // Blocks from the first writable one on get the saved K/V (laid out as swap_out wrote it).
  const int32_t n = blocks_.blocks_for(saved), kept = blocks_.first_kept_block(saved);
  const int32_t first = s.blocks.n_computed / blocks_.block_size();
  const std::byte* in = s.swapped_kv.data();
  for (int32_t i = first; i < n; ++i) swap_.load(s.blocks.table[i], in + size_t(i) * swap_.block_bytes);
  in += size_t(n) * swap_.block_bytes;
  for (const WindowedBlocks& w : s.blocks.windowed) {
    for (int32_t i = std::max(first, kept); i < n; ++i) swap_.load(w.table[i], in + size_t(i - kept) * swap_.block_bytes);
    in += size_t(n - kept) * swap_.block_bytes;
  }
  blocks_.commit(s.blocks, s.tokens, done);
  swap_used_ -= s.swapped_kv.size();
  std::vector<std::byte>().swap(s.swapped_kv);
  s.swapped_computed = 0;
  return true;
}

// Makes positions up to `end` of `needy` writable, preempting the running
// sequence that comes last in scheduling order (possibly `needy` itself) while
// blocks are short. False when `needy` was the victim.
bool Scheduler::make_room(Sequence* needy, int32_t end, std::vector<ScheduledSeq>& batch) {
  end = needy->slot(end);
  while (!blocks_.can_append(needy->blocks, end)) {
    Sequence* victim = nullptr;
    for (auto& s : running_)
      if (!victim || before(*victim, *s)) victim = s.get();
    batch.erase(std::remove_if(batch.begin(), batch.end(), [&](const ScheduledSeq& b) { return b.seq == victim; }),
                batch.end());
    preempt(victim);
    if (victim == needy) return false;
  }
  blocks_.append(needy->blocks, end);
  return true;
}

std::vector<ScheduledSeq> Scheduler::schedule(int32_t prefill_budget) {
  std::vector<ScheduledSeq> batch;
  int32_t budget = cfg_.max_batch_tokens;
  std::sort(running_.begin(), running_.end(), [](const auto& a, const auto& b) { return before(*a, *b); });

  // 1. Decodes: one token each. Iterate over a snapshot, since preemption
  // edits running_.
  std::vector<Sequence*> decoding;
  for (auto& s : running_)
    if (s->n_uncomputed() == 1 && !s->fork_pending) decoding.push_back(s.get());
  // Drafted tokens ride along while the budget and free blocks allow; they
  // never cost another sequence its place: each decoding sequence's own row
  // is set aside first.
  int32_t spare = budget - static_cast<int32_t>(decoding.size());
  for (Sequence* s : decoding) {
    if (budget <= 0) break;
    if (s->status != SeqStatus::kRunning) continue;  // preempted by an earlier one
    int32_t rows = 1 + static_cast<int32_t>(s->draft.size());
    if (rows - 1 > spare || !blocks_.can_append(s->blocks, s->slot(s->n_computed() + rows))) {
      s->draft.clear();
      rows = 1;
    }
    if (!make_room(s, s->n_computed() + rows, batch)) continue;
    batch.push_back({s, rows});
    budget -= rows;
    spare -= rows - 1;
  }
  int32_t left = std::min(budget, prefill_budget);
  if (left <= 0) return batch;

  // 2. Admissions of swapped and waiting sequences together, by (priority,
  // arrival), head-of-line so that order holds and nobody starves. A swapped
  // one gets its K/V back; an admitted one holds its prompt's blocks and
  // competes for prompt tokens below; it need not run this step.
  while ((!waiting_.empty() || !swapped_.empty()) && static_cast<int32_t>(running_.size()) < cfg_.max_seqs) {
    const bool swapped = !swapped_.empty() && (waiting_.empty() || before(*swapped_.front(), *waiting_.front()));
    std::unique_ptr<Sequence>& next = swapped ? swapped_.front() : waiting_.front();
    Sequence* s = next.get();
    if (swapped) {
      if (!swap_in(*s)) break;
    } else {
      // A prompt being scored (prompt_logprobs) computes every position.
      const bool use_cache = !s->wants_prompt_logits();
      // A context's worth, or up to a streaming window's eviction point: such
      // a sequence (recomputed after a preemption, or a long prompt) grows its
      // table as it goes, and never holds more.
      const auto head = std::span<const int32_t>(s->tokens).first(std::min(s->tokens.size(), slots_at_admission()));
      if (!blocks_.can_allocate(head, use_cache, s->req->params.cache_salt)) break;
      // n_computed = prompt tokens found in the prefix cache (under the request's salt)
      blocks_.allocate(s->blocks, head, use_cache, s->req->params.cache_salt);
      if (on_admit_ && use_cache) on_admit_(*s);
      if (s->n_generated() == 0) s->n_cached_prompt = s->n_computed();
    }
    std::unique_ptr<Sequence> owned = std::move(next);
    if (swapped) swapped_.erase(swapped_.begin());
    else waiting_.pop_front();
    owned->status = SeqStatus::kRunning;
    running_.push_back(std::move(owned));
  }

  // 3. Prompt chunks. Shortest remaining prompt first (within a priority)
  // when chunks are small, so a chat's short prompt is not queued behind a
  // long document's chunks; but the earliest-arrived prompt always gets at
  // least a quarter of the step's prompt tokens, so it cannot starve.
  std::vector<Sequence*> prompts;
  for (auto& s : running_) {
    const bool scheduled = std::any_of(batch.begin(), batch.end(), [&](const ScheduledSeq& b) { return b.seq == s.get(); });
    if (!scheduled && s->n_uncomputed() >= 1) prompts.push_back(s.get());
  }
  if (prompts.empty()) return batch;
  Sequence* oldest = *std::min_element(prompts.begin(), prompts.end(), [](Sequence* a, Sequence* b) { return before(*a, *b); });
  if (cfg_.shortest_prompt_first)
    std::stable_sort(prompts.begin(), prompts.end(), [](Sequence* a, Sequence* b) {
      if (a->priority() != b->priority()) return a->priority() > b->priority();
      return a->n_uncomputed() < b->n_uncomputed();
    });
  std::vector<int32_t> give(prompts.size(), 0);
  int32_t logit_rows = cfg_.max_prompt_logit_rows;
  auto grant = [&](size_t i, int32_t most) {
    Sequence* s = prompts[i];
    const bool scored = s->wants_prompt_logits();
    // Rows before the first scored one need no logits and cost none of them.
    const int32_t free_rows = scored ? std::max(0, s->score_next - 1 - (s->n_computed() + give[i])) : 0;
    const int32_t stream_room =
        cfg_.stream_limit > 0 ? std::max(1, cfg_.stream_limit - s->blocks.n_computed) - give[i] : INT32_MAX;
    const int32_t n = std::min({s->n_uncomputed() - give[i], cfg_.prefill_chunk - give[i], left, most,
                                scored ? free_rows + logit_rows : INT32_MAX, stream_room});
    if (n > 0) {
      give[i] += n;
      left -= n;
      if (scored) logit_rows -= std::max(0, n - free_rows);
    }
  };
  const size_t oi = std::find(prompts.begin(), prompts.end(), oldest) - prompts.begin();
  grant(oi, std::max(1, (left + 3) / 4));
  for (size_t i = 0; i < prompts.size() && left > 0; ++i) grant(i, left);
  for (size_t i = 0; i < prompts.size(); ++i) {
    Sequence* s = prompts[i];
    if (give[i] == 0 || s->status != SeqStatus::kRunning) continue;
    if (!make_room(s, s->n_computed() + give[i], batch)) continue;
    batch.push_back({s, give[i]});
  }
  return batch;
}

}  // namespace tandem

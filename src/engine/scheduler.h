// Iteration-level scheduling: every step decides which sequences run and how
// many of their tokens, within a token budget and a sequence limit.
//
//   1. Running sequences that are decoding take one token each (decode is
//      never stalled by prefill: that is what chunked prefill buys).
//   2. Waiting and swapped-out sequences are admitted together by (priority,
//      arrival) while the sequence limit and the KV blocks allow.
//   3. Sequences with prompt tokens left share the step's prompt-token budget
//      (the smaller of what decodes left of the step budget and the pacer's
//      share), in chunks.
// When a running sequence needs a block and none is free, the lowest-priority,
// latest-arrived running sequence is preempted: its blocks are freed and it
// goes back to the front of its priority in the wait queue to be recomputed
// later (it keeps its generated tokens). With swap space (set_swap), its K/V
// is first copied out to host memory instead, while the space lasts, and
// copied back in when the sequence's turn comes in step 2. On a CPU both are
// memory, so a swap costs two copies of the sequence's K/V where a recompute
// costs a prefill of all its tokens.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <vector>

#include "engine/sequence.h"

namespace tandem {

class BlockManager;

// Where swapped K/V goes: a budget of host memory and the copies in and out
// of the pool's blocks (the engine wires them to its KvCache).
struct SwapSpace {
  size_t bytes = 0;        // 0: no swapping, preempted sequences are recomputed
  size_t block_bytes = 0;  // K/V bytes of one block
  std::function<void(int32_t block, std::byte* out)> save;
  std::function<void(int32_t block, const std::byte* in)> load;
};

struct SchedulerConfig {
  int32_t max_batch_tokens = 256;
  int32_t max_seqs = 32;
  int32_t prefill_chunk = 256;   // most prompt tokens of one sequence per step
  bool shortest_prompt_first = false;  // order prompt chunks by remaining length (latency policy)
  int32_t max_context = 4096;
  // Prompt rows per step that may ask for logits to score the prompt
  // (prompt_logprobs): each one is a vocabulary of floats.
  int32_t max_prompt_logit_rows = 512;
  // A streaming window's eviction point (sinks + window + a block; 0: none):
  // a prompt chunk ends there, so that each row sees what it would see
  // computed one at a time, as the window slides token by token.
  int32_t stream_limit = 0;
};

struct ScheduledSeq {
  Sequence* seq = nullptr;
  int32_t n_tokens = 0;  // tokens[n_computed, n_computed + n_tokens) run this step
};

class Scheduler {
 public:
  Scheduler(const SchedulerConfig& cfg, BlockManager& blocks) : cfg_(cfg), blocks_(blocks) {}

  void add(std::unique_ptr<Sequence> seq);   // to the wait queue
  // `prefill_budget` caps the prompt tokens of this step (the pacer's share);
  // decodes are never capped by it.
  std::vector<ScheduledSeq> schedule(int32_t prefill_budget = INT32_MAX);
  // Removes a finished sequence (its blocks must already be freed).
  std::unique_ptr<Sequence> remove(Sequence* seq);
  // Frees its blocks; to the swapped list (K/V saved) when swap space allows,
  // else back to waiting.
  void preempt(Sequence* seq);
  void set_swap(SwapSpace swap) { swap_ = std::move(swap); }
  // Called right after a waiting sequence's prompt gets its blocks (the
  // prefix cache's hits counted): may mark more of it computed.
  void set_on_admit(std::function<void(Sequence&)> fn) { on_admit_ = std::move(fn); }

  template <typename F>
  void for_each(F&& f) {
    for (auto& s : running_) f(*s);
    for (auto& s : swapped_) f(*s);
    for (auto& s : waiting_) f(*s);
  }
  // Adds a running sequence directly (forked choices share their parent's blocks).
  void add_running(std::unique_ptr<Sequence> seq);

  size_t n_running() const { return running_.size(); }
  // Running sequences that would decode one token next step.
  int32_t n_decoding() const;
  size_t n_waiting() const { return waiting_.size(); }
  // Sequences with prompt tokens still to compute: waiting, or running a prefill.
  int32_t n_prefilling() const;
  size_t n_swapped() const { return swapped_.size(); }
  uint64_t preemptions() const { return preemptions_; }
  uint64_t swap_outs() const { return swap_outs_; }
  bool idle() const { return running_.empty() && waiting_.empty() && swapped_.empty(); }

 private:
  bool make_room(Sequence* needy, int32_t end, std::vector<ScheduledSeq>& batch);
  void insert_waiting(std::unique_ptr<Sequence> seq);
  bool swap_out(Sequence& s);  // false when the space is short (nothing changes then)
  bool swap_in(Sequence& s);   // false when the pool is short (nothing changes then)
  // The most slots a sequence is given when it is admitted: a context, or a
  // streaming window's eviction point; it grows its table from there.
  size_t slots_at_admission() const {
    return cfg_.stream_limit > 0 ? size_t(cfg_.stream_limit) : size_t(cfg_.max_context);
  }

  SchedulerConfig cfg_;
  BlockManager& blocks_;
  std::vector<std::unique_ptr<Sequence>> running_;
  std::deque<std::unique_ptr<Sequence>> waiting_;  // sorted: priority desc, arrival asc
  std::vector<std::unique_ptr<Sequence>> swapped_;  // in scheduling order
  SwapSpace swap_;
  std::function<void(Sequence&)> on_admit_;
  size_t swap_used_ = 0;
  uint64_t preemptions_ = 0, swap_outs_ = 0;
};

}  // namespace tandem

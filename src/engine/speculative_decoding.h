// Speculative decoding at the engine's step (engine/speculation.h has the
// drafters and the draft length policy): drafts planned before the batch is
// formed, verified where the step samples, kept or given back where it
// accepts, and the step's cost fed back to the policy.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "engine/speculation.h"
#include "model/model.h"

namespace tandem {

class BlockManager;
class Executor;
class Scheduler;
class StepLog;
class ThreadPool;
class Tokenizer;
struct Sequence;

// Throws Error(kInvalidArgument) for bad sizes, a draft model missing for
// SpecMode::kDraft or given for another mode.
void check_speculation(const SpecConfig& cfg, bool has_draft_model);

class SpeculativeDecoding {
 public:
  // cfg.mode is kNgram or kDraft (a draft model, then, sharing the target's
  // vocabulary; it must outlive this).
  SpeculativeDecoding(const SpecConfig& cfg, const Model& target, Model* draft, int32_t max_context, int32_t max_seqs,
                      ThreadPool& pool);

  // The cost of a step of R rows on this machine for this model, measured
  // once for a few R (real steps keep refining it): what the draft length
  // policy weighs drafted rows against. `logits` is the engine's scratch.
  void calibrate(const Model& model, BlockManager& blocks, Executor& exec, Logits& logits, const StepLog& clock);
  // Before the step is scheduled: Sequence::draft for its decoding
  // sequences, each within the context and before `stream_limit` (> 0: a
  // streaming window's eviction point).
  void plan(Scheduler& sched, int32_t stream_limit);
  // After a step without prompt rows: its time for its rows.
  void observe_step(int32_t rows, double seconds) { policy_.target_cost().observe(rows, seconds); }
  // Where the step accepts: commits the rows of `s` its verification kept
  // (`verified`, from verify_drafts) and gives back the rest; counts the
  // drafts in its record. Returns how many drafts were kept.
  int32_t keep(Sequence& s, std::span<const int32_t> verified, BlockManager& blocks);
  // The sequence ended.
  void forget(Sequence& s) { drafter_->forget(s, -1); }

 private:
  SpecConfig cfg_;
  int32_t max_context_, max_seqs_;
  std::unique_ptr<Drafter> drafter_;
  SpecPolicy policy_;
};

// Samples a drafted sequence's rows (`logits`: its last token's row, then one
// per draft) in order until one differs from its draft, each exactly as
// plain decoding would sample that token, into `verified`. Thread-safe across
// sequences.
void verify_drafts(Sequence& s, const float* logits, int32_t n_vocab, const Tokenizer& tok,
                   std::vector<int32_t>& verified);

}  // namespace tandem

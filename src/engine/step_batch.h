// One step's forward pass as the executor takes it: a row per token of every
// scheduled sequence, in order, each sequence's view of its KV blocks, and
// which rows give logits. A row gives logits when it is the sequence's last
// uncomputed token, a draft after it, or when it predicts a prompt token
// whose logprob is asked for (the logits of row p score token p + 1).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "engine/scheduler.h"
#include "engine/step_log.h"
#include "kv/kv_cache.h"
#include "model/model.h"

namespace tandem {

class PromptScorer;
class StreamingWindow;

struct StepBatch {
  Batch rows;
  std::vector<SeqKv> seq_kv;
  std::vector<SeqKv*> seq_kv_ptrs;
  std::vector<int64_t> last_row;       // per scheduled sequence: logits row of its last token, or -1
  std::vector<Sequence*> prompt_seqs;  // scheduled sequences computing prompt rows
  int32_t n_decode = 0;                // decoding sequences (a token and its drafts each)
  int32_t n_decode_rows = 0, n_prefill_rows = 0, n_prompt_rows = 0, n_logit_rows = 0;
  // Sparse attention's default budget (--sparse-attention; 0: off, and no
  // request may turn it on).
  int32_t sparse_budget = 0;

  // Fills the rows for `scheduled` (reusing the buffers of earlier steps),
  // the prompt positions to score into `scored`; counts a decode step of
  // each decoding sequence (SpecState::steps).
  void build(std::span<const ScheduledSeq> scheduled, const StreamingWindow& window, PromptScorer& scored);
  Phase phase() const {
    return n_prefill_rows == 0 ? Phase::kDecode : (n_decode == 0 ? Phase::kPrefill : Phase::kMixed);
  }
};

// Who had rows in the step, for the live timeline (before the step's rows are committed).
void report_parts(std::span<const ScheduledSeq> scheduled, StepReport& report);

}  // namespace tandem

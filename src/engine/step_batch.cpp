#include "engine/step_batch.h"

#include "engine/prompt_scoring.h"
#include "engine/sequence.h"
#include "engine/streaming_window.h"

namespace tandem {

void StepBatch::build(std::span<const ScheduledSeq> scheduled, const StreamingWindow& window, PromptScorer& scored) {
  rows.clear();
  prompt_seqs.clear();
  seq_kv.resize(scheduled.size());
  seq_kv_ptrs.resize(scheduled.size());
  scored.clear();
  last_row.assign(scheduled.size(), -1);
  n_decode = n_decode_rows = n_prefill_rows = n_prompt_rows = n_logit_rows = 0;
  // A decoding sequence with drafts runs its last token and then each draft,
  // every one of those rows with logits.
  for (size_t i = 0; i < scheduled.size(); ++i) {
    Sequence* s = scheduled[i].seq;
    const int32_t n = scheduled[i].n_tokens, start = s->n_computed();
    const int32_t n_tok = static_cast<int32_t>(s->tokens.size());
    const int32_t score_from = s->wants_prompt_logits() ? s->score_next : s->n_prompt;
    SeqKv& kv = seq_kv[i];
    kv.blocks = s->blocks.table;
    kv.windowed.resize(s->blocks.windowed.size());
    for (size_t g = 0; g < s->blocks.windowed.size(); ++g) kv.windowed[g] = s->blocks.windowed[g].table;
    kv.n_tokens = s->slot(start);
    kv.rope_shift = s->evicted;
    window.attach(*s, kv);
    // Generated tokens' rows attend sparsely, decoded or verified alike (and
    // recomputed after a preemption); a prompt stays dense, except one being
    // scored, whose rows are attended as decoding would attend them.
    const int32_t asked = s->req->params.sparse_attention;
    kv.sparse_budget = sparse_budget > 0 ? (asked >= 0 ? asked : sparse_budget) : 0;
    const RequestParams& rp = s->req->params;
    kv.sparse_from = rp.prompt_logprobs >= 0 || rp.on_prompt_row ? 0 : s->n_prompt;
    seq_kv_ptrs[i] = &kv;
    for (int32_t j = 0; j < n; ++j) {
      const int32_t pos = start + j;
      const bool score = pos + 1 >= score_from && pos + 1 < s->n_prompt;
      if (score) scored.add(s, pos + 1, n_logit_rows);
      const bool last = pos + 1 >= n_tok;
      if (pos + 1 == n_tok) last_row[i] = n_logit_rows;
      const int32_t token = pos < n_tok ? s->tokens[pos] : s->draft[pos - n_tok];
      rows.push_back({token, s->slot(pos), static_cast<int32_t>(i), score || last});
      n_logit_rows += score || last;
      if (pos < s->n_prompt) ++n_prompt_rows;
    }
    if (start + 1 == n_tok && start >= s->n_prompt) {
      ++n_decode;
      n_decode_rows += n;
      ++s->spec.steps;
    } else {
      n_prefill_rows += n;
    }
    if (start < s->n_prompt) prompt_seqs.push_back(s);
  }
}

void report_parts(std::span<const ScheduledSeq> scheduled, StepReport& report) {
  report.parts.clear();
  for (const ScheduledSeq& x : scheduled) {
    const bool decoding = x.seq->n_computed() + 1 == static_cast<int32_t>(x.seq->tokens.size()) &&
                          x.seq->n_computed() >= x.seq->n_prompt;
    report.parts.push_back({x.seq->req->id, x.seq->choice, decoding ? 0 : x.n_tokens, decoding ? x.n_tokens : 0});
  }
}

}  // namespace tandem

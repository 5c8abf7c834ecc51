// Prompt logprobs (RequestParams::prompt_logprobs, on_prompt_row): the
// logits of row p score prompt token p + 1, so a step that computes prompt
// rows asks for logits at the rows whose next token is to be scored, and
// scores them once the forward pass has run.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/request.h"

namespace tandem {

class ThreadPool;
struct Sequence;

// At submission: the first prompt token has nothing before it to score it
// (its logprob is NaN); on_prompt_row starts at its first row.
void start_prompt_scoring(Sequence& s);

// The prompt's logprobs, sent before the first token.
RequestEvent prompt_logprobs_event(const Sequence& s);

// The prompt positions one step scores.
class PromptScorer {
 public:
  void clear() { rows_.clear(); }
  // Prompt token `pos` of `s` is scored by the step's logits row `logit_row`.
  void add(Sequence* s, int32_t pos, int64_t logit_row) { rows_.push_back({s, pos, logit_row}); }
  // After the forward pass: each position's logprob (or its row to
  // on_prompt_row), on the pool's threads.
  void score(const float* logits, int32_t n_vocab, ThreadPool& pool);

 private:
  struct Scored {
    Sequence* seq;
    int32_t pos;       // the prompt token scored
    int64_t logit_row;
  };
  std::vector<Scored> rows_;
};

}  // namespace tandem

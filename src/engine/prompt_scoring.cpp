#include "engine/prompt_scoring.h"

#include <algorithm>
#include <limits>
#include <span>

#include "runtime/thread_pool.h"
#include "engine/logprobs.h"
#include "engine/sequence.h"

namespace tandem {

void start_prompt_scoring(Sequence& s) {
  const RequestParams& params = s.req->params;
  if (params.prompt_logprobs >= 0) {  // nothing comes before the first token to score it
    s.prompt_lp.push_back({s.tokens[0], std::numeric_limits<float>::quiet_NaN()});
    s.prompt_top.emplace_back();
    s.score_next = 1;
  } else if (params.on_prompt_row) {
    s.score_next = params.rows_from + 1;
  }
}

RequestEvent prompt_logprobs_event(const Sequence& s) {
  RequestEvent ev;
  ev.prompt_logprobs = s.prompt_lp;
  ev.prompt_top_logprobs = s.prompt_top;
  return ev;
}

void PromptScorer::score(const float* logits, int32_t nv, ThreadPool& pool) {
  if (rows_.empty()) return;
  // Positions of one sequence come in order and continue its score_next.
  for (const Scored& x : rows_) {
    Sequence& s = *x.seq;
    s.score_next = std::max(s.score_next, x.pos + 1);
    if (s.req->params.prompt_logprobs >= 0) {
      s.prompt_lp.resize(x.pos + 1);
      s.prompt_top.resize(x.pos + 1);
    }
  }
  pool.parallel_for(static_cast<int64_t>(rows_.size()), 1, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const Scored& x = rows_[i];
      Sequence& s = *x.seq;
      const std::span<const float> row(logits + x.logit_row * nv, nv);
      if (s.req->params.on_prompt_row) s.req->params.on_prompt_row(x.pos - 1, row);
      else s.prompt_lp[x.pos] = token_logprob(row, s.tokens[x.pos], s.req->params.prompt_logprobs, &s.prompt_top[x.pos]);
    }
  });
}

}  // namespace tandem

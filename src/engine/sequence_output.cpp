#include "engine/sequence_output.h"

#include <algorithm>
#include <span>
#include <string>
#include <vector>

#include "engine/logprobs.h"
#include "engine/sequence.h"
#include "engine/stop_strings.h"
#include "engine/tool_call_grammar.h"

namespace tandem {

bool push_text(Sequence& s, int32_t token, RequestEvent& ev) {
  s.text += s.decoder->push(token);
  // The call grammar takes the marker only while calls have not begun, so
  // where it appears is where they begin.
  if (const ToolCallGrammar* g = s.req->params.tool_calls.get();
      g && !g->forced && token >= 0 && token == g->syntax.marker_token)
    ev.tool_calls_at = static_cast<int64_t>(s.text.size());
  const StopMatch m = find_stop(s.text, s.req->params.stop);
  const size_t upto = m.pos != std::string::npos ? m.pos : m.safe_len;
  if (upto > s.emitted) {
    ev.text = s.text.substr(s.emitted, upto - s.emitted);
    s.emitted = upto;
  }
  return m.pos != std::string::npos;
}

void final_text(Sequence& s, bool flush, RequestEvent& ev) {
  if (flush) s.text += s.decoder->flush();
  const StopMatch m = find_stop(s.text, s.req->params.stop);
  const size_t end = m.pos != std::string::npos ? m.pos : s.text.size();
  if (end > s.emitted) ev.text = s.text.substr(s.emitted, end - s.emitted);
  s.emitted = std::max(s.emitted, end);
}

void add_logprobs(RequestEvent& ev, const float* logits, int32_t nv, int32_t token, int32_t top_k) {
  std::vector<TokenLogprob> top;
  ev.logprobs.push_back(token_logprob(std::span<const float>(logits, nv), token, top_k, &top));
  ev.top_logprobs.push_back(std::move(top));
}

RequestTimings sequence_timings(const Sequence& s, double now) {
  RequestTimings t;
  const double arrival = s.req->arrival_s;
  t.prompt_tokens = s.n_prompt;
  t.cached_tokens = s.n_cached_prompt;
  t.generated_tokens = s.n_generated();
  t.queued_s = (s.first_step_s >= 0 ? s.first_step_s : now) - arrival;
  t.prefill_s = s.prefill_s;
  t.ttft_s = s.first_token_s >= 0 ? s.first_token_s - arrival : 0;
  t.decode_s = s.first_token_s >= 0 ? s.last_token_s - s.first_token_s : 0;
  t.preemptions = s.preemptions;
  t.decode_steps = std::max(0, s.spec.steps);
  t.drafted = s.spec.drafted;
  t.accepted = s.spec.accepted;
  return t;
}

void end_unforked_choices(const Sequence& s, const RequestEvent& ev) {
  for (int32_t c = 1; c < s.req->params.n; ++c) {
    RequestEvent other = ev;
    other.text.clear();
    other.request_id = s.req->id;
    other.choice = c;
    other.completion_tokens = 0;
    if (s.req->sink) s.req->sink(other);
  }
}

void copy_prompt_state(const Sequence& from, Sequence& to) {
  to.arrival_order = from.arrival_order;
  to.tokens = from.tokens;
  to.n_prompt = from.n_prompt;
  to.n_cached_prompt = from.n_cached_prompt;
  to.score_next = from.score_next;
  to.first_step_s = from.first_step_s;
  to.prefill_s = from.prefill_s;
  to.prompt_lp = from.prompt_lp;
  to.prompt_top = from.prompt_top;
  to.evicted = from.evicted;
  to.kept_keys = from.kept_keys;
  to.kept_rotation = from.kept_rotation;
  to.attn_mass = from.attn_mass;
}

}  // namespace tandem

// What a sequence sends back: the text of its tokens with a possible stop
// string held back, its logprobs, the final event's timings, and the choices
// of an n > 1 request that share its prompt.
#pragma once

#include <cstdint>

#include "engine/request.h"

namespace tandem {

struct Sequence;

// Appends the token's text to the sequence's and puts what may be sent now
// into ev.text. True when a stop string completed.
bool push_text(Sequence& s, int32_t token, RequestEvent& ev);
// At the end: what the stop-string check held back is final (the decoder
// flushed too unless `flush` is false: a stop string ended it).
void final_text(Sequence& s, bool flush, RequestEvent& ev);
// The token's logprob and the `top` most likely ones (RequestParams::logprobs).
void add_logprobs(RequestEvent& ev, const float* logits, int32_t n_vocab, int32_t token, int32_t top);
RequestTimings sequence_timings(const Sequence& s, double now);
// The other choices of an n > 1 request whose prompt never finished (choice
// 0 cancelled or failed): each ends with `ev`, without text.
void end_unforked_choices(const Sequence& s, const RequestEvent& ev);
// An n > 1 request's choice after the prompt ran once: what it shares with
// choice 0 (tokens, prompt logprobs, streaming window state), its blocks aside.
void copy_prompt_state(const Sequence& from, Sequence& to);

}  // namespace tandem

// What a client asks of the serving engine, and what it hears back.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "engine/json_schema.h"
#include "engine/kv_transfer.h"
#include "engine/sampler.h"

namespace tandem {

struct ToolCallGrammar;

struct RequestParams {
  SamplingParams sampling;
  int32_t max_tokens = 256;        // < 0: until the context is full; 0: the prompt alone (its logprobs)
  std::vector<std::string> stop;   // stop strings (not included in the text)
  bool stop_at_eog = true;         // end at EOS / end-of-turn tokens
  int32_t priority = 0;            // higher is scheduled first
  // Speculative decoding for this request: at most this many drafted tokens
  // a step (-1: the engine's setting; 0: none). Never changes the output.
  int32_t spec_max = -1;
  // Sparse attention's budget in positions for this request's decode rows
  // (-1: the engine's --sparse-attention; 0: dense). A positive budget needs
  // the engine's to be on (its blocks keep the key bounds).
  int32_t sparse_attention = -1;
  // Progressive prefill: a request naming a session resumes from the K/V the
  // session's last request left (to the token, not only whole blocks), and
  // leaves its own for the next. Empty: none.
  std::string session;
  // Keys the prompt's prefix-cache blocks (vLLM's cache_salt): its blocks
  // are found only by requests with the same salt. Empty: none.
  std::string cache_salt;
  int32_t n = 1;                   // choices; they share the prompt's KV blocks
  int32_t logprobs = -1;           // -1: none; 0: the chosen token's; k > 0: plus the top k
  // Logprobs of the prompt's own tokens, as `logprobs` counts them (the
  // OpenAI API's echo). Every prompt position is computed for it: no prefix
  // cache hits for this request's prompt.
  int32_t prompt_logprobs = -1;
  // The output is one JSON object (response_format json_object): tokens that
  // cannot continue one are never picked, and the output ends with the object.
  bool json_object = false;
  // The same, and the object must fit this schema (response_format json_schema).
  std::shared_ptr<const CompiledSchema> json_schema;
  // The output is tool calls (or, unless forced, text until the format's
  // marker and calls from there): engine/tool_call_grammar.h.
  std::shared_ptr<const ToolCallGrammar> tool_calls;
  // Scoring a text (tandem perplexity): the logits of prompt rows p in
  // [rows_from, prompt length - 1), row p predicting prompt token p + 1, are
  // handed to `on_prompt_row(p, logits)` once each, on the compute threads
  // and in no set order. Like prompt_logprobs, no prefix cache hits.
  std::function<void(int32_t row, std::span<const float> logits)> on_prompt_row;
  int32_t rows_from = 0;
  // A prefill instance's request (engine/kv_transfer.h): when it ends with
  // its first token, its prompt's full blocks are handed here, on the
  // engine's thread, before its final event.
  std::function<void(KvBlockRun)> on_kv_export;
  // A decode instance's request: blocks of its prompt computed elsewhere,
  // put in the prefix cache before it is scheduled; `done` hears what was
  // used (engine thread).
  struct KvImport {
    KvBlockRun run;
    std::function<void(const KvImportResult&)> done;
  };
  std::shared_ptr<const KvImport> kv_import;
};

// How a request went, in its final event: the phases as this request saw
// them. Shared steps count whole (a decode step that also ran another
// request's prompt is this request's decode step too).
struct RequestTimings {
  double queued_s = 0;    // arrival until a step first computed its prompt
  double prefill_s = 0;   // forward time of the steps that computed its prompt
  double ttft_s = 0;      // arrival until its first token
  double decode_s = 0;    // first token until its last
  int32_t prompt_tokens = 0;
  int32_t cached_tokens = 0;     // of the prompt, found in the prefix cache
  int32_t generated_tokens = 0;
  int32_t preemptions = 0;
  int32_t decode_steps = 0;      // steps that gave it tokens after the first
  int32_t drafted = 0;           // speculation: tokens drafted for it
  int32_t accepted = 0;          // and kept
  double acceptance() const { return drafted > 0 ? double(accepted) / drafted : 0; }
  double tokens_per_step() const { return decode_steps > 0 ? double(generated_tokens - 1) / decode_steps : 0; }

  double prefill_tok_s() const { return prefill_s > 0 ? (prompt_tokens - cached_tokens) / prefill_s : 0; }
  // Decode steps after the first token (the first comes from the prefill).
  double decode_tok_s() const { return decode_s > 0 ? (generated_tokens - 1) / decode_s : 0; }
  double ms_per_token() const { return generated_tokens > 1 ? 1000.0 * decode_s / (generated_tokens - 1) : 0; }
};

struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0;
};

// Delivered on the engine thread, in order per choice. A sink must return
// quickly (queue the event, do not write to a socket).
struct RequestEvent {
  uint64_t request_id = 0;
  int32_t choice = 0;
  std::string text;                                 // new text since the last event
  std::vector<int32_t> tokens;                      // new token ids
  // Tool calling in auto mode: the family's control-token marker was
  // generated where the choice's text had this many bytes, so its calls
  // begin there (the marker itself spells nothing). -1: not in this event.
  int64_t tool_calls_at = -1;
  std::vector<TokenLogprob> logprobs;               // per new token (when asked)
  std::vector<std::vector<TokenLogprob>> top_logprobs;
  // With prompt_logprobs, once per choice before its first token: one entry
  // per prompt token; the first token has no logprob (NaN, no alternatives).
  std::vector<TokenLogprob> prompt_logprobs;
  std::vector<std::vector<TokenLogprob>> prompt_top_logprobs;
  bool finished = false;
  std::string finish_reason;                        // "stop", "length", "cancelled", "error"
  // What ended it, finer than finish_reason: "eog" (an end-of-generation
  // token), "stop" (a stop string), "json" (the JSON value is complete),
  // "length" (max_tokens), "context" (the context is full), "cancelled", "error".
  std::string stop_cause;
  std::string error;                                // when finish_reason == "error"
  RequestTimings timings;                           // in the final event
  int32_t prompt_tokens = 0;
  int32_t completion_tokens = 0;                    // so far, this choice
  int32_t cached_prompt_tokens = 0;                 // prompt tokens served from the prefix cache
};
using EventSink = std::function<void(const RequestEvent&)>;

}  // namespace tandem

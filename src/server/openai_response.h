// OpenAI API responses: the JSON of completions and chat completions, whole
// and as streamed chunks, built from the engine's events.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "chat/tool_format.h"
#include "engine/request.h"
#include "engine/tool_call_grammar.h"
#include "server/openai_schema.h"

namespace tandem::server {

// A token's text as the tokenizer spells it (raw bytes: may be half a UTF-8
// character).
using TokenText = std::function<std::string(int32_t)>;

struct ResponseMeta {
  Endpoint endpoint = Endpoint::kCompletions;
  std::string id;       // "cmpl-..." / "chatcmpl-..."
  std::string model;
  int64_t created = 0;  // unix seconds
  bool logprobs = false;
  bool include_usage = false;  // streaming: "usage": null on every chunk, totals at the end
  bool timings = false;        // the first choice's phases ("timings"), at the end
  // Chat with tool calling: the output is read back into content and
  // tool_calls (finish_reason "tool_calls" when there are calls).
  std::shared_ptr<const ToolCallGrammar> tools;
  // A prefill instance's answer: where the prompt's blocks wait (whole responses).
  std::function<nlohmann::json()> kv_transfer;
};

// A tool call's id: the response's id, the choice and the call.
std::string tool_call_id(const ResponseMeta& m, int32_t choice, int32_t call);

// A request's phases in llama.cpp's server's names (prompt_n, prompt_ms,
// predicted_per_second, ...; cache_n, draft_n), with queued_ms, ttft_ms and
// preemptions beside.
nlohmann::json timings_json(const RequestTimings& t);

// One choice, accumulated over its events.
struct ChoiceState {
  std::string text;
  std::vector<TokenLogprob> logprobs;
  std::vector<size_t> offsets;  // where each logprobs token starts in the text
  std::vector<std::vector<TokenLogprob>> top_logprobs;
  bool finished = false;
  std::string finish_reason;
  std::string error;
  int32_t completion_tokens = 0;
  int64_t tool_calls_at = -1;  // where a control-token marker opened tool calls in `text`
  void add(const RequestEvent& ev, const std::vector<size_t>& offsets);
};

struct Usage {
  int32_t prompt_tokens = 0;
  int32_t completion_tokens = 0;
  int32_t cached_tokens = 0;
};

nlohmann::json usage_json(const Usage& u);

// Completions' logprobs object for these tokens: tokens, token_logprobs,
// top_logprobs (null without alternatives), text_offset (`offsets`: where
// each token starts in the choice's text, in bytes).
nlohmann::json completion_logprobs_json(const std::vector<TokenLogprob>& lp,
                                        const std::vector<std::vector<TokenLogprob>>& top, const TokenText& text,
                                        const std::vector<size_t>& offsets);
// Chat's logprobs.content array: {token, logprob, bytes, top_logprobs} each.
nlohmann::json chat_logprobs_json(const std::vector<TokenLogprob>& lp,
                                  const std::vector<std::vector<TokenLogprob>>& top, const TokenText& text);

// The whole (non-streaming) response; `timings` when m.timings.
nlohmann::json full_response(const ResponseMeta& m, const std::vector<ChoiceState>& choices, const Usage& u,
                             const TokenText& text, const RequestTimings* timings = nullptr);
// Streaming: the last chunk before [DONE] when m.timings (choices: []).
nlohmann::json timings_chunk(const ResponseMeta& m, const RequestTimings& t);

// Streaming: chat's opening chunk for a choice (delta.role = "assistant").
nlohmann::json role_chunk(const ResponseMeta& m, int32_t choice);
// The chunk for one event: its new text, its tokens' logprobs, and the
// finish_reason when it ends the choice. `offsets`: where its tokens start
// in the choice's text (completions' text_offset).
nlohmann::json event_chunk(const ResponseMeta& m, const RequestEvent& ev, const TokenText& text,
                           const std::vector<size_t>& offsets);
// The final usage chunk (choices: []), sent when include_usage.
nlohmann::json usage_chunk(const ResponseMeta& m, const Usage& u);

// Streaming with tool calling: the chunks for one event's parsed text
// (content deltas, a call's first delta with its id, type and name and empty
// arguments, then its argument fragments), and the finish_reason on the last.
std::vector<nlohmann::json> tool_event_chunks(const ResponseMeta& m, const RequestEvent& ev,
                                              ToolCallParser& parser);

// "data: <json>\n\n"
std::string sse_event(const nlohmann::json& j);

}  // namespace tandem::server

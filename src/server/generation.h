// The HTTP side of one engine request: the queue its events wait in, and the
// AsyncResponse that turns them into one JSON body or server-sent events.
//
// The engine calls a request's sink on its own thread; the sink only appends
// to the request's queue and wakes the HTTP loop, which pumps the response on
// its own thread. A response dropped before its choices finished (the client
// hung up, the server stops) cancels its engine requests, so their KV blocks
// are freed at the next step: streaming or not.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "engine/request.h"
#include "server/http_server.h"
#include "server/openai_response.h"

namespace tandem {
class Engine;
}

namespace tandem::server {

// An API error as an HTTP response: OpenAI's error object; 429 and 503 say
// when to retry (Retry-After).
HttpResponse error_response(const ApiError& e);

class EventQueue {
 public:
  explicit EventQueue(std::function<void()> wake) : wake_(std::move(wake)) {}
  // Engine thread. choice_base: added to the event's choice (several prompts share a queue).
  void push(const RequestEvent& ev, int32_t choice_base = 0);
  // Moves every queued event to `out`; never waits.
  void drain(std::vector<RequestEvent>& out);

 private:
  std::function<void()> wake_;
  std::mutex mu_;
  std::deque<RequestEvent> q_;
};

// One HTTP request's engine requests: one per prompt, each with n choices;
// prompt k's choice c is choice k * n + c here.
class Generation {
 public:
  // Submits one engine request per prompt. Throws ApiError: 429 when the
  // engine's wait queue is full, 400 for what the engine refuses as invalid;
  // the prompts submitted before the one refused are cancelled then.
  // echo: per prompt, the text that leads each of its choices (empty: none).
  // wake: called (on the engine thread) whenever events are ready.
  static std::shared_ptr<Generation> start(Engine& engine, std::vector<std::vector<int32_t>> prompts,
                                           const RequestParams& params, std::vector<std::string> echo,
                                           std::function<void()> wake);
  ~Generation();  // cancels the engine requests unless every choice finished
  Generation(const Generation&) = delete;
  Generation& operator=(const Generation&) = delete;

  int32_t n() const { return n_; }  // choices in all
  // The events ready now, each counted in usage(). With echo, a choice's
  // first event starts with its prompt's text and the prompt's logprobs.
  // offsets[i]: where event i's logprobs tokens start in its choice's text.
  void next(std::vector<RequestEvent>& out, std::vector<std::vector<size_t>>& offsets);
  bool finished() const { return finished_choices_ == n_; }
  const Usage& usage() const { return usage_; }
  void cancel();  // idempotent

 private:
  Generation(Engine& engine, int32_t prompts, int32_t n, std::shared_ptr<EventQueue> q);
  Engine& engine_;
  std::vector<uint64_t> ids_;  // engine requests, one per prompt, as submitted
  int32_t per_prompt_;         // choices per prompt
  int32_t n_;
  std::shared_ptr<EventQueue> q_;
  std::vector<int32_t> prompt_tokens_, cached_tokens_;  // per prompt
  std::vector<int32_t> completion_tokens_;
  std::vector<bool> choice_done_;
  std::vector<std::string> echo_;  // per prompt; empty: no echo
  std::vector<bool> echoed_;       // per choice
  std::vector<size_t> text_at_;    // per choice: bytes its tokens have spelled so far
  int32_t finished_choices_ = 0;
  Usage usage_;
  bool cancelled_ = false;
};

// The response to a completions or chat request: one JSON body when every
// choice has finished, or (stream) chat's role chunks, a chunk per event,
// usage when asked, then "data: [DONE]", with an SSE comment after each
// `heartbeat` of silence (proxies drop quiet connections).
class GenerationResponse final : public AsyncResponse {
 public:
  GenerationResponse(std::shared_ptr<Generation> gen, ResponseMeta meta, TokenText text, bool stream,
                     double heartbeat_s, std::vector<http::Header> headers);
  bool pump(ResponseWriter& w, double now_s) override;
  void cancel() override { gen_->cancel(); }

 private:
  bool pump_stream(ResponseWriter& w, double now_s);
  bool pump_whole(ResponseWriter& w);

  std::shared_ptr<Generation> gen_;
  ResponseMeta meta_;
  TokenText text_;
  bool stream_;
  double heartbeat_s_;
  std::vector<http::Header> headers_;  // added to the response (CORS)
  std::vector<ChoiceState> choices_;   // whole responses
  std::vector<RequestEvent> evs_;
  std::vector<std::vector<size_t>> offs_;
  std::vector<ToolCallParser> tool_parsers_;  // streaming with tool calling: one per choice
  RequestTimings timings_;  // the first choice's, once it ended
  bool started_ = false;
  double last_write_s_ = 0;
};

}  // namespace tandem::server

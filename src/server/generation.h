// The HTTP side of one engine request: the queue its events wait in, the
// registry of requests in flight, and the server-sent-event writer.
//
// The engine calls a request's sink on its own thread; the sink only appends
// to the request's queue. The HTTP thread that owns the request takes events
// from there and writes them. A Generation that is dropped before all its
// choices finished (the client went away, the handler failed) cancels its
// engine request, so its KV blocks are freed at the next step.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_set>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/request.h"
#include "server/openai_response.h"

namespace tandem {
class Engine;
}

namespace tandem::server {

class EventQueue {
 public:
  // choice_base: added to the event's choice (several prompts share a queue).
  void push(const RequestEvent& ev, int32_t choice_base = 0);
  // Moves every queued event to `out`, waiting up to `timeout` for the first.
  void wait(std::vector<RequestEvent>& out, std::chrono::milliseconds timeout);

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<RequestEvent> q_;
};

class Generations;

// One HTTP request's engine requests: one per prompt, each with n choices;
// prompt k's choice c is choice k * n + c here.
class Generation {
 public:
  Generation(Generations& owner, int32_t prompts, int32_t n, std::shared_ptr<EventQueue> q);
  ~Generation();  // cancels the engine requests unless every choice finished
  Generation(const Generation&) = delete;
  Generation& operator=(const Generation&) = delete;

  int32_t n() const { return n_; }  // choices in all
  // Next events (see EventQueue::wait), each already counted in usage().
  // Events naming a choice outside [0, n) are dropped. With echo, a choice's
  // first event starts with its prompt's text and the prompt's logprobs.
  void next(std::vector<RequestEvent>& out, std::chrono::milliseconds timeout);
  bool finished() const { return finished_choices_ == n_; }
  const Usage& usage() const { return usage_; }
  void cancel();  // idempotent

  // Non-streaming: waits for every choice and builds the response. Throws
  // ApiError: 500 when a choice failed, 503 when it was cancelled (shutdown).
  nlohmann::json wait_full(const ResponseMeta& meta, const TokenText& text, const std::atomic<bool>& stopping);

 private:
  friend class Generations;
  Generations& owner_;
  std::vector<uint64_t> ids_;  // engine requests, one per prompt, as submitted
  int32_t per_prompt_;         // choices per prompt
  int32_t n_;
  std::shared_ptr<EventQueue> q_;
  std::vector<int32_t> prompt_tokens_, cached_tokens_;  // per prompt
  std::vector<int32_t> completion_tokens_;
  std::vector<bool> choice_done_;
  std::vector<std::string> echo_;  // per prompt; empty: no echo
  std::vector<bool> echoed_;       // per choice
  int32_t finished_choices_ = 0;
  Usage usage_;
  bool cancelled_ = false;
};

// The requests in flight, so shutdown can cancel them and wait for them.
class Generations {
 public:
  explicit Generations(Engine& engine) : engine_(engine) {}
  // Submits one engine request per prompt. Throws ApiError: 429 when the
  // engine's wait queue is full, 400 for what the engine refuses as invalid;
  // the prompts submitted before the one refused are cancelled then.
  // echo: per prompt, the text that leads each of its choices (empty: none).
  std::shared_ptr<Generation> start(std::vector<std::vector<int32_t>> prompts, const RequestParams& params,
                                    std::vector<std::string> echo = {});
  void cancel_all();
  // True when none is left within `timeout`.
  bool wait_idle(std::chrono::milliseconds timeout);
  Engine& engine() { return engine_; }

 private:
  friend class Generation;
  void remove(uint64_t id);
  Engine& engine_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::unordered_set<uint64_t> active_;
};

// Writes one streaming response: chat's role chunks, a chunk per event,
// usage when asked, then "data: [DONE]". A failed write means the client is
// gone: the request is cancelled at once.
class SseStream {
 public:
  using Write = std::function<bool(const std::string&)>;
  SseStream(std::shared_ptr<Generation> gen, ResponseMeta meta, TokenText text, double heartbeat_s);
  // Writes what is ready, waiting up to the heartbeat interval for it (and
  // writing an SSE comment when nothing came, which is how a client that left
  // during a long prefill is noticed). False when the client is gone.
  bool pump(const Write& write);
  bool done() const { return done_; }
  void close();  // cancels the request unless it completed

 private:
  std::shared_ptr<Generation> gen_;
  ResponseMeta meta_;
  TokenText text_;
  std::chrono::milliseconds heartbeat_;
  std::vector<size_t> offsets_;  // per choice: bytes of token pieces reported (text_offset)
  bool started_ = false;
  bool done_ = false;
};

}  // namespace tandem::server

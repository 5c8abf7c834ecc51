#include "server/generation.h"

#include <algorithm>
#include <optional>

#include <fmt/format.h>

#include "core/error.h"
#include "engine/llm_engine.h"

namespace tandem::server {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

void EventQueue::push(const RequestEvent& ev, int32_t choice_base) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    q_.push_back(ev);
    q_.back().choice += choice_base;
  }
  cv_.notify_one();
}

void EventQueue::wait(std::vector<RequestEvent>& out, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, timeout, [this] { return !q_.empty(); });
  while (!q_.empty()) {
    out.push_back(std::move(q_.front()));
    q_.pop_front();
  }
}

Generation::Generation(Generations& owner, int32_t prompts, int32_t n, std::shared_ptr<EventQueue> q)
    : owner_(owner), per_prompt_(n), n_(prompts * n), q_(std::move(q)), prompt_tokens_(prompts, 0),
      cached_tokens_(prompts, 0), completion_tokens_(n_, 0), choice_done_(n_, false) {}

Generation::~Generation() {
  if (!finished()) cancel();
  for (uint64_t id : ids_) owner_.remove(id);
}

void Generation::cancel() {
  if (cancelled_) return;
  cancelled_ = true;
  for (uint64_t id : ids_) owner_.engine_.cancel(id);
}

void Generation::next(std::vector<RequestEvent>& out, std::chrono::milliseconds timeout) {
  const size_t first = out.size();
  q_->wait(out, timeout);
  size_t kept = first;
  for (size_t i = first; i < out.size(); ++i) {
    const RequestEvent& ev = out[i];
    if (ev.choice < 0 || ev.choice >= n_ || choice_done_[ev.choice]) continue;
    const int32_t k = ev.choice / per_prompt_;
    if (!echo_.empty() && !echoed_[ev.choice]) {
      echoed_[ev.choice] = true;
      RequestEvent& e = out[i];
      e.text.insert(0, echo_[k]);
      e.logprobs.insert(e.logprobs.begin(), e.prompt_logprobs.begin(), e.prompt_logprobs.end());
      e.top_logprobs.insert(e.top_logprobs.begin(), e.prompt_top_logprobs.begin(), e.prompt_top_logprobs.end());
    }
    prompt_tokens_[k] = ev.prompt_tokens;
    cached_tokens_[k] = std::max(cached_tokens_[k], ev.cached_prompt_tokens);
    completion_tokens_[ev.choice] = ev.completion_tokens;
    if (ev.finished) {
      choice_done_[ev.choice] = true;
      ++finished_choices_;
    }
    if (kept != i) out[kept] = std::move(out[i]);
    ++kept;
  }
  out.resize(kept);
  usage_ = Usage{};
  for (int32_t c : prompt_tokens_) usage_.prompt_tokens += c;
  for (int32_t c : cached_tokens_) usage_.cached_tokens += c;
  for (int32_t c : completion_tokens_) usage_.completion_tokens += c;
}

namespace {

// How a choice that did not end normally is reported, or nullopt when it did.
std::optional<ApiError> abnormal_end(const std::string& reason, const std::string& error) {
  if (reason == "error")
    return ApiError(500, "generation failed: " + (error.empty() ? std::string("unknown error") : error),
                    "server_error");
  if (reason == "cancelled")
    return ApiError(503, "the request was cancelled (the server is shutting down)", "server_error");
  return std::nullopt;
}

}  // namespace

json Generation::wait_full(const ResponseMeta& meta, const TokenText& text, const std::atomic<bool>& stopping) {
  std::vector<ChoiceState> choices(n_);
  std::optional<Clock::time_point> deadline;
  std::vector<RequestEvent> evs;
  while (!finished()) {
    evs.clear();
    next(evs, std::chrono::milliseconds(250));
    for (const RequestEvent& ev : evs) choices[ev.choice].add(ev);
    if (stopping && !finished()) {
      // Shutdown cancelled us; the engine's final events should follow soon,
      // but do not hold the server's exit hostage to them.
      if (!deadline) deadline = Clock::now() + std::chrono::seconds(10);
      else if (Clock::now() > *deadline) throw *abnormal_end("cancelled", "");
    }
  }
  for (const ChoiceState& c : choices)
    if (auto err = abnormal_end(c.finish_reason, c.error)) throw *err;
  return full_response(meta, choices, usage_, text);
}

std::shared_ptr<Generation> Generations::start(std::vector<std::vector<int32_t>> prompts,
                                               const RequestParams& params, std::vector<std::string> echo) {
  auto q = std::make_shared<EventQueue>();
  // Made first: if a later prompt is refused, dropping it cancels the earlier ones.
  auto g = std::make_shared<Generation>(*this, static_cast<int32_t>(prompts.size()), params.n, q);
  if (!echo.empty()) {
    if (echo.size() != prompts.size()) throw ApiError(500, "echo texts do not match the prompts", "server_error");
    g->echo_ = std::move(echo);
    g->echoed_.assign(g->n_, false);
  }
  for (size_t k = 0; k < prompts.size(); ++k) {
    const int32_t base = static_cast<int32_t>(k) * params.n;
    uint64_t id = 0;
    try {
      id = engine_.submit(std::move(prompts[k]), params, [q, base](const RequestEvent& ev) { q->push(ev, base); });
    } catch (const Error& e) {
      if (e.kind() == ErrorKind::kResource)
        throw ApiError(429, fmt::format("the server is overloaded, retry later ({})", e.what()), "server_overloaded",
                       "", "rate_limit_exceeded");
      if (e.kind() == ErrorKind::kInvalidArgument) throw ApiError(400, e.what(), "invalid_request_error");
      throw ApiError(500, e.what(), "server_error");
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      active_.insert(id);
    }
    g->ids_.push_back(id);
  }
  return g;
}

void Generations::remove(uint64_t id) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    active_.erase(id);
  }
  cv_.notify_all();
}

void Generations::cancel_all() {
  std::vector<uint64_t> ids;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ids.assign(active_.begin(), active_.end());
  }
  for (uint64_t id : ids) engine_.cancel(id);
}

bool Generations::wait_idle(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, timeout, [this] { return active_.empty(); });
}

SseStream::SseStream(std::shared_ptr<Generation> gen, ResponseMeta meta, TokenText text, double heartbeat_s)
    : gen_(std::move(gen)), meta_(std::move(meta)), text_(std::move(text)),
      heartbeat_(std::max<int64_t>(10, static_cast<int64_t>(heartbeat_s * 1000))), offsets_(gen_->n(), 0) {}

void SseStream::close() {
  if (!gen_->finished()) gen_->cancel();
}

bool SseStream::pump(const Write& write) {
  if (done_) return true;
  std::string out;
  if (!started_) {
    started_ = true;
    // Chat clients expect the assistant role first; sending it at once also
    // gets the response headers out before prefill.
    if (meta_.endpoint == Endpoint::kChat)
      for (int32_t c = 0; c < gen_->n(); ++c) out += sse_event(role_chunk(meta_, c));
  } else {
    std::vector<RequestEvent> evs;
    gen_->next(evs, heartbeat_);
    for (const RequestEvent& ev : evs) {
      if (ev.finished) {
        if (auto err = abnormal_end(ev.finish_reason, ev.error)) {
          // One failed choice ends the response: report it and stop the rest.
          out += sse_event(error_json(*err));
          gen_->cancel();
          done_ = true;
          break;
        }
      }
      if (ev.text.empty() && ev.logprobs.empty() && !ev.finished) continue;
      out += sse_event(event_chunk(meta_, ev, text_, offsets_[ev.choice]));
      for (const TokenLogprob& lp : ev.logprobs) offsets_[ev.choice] += text_(lp.token).size();
    }
    if (!done_ && gen_->finished()) {
      if (meta_.include_usage) out += sse_event(usage_chunk(meta_, gen_->usage()));
      done_ = true;
    }
    if (done_) out += "data: [DONE]\n\n";
    if (out.empty()) out = ": keep-alive\n\n";
  }
  if (!out.empty() && !write(out)) {
    close();
    return false;
  }
  return true;
}

}  // namespace tandem::server

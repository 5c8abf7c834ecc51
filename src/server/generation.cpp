#include "server/generation.h"

#include <algorithm>
#include <optional>

#include <fmt/format.h>

#include "core/error.h"
#include "engine/intake.h"
#include "engine/llm_engine.h"

namespace tandem::server {

using nlohmann::json;

HttpResponse error_response(const ApiError& e) {
  HttpResponse r;
  r.status = e.status();
  r.body = dump_json(error_json(e));
  if (e.status() == 429 || e.status() == 503) r.headers.push_back({"Retry-After", "1"});
  return r;
}

void EventQueue::push(const RequestEvent& ev, int32_t choice_base) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    q_.push_back(ev);
    q_.back().choice += choice_base;
  }
  if (wake_) wake_();
}

void EventQueue::drain(std::vector<RequestEvent>& out) {
  std::lock_guard<std::mutex> lock(mu_);
  while (!q_.empty()) {
    out.push_back(std::move(q_.front()));
    q_.pop_front();
  }
}

Generation::Generation(Engine& engine, int32_t prompts, int32_t n, std::shared_ptr<EventQueue> q)
    : engine_(engine), per_prompt_(n), n_(prompts * n), q_(std::move(q)), prompt_tokens_(prompts, 0),
      cached_tokens_(prompts, 0), completion_tokens_(n_, 0), choice_done_(n_, false), text_at_(n_, 0) {}

Generation::~Generation() {
  if (!finished()) cancel();
}

void Generation::cancel() {
  if (cancelled_) return;
  cancelled_ = true;
  for (uint64_t id : ids_) engine_.cancel(id);
}

std::shared_ptr<Generation> Generation::start(Engine& engine, std::vector<std::vector<int32_t>> prompts,
                                              const RequestParams& params, std::vector<std::string> echo,
                                              std::function<void()> wake) {
  auto q = std::make_shared<EventQueue>(std::move(wake));
  // Made first: if a later prompt is refused, dropping it cancels the earlier ones.
  std::shared_ptr<Generation> g(new Generation(engine, static_cast<int32_t>(prompts.size()), params.n, q));
  if (!echo.empty()) {
    if (echo.size() != prompts.size()) throw ApiError(500, "echo texts do not match the prompts", "server_error");
    g->echo_ = std::move(echo);
    g->echoed_.assign(g->n_, false);
  }
  for (size_t k = 0; k < prompts.size(); ++k) {
    const int32_t base = static_cast<int32_t>(k) * params.n;
    try {
      g->ids_.push_back(
          engine.submit(std::move(prompts[k]), params, [q, base](const RequestEvent& ev) { q->push(ev, base); }));
    } catch (const Error& e) {
      if (e.kind() == ErrorKind::kResource)
        throw ApiError(429, fmt::format("the server is overloaded, retry later ({})", e.what()), "server_overloaded",
                       "", "rate_limit_exceeded");
      if (e.kind() == ErrorKind::kInvalidArgument) throw ApiError(400, e.what(), "invalid_request_error");
      throw ApiError(500, e.what(), "server_error");
    }
  }
  return g;
}

void Generation::next(std::vector<RequestEvent>& out, std::vector<std::vector<size_t>>& offsets) {
  const size_t first = out.size();
  q_->drain(out);
  offsets.resize(out.size());
  const Intake& intake = engine_.intake();
  size_t kept = first;
  for (size_t i = first; i < out.size(); ++i) {
    const RequestEvent& ev = out[i];
    if (ev.choice < 0 || ev.choice >= n_ || choice_done_[ev.choice]) continue;
    const int32_t k = ev.choice / per_prompt_;
    std::vector<size_t> offs;
    if (!echo_.empty() && !echoed_[ev.choice]) {
      echoed_[ev.choice] = true;
      RequestEvent& e = out[i];
      e.text.insert(0, echo_[k]);
      // The prompt's tokens point into the echoed text, as its ids spell it.
      std::vector<int32_t> ids;
      for (const TokenLogprob& lp : e.prompt_logprobs) ids.push_back(lp.token);
      intake.spell(ids, &offs);
      text_at_[ev.choice] = echo_[k].size();
      e.logprobs.insert(e.logprobs.begin(), e.prompt_logprobs.begin(), e.prompt_logprobs.end());
      e.top_logprobs.insert(e.top_logprobs.begin(), e.prompt_top_logprobs.begin(), e.prompt_top_logprobs.end());
    }
    for (size_t t = offs.size(); t < out[i].logprobs.size(); ++t) {
      offs.push_back(text_at_[ev.choice]);
      text_at_[ev.choice] += intake.text_bytes(out[i].logprobs[t].token);
    }
    prompt_tokens_[k] = ev.prompt_tokens;
    cached_tokens_[k] = std::max(cached_tokens_[k], ev.cached_prompt_tokens);
    completion_tokens_[ev.choice] = ev.completion_tokens;
    if (ev.finished) {
      choice_done_[ev.choice] = true;
      ++finished_choices_;
    }
    if (kept != i) out[kept] = std::move(out[i]);
    offsets[kept] = std::move(offs);
    ++kept;
  }
  out.resize(kept);
  offsets.resize(kept);
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

GenerationResponse::GenerationResponse(std::shared_ptr<Generation> gen, ResponseMeta meta, TokenText text,
                                       bool stream, double heartbeat_s, std::vector<http::Header> headers)
    : gen_(std::move(gen)), meta_(std::move(meta)), text_(std::move(text)), stream_(stream),
      heartbeat_s_(heartbeat_s), headers_(std::move(headers)) {
  if (!stream_) choices_.resize(gen_->n());
}

bool GenerationResponse::pump(ResponseWriter& w, double now_s) {
  return stream_ ? pump_stream(w, now_s) : pump_whole(w);
}

bool GenerationResponse::pump_whole(ResponseWriter& w) {
  evs_.clear();
  gen_->next(evs_, offs_);
  for (size_t i = 0; i < evs_.size(); ++i) {
    choices_[evs_[i].choice].add(evs_[i], offs_[i]);
    if (evs_[i].finished && evs_[i].choice == 0) timings_ = evs_[i].timings;
  }
  if (!gen_->finished()) return false;
  for (const ChoiceState& c : choices_)
    if (std::optional<ApiError> err = abnormal_end(c.finish_reason, c.error)) {
      HttpResponse r = error_response(*err);
      r.headers.insert(r.headers.end(), headers_.begin(), headers_.end());
      w.respond(std::move(r));
      return true;
    }
  HttpResponse r;
  r.body = dump_json(full_response(meta_, choices_, gen_->usage(), text_, &timings_));
  r.headers = headers_;
  w.respond(std::move(r));
  return true;
}

bool GenerationResponse::pump_stream(ResponseWriter& w, double now_s) {
  std::string out;
  if (!started_) {
    started_ = true;
    std::vector<http::Header> h = headers_;
    h.push_back({"Cache-Control", "no-cache"});
    h.push_back({"X-Accel-Buffering", "no"});
    w.start_stream(200, "text/event-stream", std::move(h));
    last_write_s_ = now_s;
    // Chat clients expect the assistant role first.
    if (meta_.endpoint == Endpoint::kChat)
      for (int32_t c = 0; c < gen_->n(); ++c) out += sse_event(role_chunk(meta_, c));
  }
  bool done = false;
  evs_.clear();
  gen_->next(evs_, offs_);
  for (size_t i = 0; i < evs_.size(); ++i) {
    const RequestEvent& ev = evs_[i];
    if (ev.finished && ev.choice == 0) timings_ = ev.timings;
    if (ev.finished) {
      if (auto err = abnormal_end(ev.finish_reason, ev.error)) {
        // One failed choice ends the response: report it and stop the rest.
        out += sse_event(error_json(*err));
        gen_->cancel();
        done = true;
        break;
      }
    }
    if (ev.text.empty() && ev.logprobs.empty() && !ev.finished && ev.tool_calls_at < 0) continue;
    if (meta_.tools && meta_.endpoint == Endpoint::kChat) {
      if (tool_parsers_.empty())
        for (int32_t c = 0; c < gen_->n(); ++c) tool_parsers_.emplace_back(meta_.tools->syntax, meta_.tools->forced);
      for (const json& chunk : tool_event_chunks(meta_, ev, tool_parsers_[static_cast<size_t>(ev.choice)]))
        out += sse_event(chunk);
      continue;
    }
    out += sse_event(event_chunk(meta_, ev, text_, offs_[i]));
  }
  if (!done && gen_->finished()) {
    if (meta_.include_usage) out += sse_event(usage_chunk(meta_, gen_->usage()));
    if (meta_.timings) out += sse_event(timings_chunk(meta_, timings_));
    done = true;
  }
  if (done) out += "data: [DONE]\n\n";
  if (out.empty() && now_s - last_write_s_ >= heartbeat_s_) out = ": keep-alive\n\n";
  if (!out.empty()) {
    w.write(out);
    last_write_s_ = now_s;
  }
  if (done) w.end();
  return done;
}

}  // namespace tandem::server

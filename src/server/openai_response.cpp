#include "server/openai_response.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

namespace tandem::server {

using nlohmann::json;

void ChoiceState::add(const RequestEvent& ev, const std::vector<size_t>& offs) {
  text += ev.text;
  logprobs.insert(logprobs.end(), ev.logprobs.begin(), ev.logprobs.end());
  offsets.insert(offsets.end(), offs.begin(), offs.end());
  top_logprobs.insert(top_logprobs.end(), ev.top_logprobs.begin(), ev.top_logprobs.end());
  completion_tokens = ev.completion_tokens;
  if (ev.tool_calls_at >= 0 && tool_calls_at < 0) tool_calls_at = ev.tool_calls_at;
  if (ev.finished) {
    finished = true;
    finish_reason = ev.finish_reason;
    error = ev.error;
  }
}

json usage_json(const Usage& u) {
  return {{"prompt_tokens", u.prompt_tokens},
          {"completion_tokens", u.completion_tokens},
          {"total_tokens", u.prompt_tokens + u.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", u.cached_tokens}}}};
}

json completion_logprobs_json(const std::vector<TokenLogprob>& lp, const std::vector<std::vector<TokenLogprob>>& top,
                              const TokenText& text, const std::vector<size_t>& offs) {
  json tokens = json::array(), values = json::array(), offsets = json::array();
  json tops = top.empty() ? json(nullptr) : json::array();
  for (size_t i = 0; i < lp.size(); ++i) {
    const std::string piece = text(lp[i].token);
    tokens.push_back(piece);
    offsets.push_back(i < offs.size() ? offs[i] : 0);
    if (std::isnan(lp[i].logprob)) {  // an echoed prompt's first token: nothing predicts it
      values.push_back(nullptr);
      if (i < top.size()) tops.push_back(nullptr);
      continue;
    }
    values.push_back(lp[i].logprob);
    if (i < top.size()) {
      json alts = json::object();
      for (const TokenLogprob& a : top[i]) alts[text(a.token)] = a.logprob;
      tops.push_back(std::move(alts));
    }
  }
  return {{"tokens", tokens}, {"token_logprobs", values}, {"top_logprobs", tops}, {"text_offset", offsets}};
}

namespace {

json bytes_of(const std::string& s) {
  json b = json::array();
  for (unsigned char c : s) b.push_back(static_cast<int>(c));
  return b;
}

}  // namespace

json chat_logprobs_json(const std::vector<TokenLogprob>& lp, const std::vector<std::vector<TokenLogprob>>& top,
                        const TokenText& text) {
  json content = json::array();
  for (size_t i = 0; i < lp.size(); ++i) {
    const std::string piece = text(lp[i].token);
    json alts = json::array();
    if (i < top.size())
      for (const TokenLogprob& a : top[i]) {
        const std::string p = text(a.token);
        alts.push_back({{"token", p}, {"logprob", a.logprob}, {"bytes", bytes_of(p)}});
      }
    content.push_back({{"token", piece}, {"logprob", lp[i].logprob}, {"bytes", bytes_of(piece)}, {"top_logprobs", alts}});
  }
  return content;
}

namespace {

json envelope(const ResponseMeta& m, bool chunk) {
  const bool chat = m.endpoint == Endpoint::kChat;
  const char* object = chat ? (chunk ? "chat.completion.chunk" : "chat.completion") : "text_completion";
  return {{"id", m.id}, {"object", object}, {"created", m.created}, {"model", m.model},
          {"system_fingerprint", nullptr}};
}

json finish_value(const std::string& reason) { return reason.empty() ? json(nullptr) : json(reason); }

}  // namespace

json timings_json(const RequestTimings& t) {
  const int32_t computed = t.prompt_tokens - t.cached_tokens;
  const int32_t decoded = std::max(t.generated_tokens - 1, 0);
  return {{"queued_ms", 1000 * t.queued_s},
          {"cache_n", t.cached_tokens},
          {"prompt_n", computed},
          {"prompt_ms", 1000 * t.prefill_s},
          {"prompt_per_token_ms", computed > 0 ? 1000 * t.prefill_s / computed : 0.0},
          {"prompt_per_second", t.prefill_tok_s()},
          {"ttft_ms", 1000 * t.ttft_s},
          {"predicted_n", t.generated_tokens},
          {"predicted_ms", 1000 * t.decode_s},
          {"predicted_per_token_ms", decoded > 0 ? 1000 * t.decode_s / decoded : 0.0},
          {"predicted_per_second", t.decode_tok_s()},
          {"preemptions", t.preemptions},
          {"draft_n", t.drafted},
          {"draft_n_accepted", t.accepted}};
}

json timings_chunk(const ResponseMeta& m, const RequestTimings& t) {
  json out = envelope(m, true);
  out["choices"] = json::array();
  out["timings"] = timings_json(t);
  return out;
}

json full_response(const ResponseMeta& m, const std::vector<ChoiceState>& choices, const Usage& u,
                   const TokenText& text, const RequestTimings* timings) {
  json out = envelope(m, false);
  json arr = json::array();
  for (size_t i = 0; i < choices.size(); ++i) {
    const ChoiceState& c = choices[i];
    json ch = {{"index", i}, {"finish_reason", finish_value(c.finish_reason)}, {"logprobs", nullptr}};
    if (m.endpoint == Endpoint::kChat && m.tools) {
      // The text read back into content and calls, as the stream's deltas add up.
      ToolCallParser parser(m.tools->syntax, m.tools->forced);
      std::vector<ToolCallParser::Event> evs;
      if (c.tool_calls_at >= 0) parser.open_at(static_cast<size_t>(c.tool_calls_at), evs);
      parser.feed(c.text, evs);
      parser.finish(evs);
      std::string content;
      json calls = json::array();
      for (ToolCallParser::Event& e : evs) {
        if (e.kind == ToolCallParser::Event::kContent) content += e.text;
        else if (e.kind == ToolCallParser::Event::kCallStart)
          calls.push_back({{"id", tool_call_id(m, static_cast<int32_t>(i), e.index)},
                           {"type", "function"},
                           {"function", {{"name", e.text}, {"arguments", ""}}}});
        else calls[static_cast<size_t>(e.index)]["function"]["arguments"].get_ref<std::string&>() += e.text;
      }
      ch["message"] = {{"role", "assistant"}, {"content", content.empty() && !calls.empty() ? json(nullptr) : json(content)}};
      if (!calls.empty()) {
        ch["message"]["tool_calls"] = std::move(calls);
        if (c.finish_reason == "stop") ch["finish_reason"] = "tool_calls";
      }
    } else if (m.endpoint == Endpoint::kChat) {
      ch["message"] = {{"role", "assistant"}, {"content", c.text}};
      if (m.logprobs) ch["logprobs"] = {{"content", chat_logprobs_json(c.logprobs, c.top_logprobs, text)}};
    } else {
      ch["text"] = c.text;
      if (m.logprobs) ch["logprobs"] = completion_logprobs_json(c.logprobs, c.top_logprobs, text, c.offsets);
    }
    arr.push_back(std::move(ch));
  }
  out["choices"] = std::move(arr);
  out["usage"] = usage_json(u);
  if (m.timings && timings) out["timings"] = timings_json(*timings);
  if (m.kv_transfer) out["kv_transfer_params"] = m.kv_transfer();
  return out;
}

json role_chunk(const ResponseMeta& m, int32_t choice) {
  json out = envelope(m, true);
  out["choices"] = json::array(
      {{{"index", choice}, {"delta", {{"role", "assistant"}, {"content", ""}}}, {"logprobs", nullptr},
        {"finish_reason", nullptr}}});
  if (m.include_usage) out["usage"] = nullptr;
  return out;
}

json event_chunk(const ResponseMeta& m, const RequestEvent& ev, const TokenText& text,
                 const std::vector<size_t>& offsets) {
  json out = envelope(m, true);
  json ch = {{"index", ev.choice}, {"logprobs", nullptr},
             {"finish_reason", ev.finished ? finish_value(ev.finish_reason) : json(nullptr)}};
  if (m.endpoint == Endpoint::kChat) {
    ch["delta"] = ev.text.empty() && ev.finished ? json::object() : json{{"content", ev.text}};
    if (m.logprobs) ch["logprobs"] = {{"content", chat_logprobs_json(ev.logprobs, ev.top_logprobs, text)}};
  } else {
    ch["text"] = ev.text;
    if (m.logprobs) ch["logprobs"] = completion_logprobs_json(ev.logprobs, ev.top_logprobs, text, offsets);
  }
  out["choices"] = json::array({std::move(ch)});
  if (m.include_usage) out["usage"] = nullptr;
  return out;
}

std::string tool_call_id(const ResponseMeta& m, int32_t choice, int32_t call) {
  const size_t dash = m.id.find('-');
  return fmt::format("call_{}_{}_{}", dash == std::string::npos ? m.id : m.id.substr(dash + 1), choice, call);
}

std::vector<json> tool_event_chunks(const ResponseMeta& m, const RequestEvent& ev, ToolCallParser& parser) {
  std::vector<ToolCallParser::Event> evs;
  if (ev.tool_calls_at >= 0) parser.open_at(static_cast<size_t>(ev.tool_calls_at), evs);
  parser.feed(ev.text, evs);
  if (ev.finished) parser.finish(evs);
  std::vector<json> out;
  const auto chunk = [&](json delta, json finish) {
    json o = envelope(m, true);
    o["choices"] = json::array({{{"index", ev.choice}, {"delta", std::move(delta)}, {"logprobs", nullptr},
                                 {"finish_reason", std::move(finish)}}});
    if (m.include_usage) o["usage"] = nullptr;
    out.push_back(std::move(o));
  };
  for (ToolCallParser::Event& e : evs) {
    if (e.kind == ToolCallParser::Event::kContent) {
      chunk({{"content", std::move(e.text)}}, nullptr);
    } else if (e.kind == ToolCallParser::Event::kCallStart) {
      chunk({{"tool_calls", json::array({{{"index", e.index},
                                          {"id", tool_call_id(m, ev.choice, e.index)},
                                          {"type", "function"},
                                          {"function", {{"name", std::move(e.text)}, {"arguments", ""}}}}})}},
            nullptr);
    } else {
      chunk({{"tool_calls", json::array({{{"index", e.index}, {"function", {{"arguments", std::move(e.text)}}}}})}},
            nullptr);
    }
  }
  if (ev.finished) {
    std::string reason = ev.finish_reason;
    if (reason == "stop" && parser.calls() > 0) reason = "tool_calls";
    chunk(json::object(), finish_value(reason));
  }
  return out;
}

json usage_chunk(const ResponseMeta& m, const Usage& u) {
  json out = envelope(m, true);
  out["choices"] = json::array();
  out["usage"] = usage_json(u);
  return out;
}

std::string sse_event(const json& j) { return "data: " + dump_json(j) + "\n\n"; }

}  // namespace tandem::server

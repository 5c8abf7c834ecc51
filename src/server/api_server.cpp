#include "server/api_server.h"

#include <arpa/inet.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <ctime>
#include <mutex>
#include <optional>
#include <random>

#include <fmt/format.h>

#include "core/error.h"
#include "engine/llm_engine.h"
#include "engine/tool_call_grammar.h"
#include "server/generation.h"
#include "server/openai_response.h"
#include "server/openai_schema.h"
#include "server/prometheus.h"
#include "server/timeline.h"
#include "server/web_page.h"

namespace tandem::server {

using nlohmann::json;

namespace {

// Calls in one answer when parallel_tool_calls is on: a small model could
// otherwise repeat calls until max_tokens.
constexpr int32_t kMaxParallelCalls = 8;

enum class Route {
  kPage, kHealth, kModels, kModel, kMetrics, kTimeline, kCompletions, kChat, kPrefill, kTokenize, kDetokenize,
  kRenderCompletions, kRenderChat, kResetPrefixCache
};

struct RouteInfo {
  Route route;
  bool post;  // POST, else GET/HEAD
};

std::optional<RouteInfo> find_route(const std::string& path) {
  if (path == "/" || path == "/index.html") return RouteInfo{Route::kPage, false};
  if (path == "/health") return RouteInfo{Route::kHealth, false};
  if (path == "/v1/timeline") return RouteInfo{Route::kTimeline, false};
  if (path == "/v1/prefill") return RouteInfo{Route::kPrefill, true};
  if (path == "/v1/models") return RouteInfo{Route::kModels, false};
  if (path.rfind("/v1/models/", 0) == 0 && path.size() > 11) return RouteInfo{Route::kModel, false};
  if (path == "/metrics") return RouteInfo{Route::kMetrics, false};
  if (path == "/v1/completions") return RouteInfo{Route::kCompletions, true};
  if (path == "/v1/chat/completions") return RouteInfo{Route::kChat, true};
  if (path == "/tokenize") return RouteInfo{Route::kTokenize, true};
  if (path == "/detokenize") return RouteInfo{Route::kDetokenize, true};
  if (path == "/v1/completions/render") return RouteInfo{Route::kRenderCompletions, true};
  if (path == "/v1/chat/completions/render") return RouteInfo{Route::kRenderChat, true};
  if (path == "/reset_prefix_cache") return RouteInfo{Route::kResetPrefixCache, true};
  return std::nullopt;
}

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(c >= 'A' && c <= 'Z' ? c + 32 : c);
  return out;
}

// The media type of a Content-Type value, lower case ("application/json").
std::string media_type(const std::string* v) {
  if (!v) return {};
  std::string t = lower(v->substr(0, v->find(';')));
  while (!t.empty() && (t.back() == ' ' || t.back() == '\t')) t.pop_back();
  return t;
}

// "%2F" and the like in a path segment (a model id may hold a slash).
std::string percent_decode(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    const auto hex = [](char c) {
      return c >= '0' && c <= '9' ? c - '0' : (c | 0x20) >= 'a' && (c | 0x20) <= 'f' ? (c | 0x20) - 'a' + 10 : -1;
    };
    if (s[i] == '%' && i + 2 < s.size() && hex(s[i + 1]) >= 0 && hex(s[i + 2]) >= 0) {
      out.push_back(static_cast<char>(hex(s[i + 1]) * 16 + hex(s[i + 2])));
      i += 2;
    } else {
      out.push_back(s[i]);
    }
  }
  return out;
}

bool is_ip_literal(const std::string& host) {
  unsigned char buf[16];
  if (host.size() > 2 && host.front() == '[' && host.back() == ']')
    return inet_pton(AF_INET6, host.substr(1, host.size() - 2).c_str(), buf) == 1;
  return inet_pton(AF_INET, host.c_str(), buf) == 1;
}

// The host part of a Host header value ("[::1]:8080" -> "[::1]").
std::string host_name(const std::string& v) {
  if (!v.empty() && v[0] == '[') return lower(v.substr(0, v.find(']') + 1));
  return lower(v.substr(0, v.find(':')));
}

}  // namespace

// The answer to a prefill, once its prompt is in the cache.
class PrefillResponse final : public AsyncResponse {
 public:
  PrefillResponse(std::shared_ptr<Generation> gen, std::string session, std::vector<http::Header> headers)
      : gen_(std::move(gen)), session_(std::move(session)), headers_(std::move(headers)) {}
  bool pump(ResponseWriter& w, double) override {
    evs_.clear();
    gen_->next(evs_, offs_);
    for (const RequestEvent& ev : evs_)
      if (ev.finished) {
        reason_ = ev.finish_reason;
        error_ = ev.error;
        timings_ = ev.timings;
      }
    if (!gen_->finished()) return false;
    HttpResponse r;
    if (reason_ == "cancelled" || reason_ == "error") {
      r = error_response(reason_ == "error" ? ApiError(500, "prefill failed: " + error_, "server_error")
                                            : ApiError(503, "the prefill was cancelled", "server_error"));
    } else {
      const RequestTimings& t = timings_;
      r.body = dump_json({{"object", "prefill"},
                          {"session", session_},
                          {"prompt_tokens", t.prompt_tokens},
                          {"cached_tokens", t.cached_tokens},
                          {"computed_tokens", t.prompt_tokens - t.cached_tokens},
                          {"queued_ms", 1000 * t.queued_s},
                          {"prefill_ms", 1000 * t.prefill_s}});
    }
    r.headers.insert(r.headers.end(), headers_.begin(), headers_.end());
    w.respond(std::move(r));
    return true;
  }
  void cancel() override { gen_->cancel(); }

 private:
  std::shared_ptr<Generation> gen_;
  std::string session_;
  std::vector<http::Header> headers_;
  std::vector<RequestEvent> evs_;
  std::vector<std::vector<size_t>> offs_;
  std::string reason_, error_;
  RequestTimings timings_;
};

struct Server::Impl final : HttpHandler {
  Engine& engine;
  Timeline timeline;
  const Intake& intake;
  ServerConfig cfg;
  HttpServer http;
  std::vector<std::string> model_names;  // names a request's "model" may use
  int32_t max_context = 0;
  int64_t prompt_limit = 0;  // tokens a prompt must stay under: the context, or none with a streaming window
  int64_t created = 0;
  std::atomic<bool> stopping{false};
  // Shared with the engine's sink, which may outlive the server.
  std::shared_ptr<KvEventPublisher> kv_events;
  // Prefill and decode roles; shared with the engine's export callbacks.
  std::shared_ptr<KvTransfer> transfer;
  std::mutex id_mu;
  std::mt19937_64 id_rng{std::random_device{}()};

  Impl(Engine& e, ServerConfig c)
      : engine(e), intake(e.intake()), cfg(std::move(c)), http(*this, cfg.http) {
    for (std::string& h : cfg.allowed_hosts) h = lower(h);
  }

  std::string new_id(const char* prefix) {
    std::lock_guard<std::mutex> lock(id_mu);
    return prefix + fmt::format("{:016x}", id_rng());
  }

  // --- screening (before the body) ------------------------------------------

  bool host_allowed(const http::RequestHead& h) const {
    const std::string* host = h.find("host");
    if (!host) return true;  // HTTP/1.0 without one: no browser sends such a request
    if (std::find(cfg.allowed_hosts.begin(), cfg.allowed_hosts.end(), "*") != cfg.allowed_hosts.end()) return true;
    const std::string name = host_name(*host);
    if (name == "localhost" || is_ip_literal(name)) return true;
    return std::find(cfg.allowed_hosts.begin(), cfg.allowed_hosts.end(), name) != cfg.allowed_hosts.end();
  }

  // Whether `origin` may call across origins (CORS); the server's own origin
  // needs no CORS.
  bool cors_allowed(const std::string& origin) const {
    for (const std::string& o : cfg.cors_origins)
      if (o == "*" || o == origin) return true;
    return false;
  }
  bool same_origin(const std::string& origin, const http::RequestHead& h) const {
    const std::string* host = h.find("host");
    return host && lower(origin) == "http://" + lower(*host);
  }

  // CORS headers for a response to an allowed cross-origin page.
  std::vector<http::Header> cors_headers(const http::RequestHead& h) const {
    const std::string* origin = h.find("origin");
    if (!origin || same_origin(*origin, h) || !cors_allowed(*origin)) return {};
    return {{"Access-Control-Allow-Origin", *origin}, {"Vary", "Origin"}};
  }

  bool authorized(const http::RequestHead& h) const { return cfg.api_keys.empty() || key_index(h) >= 0; }

  // Which of the API keys the request carries; -1: none of them.
  int key_index(const http::RequestHead& h) const {
    const std::string* got_p = h.find("authorization");
    const std::string got = got_p ? *got_p : std::string();
    int found = -1;
    for (size_t k = 0; k < cfg.api_keys.size(); ++k) {
      const std::string want = "Bearer " + cfg.api_keys[k];
      // Compare every byte of every key so the time taken does not reveal a key's prefix.
      unsigned diff = got.size() != want.size();
      for (size_t i = 0; i < want.size(); ++i)
        diff |= static_cast<unsigned char>(want[i]) ^ static_cast<unsigned char>(i < got.size() ? got[i] : 0);
      if (diff == 0 && found < 0) found = static_cast<int>(k);
    }
    return found;
  }

  // Who may share this request's cached prefix and session: clients of the
  // same cache_salt and, with --cache-per-key, the same API key. The salt
  // keys the prefix hashes; a session's name is taken inside that scope, so
  // another scope naming it reaches a session of its own.
  void scope_request(RequestParams& p, const http::RequestHead& h) const {
    if (cfg.cache_per_key && !cfg.api_keys.empty())
      p.cache_salt = fmt::format("key{}\n{}", key_index(h), p.cache_salt);
    // The salt's length first: no two (salt, name) pairs spell the same internal name.
    if (!p.session.empty() && !p.cache_salt.empty())
      p.session = fmt::format("{}:{}:{}", p.cache_salt.size(), p.cache_salt, p.session);
  }

  ParseLimits parse_limits() const {
    ParseLimits lim = cfg.request;
    lim.json = cfg.json;
    return lim;
  }

  int64_t tokenize_limit() const { return cfg.max_tokenize > 0 ? cfg.max_tokenize : max_context; }

  static HttpResponse api_error(int status, const std::string& message, std::string type = "invalid_request_error",
                                std::string param = {}, std::string code = {}) {
    return error_response(ApiError(status, message, std::move(type), std::move(param), std::move(code)));
  }

  std::optional<HttpResponse> screen(const HttpRequest& req) override {
    const http::RequestHead& h = req.head;
    if (!host_allowed(h))
      return api_error(403, fmt::format("Host '{}' is not allowed (a page on another domain may be reaching this "
                                        "server through DNS rebinding); start the server with --allowed-hosts {} "
                                        "to serve that name",
                                        clip(*h.find("host"), 80), clip(host_name(*h.find("host")), 80)),
                       "invalid_request_error", "", "host_not_allowed");
    const std::string* origin = h.find("origin");
    if (origin && !same_origin(*origin, h) && !cors_allowed(*origin))
      return api_error(403, fmt::format("requests from pages at origin '{}' are not allowed; start the server with "
                                        "--cors-origin {} to allow them",
                                        clip(*origin, 80), clip(*origin, 80)),
                       "invalid_request_error", "", "origin_not_allowed");
    if (h.method == "OPTIONS") {  // a CORS preflight, or a plain question
      HttpResponse r;
      r.status = 204;
      r.content_type = "text/plain";
      r.headers = cors_headers(h);
      if (!r.headers.empty()) {
        r.headers.push_back({"Access-Control-Allow-Methods", "GET, HEAD, POST, OPTIONS"});
        r.headers.push_back({"Access-Control-Allow-Headers", "Authorization, Content-Type"});
        r.headers.push_back({"Access-Control-Max-Age", "600"});
      } else {
        r.headers.push_back({"Allow", "GET, HEAD, POST, OPTIONS"});
      }
      return r;
    }
    const std::optional<RouteInfo> route = find_route(h.path);
    if (!route)
      return with_cors(h, api_error(404, fmt::format("Unknown route: {} {}", h.method, clip(h.path, 200)),
                                    "invalid_request_error", "", "not_found"));
    const bool get = h.method == "GET" || h.method == "HEAD";
    if (route->post ? h.method != "POST" : !get) {
      HttpResponse r = api_error(405, fmt::format("{} takes {}, not {}", h.path, route->post ? "POST" : "GET",
                                                  clip(h.method, 20)));
      r.headers.push_back({"Allow", route->post ? "POST" : "GET, HEAD"});
      return with_cors(h, std::move(r));
    }
    // The page itself is public (it asks for the key); everything it calls is not.
    if (route->route != Route::kHealth && route->route != Route::kPage && !authorized(h)) {
      HttpResponse r = api_error(401, "Missing or incorrect API key (send 'Authorization: Bearer KEY')",
                                 "invalid_request_error", "", "invalid_api_key");
      r.headers.push_back({"WWW-Authenticate", "Bearer"});
      return with_cors(h, std::move(r));
    }
    if (route->post) {
      const std::string type = media_type(h.find("content-type"));
      if (type == "multipart/form-data")
        return with_cors(h, api_error(415, "multipart form data is not accepted; send the request as JSON "
                                           "(Content-Type: application/json)"));
      // A browser's POST (it sends Origin or Sec-Fetch-*) must be JSON: a page
      // can only send that across origins after a preflight we answer.
      const bool browser = origin || h.find("sec-fetch-site") || h.find("sec-fetch-mode");
      if (browser && type != "application/json")
        return with_cors(h, api_error(415, "a request from a browser must be sent as application/json"));
      if (stopping) return with_cors(h, api_error(503, "the server is shutting down", "server_error"));
    }
    return std::nullopt;
  }

  HttpResponse with_cors(const http::RequestHead& h, HttpResponse r) const {
    for (http::Header& x : cors_headers(h)) r.headers.push_back(std::move(x));
    return r;
  }

  bool runs_inline(const http::RequestHead& h) const override {
    const std::optional<RouteInfo> route = find_route(h.path);
    return route && !route->post;
  }

  HttpResponse error(int status, const std::string& message) const override {
    return api_error(status, message, status >= 500 ? "server_error" : "invalid_request_error");
  }

  // --- handling --------------------------------------------------------------

  Reply handle(HttpRequest& req, const Waker& wake) override {
    const http::RequestHead& h = req.head;
    try {
      const RouteInfo route = *find_route(h.path);
      switch (route.route) {
        case Route::kPage: {
          HttpResponse r;
          r.body = std::string(web_page());
          r.content_type = "text/html; charset=utf-8";
          // Its own scripts only, and no framing by other sites.
          r.headers = {{"Content-Security-Policy", "default-src 'self'; script-src 'unsafe-inline'; style-src "
                                                   "'unsafe-inline'; connect-src 'self'; frame-ancestors 'none'"},
                       {"X-Content-Type-Options", "nosniff"}};
          return Reply{std::move(r), nullptr};
        }
        case Route::kTimeline: return Reply{std::nullopt, timeline.subscribe(wake, cors_headers(h), cfg.heartbeat_s)};
        case Route::kPrefill: return prefill(req, wake);
        case Route::kHealth: return ok(h, R"({"status":"ok"})");
        case Route::kModels: return ok(h, dump_json({{"object", "list"}, {"data", json::array({model_json()})}}));
        case Route::kModel:
          check_model(percent_decode(h.path.substr(11)));
          return ok(h, dump_json(model_json()));
        case Route::kMetrics: {
          HttpResponse r;
          r.body = render_prometheus(engine.metrics(), ServingInfo{cfg.model_id, engine.config().block_size,
                                                                   kv_format_name(kv_format(engine.config().kv_cache))});
          if (transfer) {
            transfer->expire();
            r.body += transfer->prometheus();
          }
          r.content_type = "text/plain; version=0.0.4; charset=utf-8";
          return Reply{with_cors(h, std::move(r)), nullptr};
        }
        case Route::kTokenize:
        case Route::kDetokenize:
          return ok(h, dump_json(tokens(route.route == Route::kTokenize, std::move(req.body))));
        case Route::kCompletions:
        case Route::kChat: return generate(route.route == Route::kChat ? Endpoint::kChat : Endpoint::kCompletions,
                                           req, wake);
        case Route::kRenderCompletions:
        case Route::kRenderChat:
          return ok(h, dump_json(render(route.route == Route::kRenderChat ? Endpoint::kChat : Endpoint::kCompletions,
                                        req)));
        case Route::kResetPrefixCache:
          engine.reset_prefix_cache();
          return ok(h, R"({"status":"ok"})");
      }
      throw ApiError(404, "unknown route", "invalid_request_error");
    } catch (const ApiError& e) {
      return Reply{with_cors(h, error_response(e)), nullptr};
    } catch (const Error& e) {
      const bool bad = e.kind() == ErrorKind::kInvalidArgument || e.kind() == ErrorKind::kUnsupported;
      return Reply{with_cors(h, api_error(bad ? 400 : 500, e.what(), bad ? "invalid_request_error" : "server_error")),
                   nullptr};
    }
  }

  Reply ok(const http::RequestHead& h, std::string body) const {
    HttpResponse r;
    r.body = std::move(body);
    return Reply{with_cors(h, std::move(r)), nullptr};
  }

  void check_model(const std::string& name) const {
    if (name.empty()) return;
    if (std::find(model_names.begin(), model_names.end(), name) != model_names.end()) return;
    throw ApiError(404, fmt::format("The model '{}' does not exist; this server serves '{}'", clip(name, 200),
                                    cfg.model_id),
                   "invalid_request_error", "model", "model_not_found");
  }

  // A prompt's ids if it leaves room to generate; `which` names it in errors.
  std::vector<int32_t> checked_length(std::vector<int32_t> ids, const char* param, const std::string& which) const {
    if (ids.empty()) throw_invalid(param, fmt::format("{} is empty", which));
    if (static_cast<int64_t>(ids.size()) >= prompt_limit) throw too_long(param, which, std::to_string(ids.size()));
    return ids;
  }
  ApiError too_long(const char* param, const std::string& which, const std::string& count) const {
    return ApiError(400,
                    fmt::format("This model's maximum context length is {} tokens, but {} has {} tokens "
                                "(no room left to generate)",
                                max_context, which, count),
                    "invalid_request_error", param, "context_length_exceeded");
  }
  // A text's ids; a text that cannot fit is refused before it is tokenized.
  std::vector<int32_t> text_tokens(const std::string& text, const char* param, const std::string& which) const {
    const int64_t at_least = intake.min_tokens(text.size());
    if (at_least >= prompt_limit) throw too_long(param, which, fmt::format("at least {}", at_least));
    return checked_length(intake.prompt(text), param, which);
  }

  // The calls a chat request with tools may make, in the model's format.
  std::shared_ptr<const ToolCallGrammar> tool_grammar(const ApiRequest& r, ChatFamily family) const {
    using TC = ApiRequest::ToolChoice;
    auto g = std::make_shared<ToolCallGrammar>();
    g->syntax = tool_syntax(family);
    g->syntax.marker_token = tool_marker_token(g->syntax, intake.tokenizer());
    if (r.tool_choice == TC::kAuto && !g->syntax.model_opens())
      throw_invalid("tool_choice",
                    fmt::format("'tool_choice' 'auto' is not available for this model: its chat format ({}) has no "
                                "tool-call marker{}; send 'required' or a named function",
                                intake.chat_template()->variant(),
                                g->syntax.marker.empty()
                                    ? std::string()
                                    : fmt::format(" (its vocabulary has no control token {})", g->syntax.marker)));
    g->forced = r.tool_choice != TC::kAuto;
    g->max_calls = r.parallel_tool_calls ? kMaxParallelCalls : 1;
    for (size_t i = 0; i < r.tools.size(); ++i)
      if (r.tool_choice != TC::kNamed || r.tools[i].name == r.tool_choice_name)
        g->functions.emplace_back(r.tools[i].name, r.tool_schemas[i]);
    return g;
  }

  // The token ids of each prompt (chat: the one conversation).
  std::vector<std::vector<int32_t>> prompt_tokens(ApiRequest& r) const {
    if (r.endpoint == Endpoint::kChat) {
      if (!intake.has_chat())
        throw ApiError(400, "chat is not available for this model: " + intake.chat_error(), "invalid_request_error",
                       "messages");
      size_t bytes = 0;
      for (const ToolChatMessage& m : r.messages) bytes += m.content.size();
      for (const ToolFunction& f : r.tools) bytes += f.description.size() + f.parameters.size();
      if (const int64_t at_least = intake.min_tokens(bytes); at_least >= prompt_limit)
        throw too_long("messages", "the prompt", fmt::format("at least {}", at_least));
      const ChatFamily family = intake.chat_template()->family();
      std::string tools_text;
      if (r.tool_choice != ApiRequest::ToolChoice::kNone) {
        tools_text = describe_tools(family, r.tools);
        r.params.tool_calls = tool_grammar(r, family);
      }
      ChatPrompt chat;
      try {
        chat = intake.chat(tool_conversation(family, r.messages, tools_text));
      } catch (const Error& e) {
        throw_invalid("messages", e.what());
      }
      for (std::string& s : chat.stop) r.params.stop.push_back(std::move(s));
      return {checked_length(std::move(chat.tokens), "messages", "the prompt")};
    }
    std::vector<std::vector<int32_t>> out;
    for (size_t i = 0; i < r.prompts.size(); ++i) {
      const Prompt& p = r.prompts[i];
      const std::string name = r.prompts.size() == 1 ? "the prompt" : fmt::format("prompt[{}]", i);
      if (p.is_tokens) {
        for (int32_t id : p.tokens)
          if (id >= intake.n_vocab())
            throw_invalid("prompt", fmt::format("token id {} in {} is outside the vocabulary (size {})", id, name,
                                                intake.n_vocab()));
        out.push_back(checked_length(p.tokens, "prompt", name));
      } else {
        out.push_back(text_tokens(p.text, "prompt", name));
      }
    }
    return out;
  }

  Reply generate(Endpoint ep, HttpRequest& req, const Waker& wake) {
    const ParseLimits lim = parse_limits();
    ApiRequest r = parse_request(ep, std::move(req.body), lim);  // frees the body once parsed
    check_model(r.model);
    std::vector<std::vector<int32_t>> prompts = prompt_tokens(r);
    std::vector<size_t> lengths;
    for (const auto& ids : prompts) lengths.push_back(ids.size());
    check_logprob_budget(r, lengths, max_context, lim);
    scope_request(r.params, req.head);
    ResponseMeta meta;
    if (transfer && r.kv_transfer.present) prepare_transfer(r, prompts, meta);
    meta.endpoint = ep;
    meta.id = new_id(ep == Endpoint::kChat ? "chatcmpl-" : "cmpl-");
    meta.model = cfg.model_id;
    meta.created = static_cast<int64_t>(std::time(nullptr));
    meta.logprobs = r.params.logprobs >= 0;
    meta.include_usage = r.include_usage;
    meta.timings = r.timings;
    meta.tools = r.params.tool_calls;
    std::vector<std::string> echo;
    if (r.echo)
      for (size_t k = 0; k < r.prompts.size(); ++k)
        echo.push_back(r.prompts[k].is_tokens ? intake.spell(prompts[k]) : r.prompts[k].text);
    if (stopping) throw ApiError(503, "the server is shutting down", "server_error");
    auto gen = Generation::start(engine, std::move(prompts), r.params, std::move(echo), wake);  // 429, 400
    const Intake* in = &intake;
    TokenText text = [in](int32_t id) { return in->piece(id); };
    return Reply{std::nullopt, std::make_unique<GenerationResponse>(std::move(gen), std::move(meta), std::move(text),
                                                                    r.stream, cfg.heartbeat_s, cors_headers(req.head))};
  }

  // kv_transfer_params (vllm-router's prefill/decode mode). A prefill
  // instance asked to prefill for a decode instance keeps the prompt's blocks
  // and answers where they are; a decode instance fetches the blocks its
  // prefix cache lacks before it submits. Other roles ignore them.
  void prepare_transfer(ApiRequest& r, const std::vector<std::vector<int32_t>>& prompts, ResponseMeta& meta) {
    const KvTransferParams& t = r.kv_transfer;
    if (transfer->role() == Role::kPrefill && t.do_remote_decode) {
      if (prompts.size() != 1 || r.params.n != 1)
        throw_invalid("kv_transfer_params", "a prefill for a decode instance takes one prompt and n = 1");
      struct Ticket {
        std::mutex mu;
        std::vector<uint64_t> ids;
      };
      auto ticket = std::make_shared<Ticket>();
      r.params.on_kv_export = [tr = transfer, ticket](KvBlockRun run) {
        std::vector<uint64_t> ids = tr->pin(std::move(run));
        std::lock_guard<std::mutex> lock(ticket->mu);
        ticket->ids = std::move(ids);
      };
      meta.kv_transfer = [tr = transfer, ticket] {
        std::lock_guard<std::mutex> lock(ticket->mu);
        return json{{"do_remote_prefill", true},       {"do_remote_decode", false},
                    {"remote_engine_id", tr->engine_id()}, {"remote_block_ids", ticket->ids},
                    {"remote_host", tr->host()},          {"remote_port", tr->port()}};
      };
    } else if (transfer->role() == Role::kDecode && t.do_remote_prefill) {
      if (prompts.size() != 1) throw_invalid("kv_transfer_params", "a decode of transferred blocks takes one prompt");
      const int32_t have = std::min<int32_t>(engine.cached_blocks(prompts[0], r.params.cache_salt),
                                             static_cast<int32_t>(t.remote_block_ids.size()));
      auto imp = std::make_shared<RequestParams::KvImport>();
      try {
        imp->run = transfer->fetch(t, prompts[0], have);
      } catch (const Error& e) {
        const bool refused = e.kind() == ErrorKind::kInvalidArgument;
        throw ApiError(refused ? 400 : 502,
                       fmt::format("KV transfer from {}:{} ({}): {}", t.remote_host, t.remote_port,
                                   refused ? "blocks refused" : "failed", e.what()),
                       refused ? "invalid_request_error" : "server_error", "kv_transfer_params");
      }
      imp->done = [tr = transfer](const KvImportResult& res) { tr->imported(res); };
      r.params.kv_import = std::move(imp);
    }
  }

  // /v1/completions/render and /v1/chat/completions/render, as vLLM answers
  // them: what the request would run, as token ids (routers that place a
  // request by its prefix's blocks ask for them). Completions: a list, one
  // entry per prompt; chat: the one entry.
  json render(Endpoint ep, HttpRequest& req) {
    ApiRequest r = parse_request(ep, std::move(req.body), parse_limits());
    check_model(r.model);
    const std::vector<std::vector<int32_t>> prompts = prompt_tokens(r);
    const SamplingParams& sp = r.params.sampling;
    const RequestParams& p = r.params;
    json sampling = {{"n", p.n},
                     {"temperature", sp.temperature},
                     {"top_p", sp.top_p},
                     {"top_k", sp.top_k > 0 ? sp.top_k : 0},
                     {"min_p", sp.min_p > 0 ? sp.min_p : 0.0f},
                     {"presence_penalty", sp.presence_penalty},
                     {"frequency_penalty", sp.frequency_penalty},
                     {"repetition_penalty", sp.repeat_penalty},
                     {"max_tokens", p.max_tokens >= 0 ? json(p.max_tokens) : json(nullptr)},
                     {"stop", p.stop},
                     {"logprobs", p.logprobs >= 0 ? json(p.logprobs) : json(nullptr)}};
    if (sp.seed != 0xFFFFFFFF) sampling["seed"] = sp.seed;
    json out = json::array();
    for (const std::vector<int32_t>& ids : prompts)
      out.push_back({{"request_id", new_id(ep == Endpoint::kChat ? "chatcmpl-" : "cmpl-")},
                     {"token_ids", ids},
                     {"sampling_params", sampling},
                     {"model", cfg.model_id},
                     {"stream", r.stream},
                     {"stream_options", r.stream ? json{{"include_usage", r.include_usage}} : json(nullptr)},
                     {"priority", p.priority},
                     {"token_offsets", nullptr}});
    return ep == Endpoint::kChat ? out[0] : out;
  }

  // POST /v1/prefill: computes a prompt's (or a conversation's) K/V ahead of
  // the request that will use it, as a background request below every
  // decode, kept under a session for that request (progressive prefill).
  Reply prefill(HttpRequest& req, const Waker& wake) {
    const ParseLimits lim = parse_limits();
    json tree = parse_json_body(req.body);
    req.body = std::string();
    const Endpoint ep = tree.is_object() && tree.contains("messages") ? Endpoint::kChat : Endpoint::kCompletions;
    ApiRequest r = parse_request_json(ep, std::move(tree), lim);
    check_model(r.model);
    if (r.prompts.size() > 1) throw_invalid("prompt", "a prefill takes one prompt");
    std::vector<std::vector<int32_t>> prompts = prompt_tokens(r);
    RequestParams& p = r.params;
    p.max_tokens = 0;
    p.n = 1;
    p.priority = std::min(p.priority, -1);  // below the requests that decode
    if (p.session.empty()) p.session = new_id("sess-");
    const std::string name = p.session;  // as the client names it, outside its scope
    scope_request(p, req.head);
    if (stopping) throw ApiError(503, "the server is shutting down", "server_error");
    auto gen = Generation::start(engine, std::move(prompts), p, {}, wake);
    return Reply{std::nullopt, std::make_unique<PrefillResponse>(std::move(gen), name, cors_headers(req.head))};
  }

  json parse_json_body(const std::string& body) const {
    try {
      return parse_json(body, cfg.json);
    } catch (const Error& e) {
      throw_invalid("", e.what());
    }
  }

  // /tokenize and /detokenize, answered in both vLLM's and llama.cpp's keys.
  json tokens(bool encode, std::string body) const {
    if (encode) {
      const TokenizeRequest r = parse_tokenize(std::move(body), cfg.json);
      check_model(r.model);
      // As a prompt: a text that cannot fit is refused before it is tokenized.
      if (const int64_t at_least = intake.min_tokens(r.text.size()); at_least > tokenize_limit())
        throw_invalid("prompt", fmt::format("the text has at least {} tokens; /tokenize takes at most {}", at_least,
                                            tokenize_limit()));
      const std::vector<int32_t> ids = intake.tokenize(r.text, r.add_special, true);
      return {{"tokens", ids}, {"count", ids.size()}, {"max_model_len", max_context}};
    }
    const DetokenizeRequest r = parse_detokenize(body, cfg.json);
    check_model(r.model);
    if (static_cast<int64_t>(r.tokens.size()) > tokenize_limit())
      throw_invalid("tokens", fmt::format("'tokens' holds {} ids; /detokenize takes at most {}", r.tokens.size(),
                                          tokenize_limit()));
    for (int32_t id : r.tokens)
      if (id >= intake.n_vocab())
        throw_invalid("tokens", fmt::format("token id {} is outside the vocabulary (size {})", id, intake.n_vocab()));
    const std::string text = intake.detokenize(r.tokens);
    return {{"prompt", text}, {"content", text}};
  }

  json model_json() const {
    return {{"id", cfg.model_id}, {"object", "model"}, {"created", created}, {"owned_by", "tandem"},
            {"max_model_len", max_context}};
  }
};

Server::Server(Engine& engine, ServerConfig cfg) : impl_(std::make_unique<Impl>(engine, std::move(cfg))) {
  Impl& s = *impl_;
  const std::string& file_name = s.intake.model_name();
  if (s.cfg.model_id.empty()) s.cfg.model_id = file_name;
  s.model_names = {s.cfg.model_id, file_name, s.intake.model_path()};
  if (file_name.size() > 5 && file_name.ends_with(".gguf")) s.model_names.push_back(file_name.substr(0, file_name.size() - 5));
  s.max_context = s.cfg.max_context > 0 ? s.cfg.max_context : s.intake.max_context();
  s.prompt_limit = engine.config().kv_cache.window > 0 ? INT64_MAX : s.max_context;
  engine.set_step_observer([&s](const StepReport& r) { s.timeline.publish(r); });
  if (!s.cfg.kv_events.endpoint.empty()) {
    s.cfg.kv_events.block_size = engine.config().block_size;
    // vLLM names its main pool's medium "GPU"; a pool in host memory is "CPU".
    s.cfg.kv_events.medium = engine.device().rfind("cuda", 0) == 0 ? "GPU" : "CPU";
    s.kv_events = std::make_shared<KvEventPublisher>(s.cfg.kv_events);
    engine.set_kv_event_sink(
        [pub = s.kv_events](std::vector<KvCacheEvent> events) { pub->publish(events); }, s.cfg.kv_events.hash_seed);
  }
  if (s.cfg.kv_transfer.role != Role::kBoth) {
    if (const std::string why = engine.kv_transfer_unsupported(); !why.empty())
      fail(ErrorKind::kInvalidArgument, "--role {}: {}", role_name(s.cfg.kv_transfer.role), why);
    s.transfer = std::make_shared<KvTransfer>(s.cfg.kv_transfer, engine.kv_block_layout(), make_tcp_transport());
    s.transfer->set_decoding([&engine] { return engine.metrics().running > 0; });
  }
  s.created = static_cast<int64_t>(std::time(nullptr));
}

Server::~Server() { stop(); }

void Server::bind() {
  impl_->http.bind(impl_->cfg.host, impl_->cfg.port);
  if (impl_->transfer && impl_->transfer->role() == Role::kPrefill) impl_->transfer->listen();
}

int Server::kv_transfer_port() const { return impl_->transfer ? impl_->transfer->port() : 0; }

int Server::port() const { return impl_->http.port(); }

const std::string& Server::model_id() const { return impl_->cfg.model_id; }

std::string Server::kv_events_endpoint() const { return impl_->kv_events ? impl_->kv_events->endpoint() : ""; }

std::string Server::kv_events_replay_endpoint() const {
  return impl_->kv_events ? impl_->kv_events->replay_endpoint() : "";
}

void Server::run() { impl_->http.run(); }

void Server::stop() {
  if (impl_->stopping.exchange(true)) return;
  impl_->http.stop();
}

}  // namespace tandem::server

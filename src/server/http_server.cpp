#include "server/http_server.h"

// Debian's libcpp-httplib is compiled with TLS, zlib and brotli support, and
// those switches change the layout of httplib::Request: the header must see
// the same ones the library was built with.
#ifndef CPPHTTPLIB_OPENSSL_SUPPORT
#define CPPHTTPLIB_OPENSSL_SUPPORT
#endif
#ifndef CPPHTTPLIB_ZLIB_SUPPORT
#define CPPHTTPLIB_ZLIB_SUPPORT
#endif
#ifndef CPPHTTPLIB_BROTLI_SUPPORT
#define CPPHTTPLIB_BROTLI_SUPPORT
#endif
#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <ctime>
#include <filesystem>
#include <optional>
#include <random>
#include <unordered_set>

#include <fmt/format.h>

#include "chat/model_chat.h"
#include "core/error.h"
#include "engine/llm_engine.h"
#include "gguf/gguf.h"
#include "model/model.h"
#include "server/generation.h"
#include "server/openai_response.h"
#include "server/openai_schema.h"
#include "server/prometheus.h"
#include "tokenizer/tokenizer.h"

namespace tandem::server {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

void send_error(httplib::Response& res, const ApiError& e) {
  res.status = e.status();
  res.set_content(dump_json(error_json(e)), "application/json");
}

std::string random_hex(std::mt19937_64& rng) { return fmt::format("{:016x}", rng()); }

// Larger request bodies get a 413.
constexpr size_t kMaxBodyBytes = size_t{64} << 20;

std::string body_too_large() { return fmt::format("the request body is larger than {} MiB", kMaxBodyBytes >> 20); }

// The request body, read through httplib's content reader. A plain handler
// would let the library parse a body sent as application/x-www-form-urlencoded
// (curl -d's default) as form fields first, and turn any such body over its
// compiled-in 8 KiB form limit away with a bare 413; the body here is JSON
// whatever the Content-Type says. nullopt, with the error sent, when the body
// cannot be read.
std::optional<std::string> read_body(const httplib::Request& req, httplib::Response& res,
                                     const httplib::ContentReader& reader) {
  if (req.is_multipart_form_data()) {
    send_error(res, ApiError(415, "multipart form data is not accepted; send the request as JSON "
                                  "(Content-Type: application/json)",
                             "invalid_request_error"));
    return std::nullopt;
  }
  std::string body;
  const bool ok = reader([&body](const char* data, size_t n) {
    body.append(data, n);
    return true;
  });
  if (ok) return body;
  // httplib has set the status: 413 over the payload limit, 400 otherwise.
  const bool too_large = res.status == 413;
  send_error(res, ApiError(too_large ? 413 : 400,
                           too_large ? body_too_large()
                                     : "the request body could not be read (no Content-Length, or the connection "
                                       "broke off)",
                           "invalid_request_error"));
  res.set_header("Connection", "close");  // the rest of an unread body must not be taken for a request
  return std::nullopt;
}

}  // namespace

struct Server::Impl {
  Engine& engine;
  const Model& model;
  ServerConfig cfg;
  httplib::Server http;
  std::vector<std::string> model_names;  // names a request's "model" may use
  std::optional<ChatTemplate> chat;
  std::string chat_error;                // why chat is unavailable
  int32_t max_context = 0;
  int64_t created = 0;
  int bound_port = -1;
  int listen_fd = -1;  // the listening socket, seen through httplib's socket-options hook

  std::atomic<bool> stopping{false};
  Generations generations;

  std::mutex id_mu;
  std::mt19937_64 id_rng{std::random_device{}()};

  Impl(Engine& e, const Model& m, ServerConfig c) : engine(e), model(m), cfg(std::move(c)), generations(e) {}

  std::string new_id(const char* prefix) {
    std::lock_guard<std::mutex> lock(id_mu);
    return prefix + random_hex(id_rng);
  }

  bool authorized(const httplib::Request& req) const {
    if (cfg.api_key.empty()) return true;
    const std::string want = "Bearer " + cfg.api_key;
    const std::string got = req.get_header_value("Authorization");
    // Compare every byte so the time taken does not reveal the key's prefix.
    unsigned diff = got.size() != want.size();
    for (size_t i = 0; i < want.size(); ++i) diff |= static_cast<unsigned char>(want[i]) ^
                                                     static_cast<unsigned char>(i < got.size() ? got[i] : 0);
    return diff == 0;
  }

  void check_model(const std::string& name) const {
    if (name.empty()) return;
    if (std::find(model_names.begin(), model_names.end(), name) != model_names.end()) return;
    throw ApiError(404, fmt::format("The model '{}' does not exist; this server serves '{}'", name, cfg.model_id),
                   "invalid_request_error", "model", "model_not_found");
  }

  // The token ids of each prompt (chat: the one conversation).
  std::vector<std::vector<int32_t>> prompt_tokens(ApiRequest& r) const {
    const Tokenizer& tok = model.tokenizer();
    if (r.endpoint == Endpoint::kChat) {
      if (!chat) throw ApiError(400, "chat is not available for this model: " + chat_error, "invalid_request_error",
                                "messages");
      std::string text;
      try {
        text = chat->apply(r.messages, true);
      } catch (const Error& e) {
        throw_invalid("messages", e.what());
      }
      for (auto& s : chat->stop_strings()) r.params.stop.push_back(s);
      return {checked_length(tok.encode(text, true, true), "messages", "the prompt")};
    }
    std::vector<std::vector<int32_t>> out;
    for (size_t i = 0; i < r.prompts.size(); ++i) {
      const Prompt& p = r.prompts[i];
      const std::string name = r.prompts.size() == 1 ? "the prompt" : fmt::format("prompt[{}]", i);
      if (p.is_tokens) {
        for (int32_t id : p.tokens)
          if (id >= tok.n_vocab())
            throw_invalid("prompt", fmt::format("token id {} in {} is outside the vocabulary (size {})", id, name,
                                                tok.n_vocab()));
        out.push_back(checked_length(p.tokens, "prompt", name));
      } else {
        out.push_back(checked_length(tok.encode(p.text, true, true), "prompt", name));
      }
    }
    return out;
  }

  // A prompt's ids if it leaves room to generate; `which` names it in errors.
  std::vector<int32_t> checked_length(std::vector<int32_t> ids, const char* param, const std::string& which) const {
    if (ids.empty()) throw_invalid(param, fmt::format("{} is empty", which));
    if (static_cast<int64_t>(ids.size()) >= max_context)
      throw ApiError(400,
                     fmt::format("This model's maximum context length is {} tokens, but {} has {} tokens "
                                 "(no room left to generate)",
                                 max_context, which, ids.size()),
                     "invalid_request_error", param, "context_length_exceeded");
    return ids;
  }

  void handle_generate(Endpoint ep, const httplib::Request& req, httplib::Response& res,
                       const httplib::ContentReader& reader) {
    const std::optional<std::string> body = read_body(req, res, reader);
    if (!body) return;
    try {
      if (stopping) throw ApiError(503, "the server is shutting down", "server_error");
      ApiRequest r = parse_request(ep, *body);
      check_model(r.model);
      std::vector<std::vector<int32_t>> prompts = prompt_tokens(r);
      ResponseMeta meta;
      meta.endpoint = ep;
      meta.id = new_id(ep == Endpoint::kChat ? "chatcmpl-" : "cmpl-");
      meta.model = cfg.model_id;
      meta.created = static_cast<int64_t>(std::time(nullptr));
      meta.logprobs = r.params.logprobs >= 0;
      meta.include_usage = r.include_usage;
      std::vector<std::string> echo;
      if (r.echo)
        for (size_t k = 0; k < r.prompts.size(); ++k)
          echo.push_back(r.prompts[k].is_tokens ? model.tokenizer().decode(prompts[k]) : r.prompts[k].text);
      auto gen = generations.start(std::move(prompts), r.params, std::move(echo));  // throws ApiError (429, 400)
      const TokenText text = [this](int32_t id) { return model.tokenizer().token_to_piece(id, true); };
      if (!r.stream) {
        json body = gen->wait_full(meta, text, stopping);  // throws ApiError (500, 503)
        res.set_content(dump_json(body), "application/json");
        return;
      }
      res.set_header("Cache-Control", "no-cache");
      res.set_header("X-Accel-Buffering", "no");
      auto stream = std::make_shared<SseStream>(gen, meta, text, cfg.heartbeat_s);
      res.set_chunked_content_provider(
          "text/event-stream",
          [this, stream](size_t, httplib::DataSink& sink) {
            const auto write = [&sink](const std::string& s) { return sink.write(s.data(), s.size()); };
            const bool go_on = stream->pump(write);
            if (go_on && stream->done()) sink.done();
            return go_on;
          },
          [stream](bool) { stream->close(); });
    } catch (const ApiError& e) {
      send_error(res, e);
    } catch (const Error& e) {
      send_error(res, ApiError(e.kind() == ErrorKind::kInvalidArgument ? 400 : 500, e.what(),
                               e.kind() == ErrorKind::kInvalidArgument ? "invalid_request_error" : "server_error"));
    } catch (const std::exception& e) {
      send_error(res, ApiError(500, e.what(), "server_error"));
    }
  }

  // /tokenize and /detokenize, answered in both vLLM's and llama.cpp's keys.
  void handle_tokens(bool encode, const httplib::Request& req, httplib::Response& res,
                     const httplib::ContentReader& reader) {
    const std::optional<std::string> body = read_body(req, res, reader);
    if (!body) return;
    const Tokenizer& tok = model.tokenizer();
    try {
      json out;
      if (encode) {
        const TokenizeRequest r = parse_tokenize(*body);
        check_model(r.model);
        const std::vector<int32_t> ids = tok.encode(r.text, r.add_special, true);
        out = {{"tokens", ids}, {"count", ids.size()}, {"max_model_len", max_context}};
      } else {
        const DetokenizeRequest r = parse_detokenize(*body);
        check_model(r.model);
        for (int32_t id : r.tokens)
          if (id >= tok.n_vocab())
            throw_invalid("tokens", fmt::format("token id {} is outside the vocabulary (size {})", id, tok.n_vocab()));
        const std::string text = tok.decode(r.tokens);
        out = {{"prompt", text}, {"content", text}};
      }
      res.set_content(dump_json(out), "application/json");
    } catch (const ApiError& e) {
      send_error(res, e);
    } catch (const Error& e) {
      send_error(res, ApiError(400, e.what(), "invalid_request_error"));
    }
  }

  void routes() {
    // Responses are small and streams must reach the client event by event,
    // so nothing is compressed (httplib would buffer a gzip stream).
    http.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
      const_cast<httplib::Request&>(req).headers.erase("Accept-Encoding");
      if (req.path == "/health" || authorized(req)) return httplib::Server::HandlerResponse::Unhandled;
      send_error(res, ApiError(401, "Missing or incorrect API key (send 'Authorization: Bearer KEY')",
                               "invalid_request_error", "", "invalid_api_key"));
      res.set_header("WWW-Authenticate", "Bearer");
      return httplib::Server::HandlerResponse::Handled;
    });
    http.set_error_handler(httplib::Server::HandlerWithResponse([](const httplib::Request& req,
                                                                   httplib::Response& res) {
      if (!res.body.empty() || res.is_chunked_content_provider_) return httplib::Server::HandlerResponse::Unhandled;
      std::string msg = fmt::format("HTTP error {}", res.status);
      if (res.status == 404) msg = fmt::format("Unknown route: {} {}", req.method, req.path);
      if (res.status == 413) msg = body_too_large();
      send_error(res, ApiError(res.status, msg, "invalid_request_error", "", res.status == 404 ? "not_found" : ""));
      return httplib::Server::HandlerResponse::Handled;
    }));
    http.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
      std::string msg = "internal error";
      try {
        if (ep) std::rethrow_exception(ep);
      } catch (const std::exception& e) {
        msg = e.what();
      } catch (...) {
      }
      send_error(res, ApiError(500, msg, "server_error"));
    });

    http.Get("/health", [](const httplib::Request&, httplib::Response& res) {
      res.set_content(R"({"status":"ok"})", "application/json");
    });
    http.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
      json list = {{"object", "list"}, {"data", json::array({model_json()})}};
      res.set_content(dump_json(list), "application/json");
    });
    http.Get(R"(/v1/models/(.+))", [this](const httplib::Request& req, httplib::Response& res) {
      try {
        check_model(req.matches[1].str());
        res.set_content(dump_json(model_json()), "application/json");
      } catch (const ApiError& e) {
        send_error(res, e);
      }
    });
    http.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
      res.set_content(render_prometheus(engine.metrics()), "text/plain; version=0.0.4; charset=utf-8");
    });
    const auto post_only = [this](const char* path) {
      http.Get(path, [](const httplib::Request& req, httplib::Response& res) {
        send_error(res, ApiError(405, fmt::format("{} takes POST, not GET", req.path), "invalid_request_error"));
        res.set_header("Allow", "POST");
      });
    };
    for (const auto& [path, encode] : {std::pair{"/tokenize", true}, std::pair{"/detokenize", false}}) {
      const bool enc = encode;
      http.Post(path, [this, enc](const httplib::Request& req, httplib::Response& res,
                                  const httplib::ContentReader& reader) { handle_tokens(enc, req, res, reader); });
      post_only(path);
    }
    for (const auto& [path, ep] : {std::pair{"/v1/completions", Endpoint::kCompletions},
                                   std::pair{"/v1/chat/completions", Endpoint::kChat}}) {
      const Endpoint e = ep;
      http.Post(path, [this, e](const httplib::Request& req, httplib::Response& res,
                                const httplib::ContentReader& reader) { handle_generate(e, req, res, reader); });
      post_only(path);
    }
  }

  json model_json() const {
    return {{"id", cfg.model_id}, {"object", "model"}, {"created", created}, {"owned_by", "tandem"},
            {"max_model_len", max_context}};
  }
};

Server::Server(Engine& engine, const Model& model, ServerConfig cfg)
    : impl_(std::make_unique<Impl>(engine, model, std::move(cfg))) {
  Impl& s = *impl_;
  const std::string& path = model.file().path();
  const std::string file_name = std::filesystem::path(path).filename().string();
  if (s.cfg.model_id.empty()) s.cfg.model_id = file_name;
  s.model_names = {s.cfg.model_id, file_name, path};
  if (file_name.size() > 5 && file_name.ends_with(".gguf")) s.model_names.push_back(file_name.substr(0, file_name.size() - 5));
  try {
    s.chat = chat_template_for(model.file());
  } catch (const Error& e) {
    s.chat_error = e.what();
  }
  s.max_context = s.cfg.max_context > 0 ? s.cfg.max_context : engine.config().max_context;
  if (s.max_context <= 0) s.max_context = std::min(model.config().n_ctx_train, 4096);
  s.created = static_cast<int64_t>(std::time(nullptr));

  int threads = s.cfg.http_threads;
  if (threads <= 0) {
    // Every admitted request holds a thread while it runs or waits, and a few
    // more serve /health, /metrics and the requests that are turned away.
    const EngineConfig& ec = engine.config();
    threads = std::clamp(ec.max_seqs + ec.max_waiting + 8, 16, 512);
  }
  s.http.new_task_queue = [threads] { return new httplib::ThreadPool(static_cast<size_t>(threads)); };
  s.http.set_payload_max_length(kMaxBodyBytes);
  s.http.set_tcp_nodelay(true);
  // httplib's default sets SO_REUSEPORT, which lets a second server bind the
  // same port and silently take half the connections. SO_REUSEADDR alone
  // still allows a quick restart over connections in TIME_WAIT.
  s.http.set_socket_options([&s](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    s.listen_fd = sock;
  });
  s.routes();
}

Server::~Server() { stop(); }

void Server::bind() {
  Impl& s = *impl_;
  if (s.cfg.port == 0) {
    s.bound_port = s.http.bind_to_any_port(s.cfg.host);
    if (s.bound_port < 0) fail(ErrorKind::kIo, "cannot listen on {} (any port)", s.cfg.host);
  } else {
    if (!s.http.bind_to_port(s.cfg.host, s.cfg.port))
      fail(ErrorKind::kIo, "cannot listen on {}:{} (address in use or not available)", s.cfg.host, s.cfg.port);
    s.bound_port = s.cfg.port;
  }
  // httplib 0.11 listens with a backlog of 5: a burst of clients connecting
  // at once overflows it (dropped handshakes, resets). listen() again on the
  // bound socket only raises the backlog.
  if (s.listen_fd >= 0) ::listen(s.listen_fd, 1024);
}

int Server::port() const { return impl_->bound_port; }

const std::string& Server::model_id() const { return impl_->cfg.model_id; }

void Server::run() { impl_->http.listen_after_bind(); }

void Server::stop() {
  Impl& s = *impl_;
  if (s.stopping.exchange(true)) return;
  // Cancel what is in flight so each handler ends (streams with an error
  // event, others with 503), give them a moment to say so, then close.
  s.generations.cancel_all();
  s.generations.wait_idle(std::chrono::seconds(5));
  s.http.stop();
}

}  // namespace tandem::server

// `tandem serve`'s routes over the engine: the OpenAI API (completions, chat,
// models), /tokenize and /detokenize, /health and /metrics; what routers in
// front of several replicas use (/v1/completions/render and
// /v1/chat/completions/render: a request's token ids; KV events over ZeroMQ;
// /reset_prefix_cache); progressive prefill (/v1/prefill), the live timeline
// (/v1/timeline) and the web page at /.
//
// The server is safe to run on localhost, where any web page the user visits
// can send it requests: a Host header that names something other than
// localhost, an IP address or an allowed name is refused (a DNS-rebinding
// page names its own domain); a browser's request (it carries Origin) must
// come from the server's own origin or one allowed for CORS, and a browser's
// POST must be application/json, which no cross-origin form can send without
// asking first.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "runtime/json_parse.h"
#include "server/http_server.h"
#include "server/kv_events.h"
#include "server/kv_transfer.h"
#include "server/openai_schema.h"

namespace tandem {
class Engine;
}  // namespace tandem

namespace tandem::server {

struct ServerConfig {
  std::string host = "127.0.0.1";
  int port = 8080;                 // 0: any free port (see Server::port())
  // Each of these is accepted as 'Authorization: Bearer KEY'; none: no authentication.
  std::vector<std::string> api_keys;
  // The prefix cache and /v1/prefill sessions keyed per API key: a client
  // shares cached blocks and sessions only with clients of the same key.
  bool cache_per_key = false;
  // What one request may ask for (stop strings, messages, logprob entries);
  // its `json` is replaced by the one below.
  ParseLimits request;
  // /tokenize and /detokenize: tokens a text may hold or ids may be given; 0: the context length.
  int64_t max_tokenize = 0;
  std::string model_id;            // what /v1/models lists; "" = the model file's name
  int32_t max_context = 0;         // prompt limit in tokens; 0: the engine's
  double heartbeat_s = 1.0;        // SSE comment after this much silence in a stream
  // Host names accepted beside "localhost" and IP addresses; "*": any.
  std::vector<std::string> allowed_hosts;
  // Origins (scheme://host:port) whose pages may call the API across
  // origins, with CORS headers; "*": any. The server's own origin always may.
  std::vector<std::string> cors_origins;
  HttpLimits http;
  JsonLimits json;
  // KV events for prefix-aware routers (server/kv_events.h); endpoint "": none.
  // block_size and medium are filled from the engine.
  KvEventsConfig kv_events;
  // Prefill and decode instances (server/kv_transfer.h); role both: neither.
  KvTransferConfig kv_transfer;
};

class Server {
 public:
  // The engine must outlive the server and be started by the caller, after
  // this constructor (which subscribes to its steps). Throws tandem::Error(kIo)
  // when the KV events endpoint cannot be opened.
  Server(Engine& engine, ServerConfig cfg);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Binds the listening socket. Throws tandem::Error(kIo) when it cannot.
  void bind();
  int port() const;                     // the bound port
  const std::string& model_id() const;  // as /v1/models lists it
  // Where the KV events go ("" when off), and their replay socket.
  std::string kv_events_endpoint() const;
  std::string kv_events_replay_endpoint() const;
  // The prefill role's KV transfer listener (bind() starts it); 0 otherwise.
  int kv_transfer_port() const;
  // Serves until stop(). bind() first.
  void run();
  // Thread-safe, callable from a signal-waiting thread: stops accepting,
  // cancels the requests in flight (their clients get an error event or a
  // 503) and makes run() return once they have been told.
  void stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tandem::server

// The OpenAI-compatible HTTP front end of the serving engine.
//
// Each HTTP request runs on one of the HTTP thread pool's threads. It submits
// to the engine and then waits on a queue of its own: the engine thread only
// pushes events there (it never touches a socket), and the HTTP thread writes
// them out, as one JSON body or as server-sent events. A streaming client that
// goes away is noticed at the next write (or heartbeat) and its request is
// cancelled at once, which frees its KV blocks at the engine's next step.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

namespace tandem {
class Engine;
class Model;
}  // namespace tandem

namespace tandem::server {

struct ServerConfig {
  std::string host = "127.0.0.1";
  int port = 8080;                 // 0: any free port (see Server::port())
  std::string api_key;             // "": no authentication
  std::string model_id;            // what /v1/models lists; "" = the model file's name
  int32_t http_threads = 0;        // 0: enough for max_seqs + max_waiting requests at once (capped)
  int32_t max_context = 0;         // prompt limit in tokens; 0: the engine's config
  double heartbeat_s = 1.0;        // SSE comment while a stream waits, so a gone client is noticed
};

class Server {
 public:
  // The engine must outlive the server and be started by the caller.
  Server(Engine& engine, const Model& model, ServerConfig cfg);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Binds the listening socket. Throws tandem::Error(kIo) when it cannot.
  void bind();
  int port() const;  // the bound port
  const std::string& model_id() const;  // as /v1/models lists it
  // Serves until stop(). bind() first.
  void run();
  // Thread-safe, callable from a signal-waiting thread: stops accepting,
  // cancels the requests in flight (their clients get an error event or a 503)
  // and makes run() return once their handlers are done.
  void stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tandem::server

// An event-driven HTTP/1.1 server: one thread owns every socket (epoll), so
// a client that sends or reads slowly holds a few kilobytes and a file
// descriptor, never a thread. Handlers that cost CPU (parsing a body,
// tokenizing) run on a small worker pool; responses that wait on the engine
// are AsyncResponses the loop pumps when the engine wakes them.
//
// Defences are part of the connection's life, not of the handlers:
// deadlines for a request's head, its body, an idle keep-alive connection and
// a response the client does not read; caps on connections (in all and per
// client address, the oldest idle connection giving way to a new one); one
// budget for request bodies held in memory at once, whatever their framing;
// strict parsing (server/http_parse.h); pipelined requests answered in order;
// and a hang-up noticed at once, whatever the request is waiting for.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "server/http_parse.h"

namespace tandem::server {

struct HttpLimits {
  http::HeadLimits head;
  size_t max_body_bytes = size_t{64} << 20;  // one request's body, after chunked decoding
  // Request bodies held in memory at once, over all connections; a body that
  // does not fit waits (unread) until it does. 0: max_body_bytes.
  size_t body_budget_bytes = 0;
  double head_timeout_s = 10;   // from a request's first byte to the end of its head
  double body_timeout_s = 60;   // from the end of the head to the end of the body
  double idle_timeout_s = 60;   // a keep-alive connection with no request
  double write_timeout_s = 60;  // a response the client reads none of
  size_t max_unread_output = size_t{16} << 20;  // a stream's bytes waiting for a slow reader
  size_t max_pipelined_bytes = size_t{1} << 20;  // bytes read ahead while a request runs
  int max_connections = 1024;       // lowered to what the file-descriptor limit allows
  int max_connections_per_ip = 128;
  int workers = 2;                  // threads for handlers that do not run on the loop
  size_t max_queued = 256;          // requests waiting for a worker; beyond, 503
};

struct HttpRequest {
  http::RequestHead head;
  std::string body;
  std::string peer;  // the client's address
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  std::vector<http::Header> headers;  // more header fields (name as written)
  bool close = false;                 // close the connection after it
};

// How an AsyncResponse writes; used on the loop thread only.
class ResponseWriter {
 public:
  virtual ~ResponseWriter() = default;
  virtual void respond(HttpResponse r) = 0;  // the whole response at once
  // A response whose body comes in pieces (chunked; close-delimited for HTTP/1.0).
  virtual void start_stream(int status, std::string content_type, std::vector<http::Header> headers) = 0;
  virtual void write(std::string_view bytes) = 0;
  virtual void end() = 0;
  // Bytes written that the client has not read yet (waiting in our buffer).
  virtual size_t unread() const = 0;
  // Bounds what the kernel holds for this connection's unread output (it
  // grows to megabytes for a client that reads nothing).
  virtual void limit_send_buffer(int bytes) = 0;
};

// A response produced over time. pump() runs on the loop thread: once when
// the response is installed, whenever its Waker is called, and on every tick
// (a few times a second, for heartbeats). It writes what is ready and returns
// true once the response is complete.
class AsyncResponse {
 public:
  virtual ~AsyncResponse() = default;
  virtual bool pump(ResponseWriter& w, double now_s) = 0;
  // Ends the work behind the response (idempotent). After a hang-up the
  // response is dropped; when the server stops, pump() runs on so it can say
  // so, until it completes or the stop's grace period ends.
  virtual void cancel() = 0;
};

// Makes the loop pump one connection's AsyncResponse. Thread-safe, cheap,
// and harmless after the connection or the server is gone.
class Waker {
 public:
  struct Channel;
  Waker() = default;
  Waker(std::shared_ptr<Channel> ch, uint64_t conn) : ch_(std::move(ch)), conn_(conn) {}
  void operator()() const;

 private:
  std::shared_ptr<Channel> ch_;
  uint64_t conn_ = 0;
};

struct Reply {
  std::optional<HttpResponse> response;
  std::unique_ptr<AsyncResponse> async;
};

class HttpHandler {
 public:
  virtual ~HttpHandler() = default;
  // Before the body is read (req.body is empty): a response here refuses the
  // request at once (unknown route, method, authentication, origin).
  virtual std::optional<HttpResponse> screen(const HttpRequest& req) = 0;
  // Whether handle() is cheap enough for the loop thread (health, metrics).
  virtual bool runs_inline(const http::RequestHead& head) const = 0;
  virtual Reply handle(HttpRequest& req, const Waker& wake) = 0;
  // The body of an error the HTTP layer itself answers (400, 408, 413, ...).
  virtual HttpResponse error(int status, const std::string& message) const = 0;
};

class HttpServer {
 public:
  HttpServer(HttpHandler& handler, HttpLimits limits);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Listens on host:port (port 0: any free one). Throws tandem::Error(kIo).
  void bind(const std::string& host, int port);
  int port() const;
  // Serves until stop(); returns once the responses in flight have ended
  // (or `grace_s` after the stop).
  void run();
  // Any thread, also a signal-waiting one: stops accepting, cancels every
  // response in flight and makes run() return.
  void stop(double grace_s = 5.0);

  struct Stats {
    int connections = 0;
    size_t body_bytes = 0;  // request bodies held in memory now
  };
  Stats stats() const;  // thread-safe

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tandem::server

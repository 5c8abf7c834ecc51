// The live timeline (GET /v1/timeline): every engine step as a server-sent
// event, for each client watching. The engine's thread publishes a step as
// one JSON line, shared by every subscriber's queue (bounded in bytes, as is
// what waits unread on its connection: a client that falls behind loses its
// oldest steps, never the engine's time or the server's memory); each
// subscriber's stream is pumped on the HTTP loop like any other response.
#pragma once

#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "engine/step_log.h"
#include "server/http_server.h"

namespace tandem::server {

class Timeline {
 public:
  // Engine thread (Engine::set_step_observer).
  void publish(const StepReport& r);
  // A stream of the steps from now on.
  std::unique_ptr<AsyncResponse> subscribe(const Waker& wake, std::vector<http::Header> headers, double heartbeat_s);
  size_t watchers() const;

  struct Sub;

 private:
  mutable std::mutex mu_;
  std::vector<std::shared_ptr<Sub>> subs_;
};

// One step as the timeline's JSON: {"step", "t0", "t1", "phase", "rows",
// "parts": [[request, choice, prompt rows, decode rows], ...],
// "arrived": [[request, t], ...], "finished": [[request, reason], ...], "preempted"}.
std::string step_json(const StepReport& r);

}  // namespace tandem::server

// Where requests and cancellations wait between steps: queued from any
// thread (submit, cancel), taken whole by the engine's thread at the start of
// a step, whose loop sleeps here while there is nothing to do.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "engine/sequence.h"

namespace tandem {

class RequestInbox {
 public:
  // Queues the sequence `make` returns, `make` running under the inbox's lock
  // (what it counts and numbers is in arrival order); when it throws,
  // nothing is queued. Wakes the loop.
  template <class F>
  void push(F&& make) {
    std::lock_guard<std::mutex> lock(mu_);
    seqs_.push_back(make());
    cv_.notify_all();
  }
  void cancel(uint64_t request_id);
  // Runs `task` on the engine's thread at the start of the next step (a
  // question about the KV pool from another thread). Wakes the loop.
  void post(std::function<void()> task);
  std::vector<std::function<void()>> take_tasks();
  // The engine's thread: everything queued since the last call.
  void take(std::vector<std::unique_ptr<Sequence>>& seqs, std::vector<uint64_t>& cancels);
  // Sleeps until something is queued, `wake` holds or `timeout` passes.
  void wait(std::chrono::milliseconds timeout, const std::function<bool()>& wake);
  void notify() { cv_.notify_all(); }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::unique_ptr<Sequence>> seqs_;
  std::vector<uint64_t> cancels_;
  std::vector<std::function<void()>> tasks_;
};

}  // namespace tandem

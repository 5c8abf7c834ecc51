// A persistent fork-join pool. A forward pass runs dozens of parallel loops
// per layer, so workers stay alive and spin briefly between loops instead of
// being created or woken through the OS each time.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace tandem {

class ThreadPool {
 public:
  explicit ThreadPool(int n_threads);  // n_threads <= 0: physical cores
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }

  // Calls fn(thread_index, n_threads) once on every thread (the caller is
  // thread 0) and returns when all are done. Work splitting is the caller's,
  // so it can be fixed by the problem's shape rather than by timing.
  void run(const std::function<void(int, int)>& fn);

  // Splits [0, n) into contiguous chunks of at least `grain` items, one range
  // per thread: fn(begin, end).
  void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

  static int default_threads();  // physical cores

 private:
  void worker(int index);

  int n_threads_;
  std::vector<std::thread> threads_;
  const std::function<void(int, int)>* job_ = nullptr;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::condition_variable cv_;
};

}  // namespace tandem

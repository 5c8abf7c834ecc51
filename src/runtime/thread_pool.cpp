#include "runtime/thread_pool.h"

#include <sched.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <set>
#include <string>
#include <utility>

namespace tandem {
namespace {

using Clock = std::chrono::steady_clock;

// A worker keeps polling this long after its last job before it sleeps on
// the condition variable. Loops of a forward pass are microseconds apart and
// decode steps a few milliseconds, so workers stay hot through a whole
// generation and a futex wake is paid only after an idle pause.
constexpr auto kHotPeriod = std::chrono::milliseconds(20);
// Waits longer than this yield the CPU between polls: when the machine is
// oversubscribed, the thread we wait for may need our core to make progress.
constexpr auto kYieldAfter = std::chrono::microseconds(50);
// Polls between clock reads.
constexpr int kPollsPerCheck = 128;
// Ranges per thread in the dynamic loops: enough that a preempted thread's
// share is taken over by the others, few enough that claiming is cheap.
constexpr int64_t kChunksPerThread = 4;

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

// Polls `done` until it holds; spins, then spins with yields, and gives up
// (returns false) once `deadline` passes. Returns true when done() held.
template <typename Done>
bool poll_until(Done done, Clock::time_point start, Clock::duration give_up) {
  for (;;) {
    for (int i = 0; i < kPollsPerCheck; ++i) {
      if (done()) return true;
      cpu_relax();
    }
    const auto waited = Clock::now() - start;
    if (waited > give_up) return done();
    if (waited > kYieldAfter) sched_yield();
  }
}

// Claims a thread slot for job generation g: succeeds only if the slot was
// last claimed for an older job. A worker that read g and was then preempted
// while the caller finished g (and started later jobs) must not claim a later
// job's slot on g's behalf; generations are compared modulo 2^32.
bool claim(std::atomic<uint32_t>& slot, uint32_t g) {
  uint32_t cur = slot.load(std::memory_order_acquire);
  while (static_cast<int32_t>(cur - g) < 0)
    if (slot.compare_exchange_weak(cur, g, std::memory_order_acq_rel, std::memory_order_acquire)) return true;
  return false;
}

}  // namespace

int ThreadPool::default_threads() {
  // Count distinct (physical id, core id) pairs: SMT siblings share a core's
  // execution units, and these kernels saturate them with one thread.
  std::ifstream in("/proc/cpuinfo");
  std::set<std::pair<std::string, std::string>> cores;
  std::string line, phys = "0";
  while (std::getline(in, line)) {
    auto value = [&] { return line.substr(line.find(':') + 1); };
    if (line.rfind("physical id", 0) == 0) phys = value();
    if (line.rfind("core id", 0) == 0) cores.insert({phys, value()});
  }
  if (!cores.empty()) return static_cast<int>(cores.size());
  unsigned hw = std::thread::hardware_concurrency();
  return hw > 0 ? static_cast<int>(hw) : 1;
}

ThreadPool::ThreadPool(int n_threads)
    : n_threads_(n_threads > 0 ? n_threads : default_threads()), slots_(new Slot[n_threads_]) {
  for (int i = 1; i < n_threads_; ++i) threads_.emplace_back([this, i] { worker(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_.store(true);
    generation_.fetch_add(1);
  }
  cv_.notify_all();
  for (auto& t : threads_) t.join();
}

void ThreadPool::worker(int index) {
  uint64_t seen = 0;
  Clock::time_point idle_since = Clock::now();
  for (;;) {
    auto fresh = [&] { return generation_.load(std::memory_order_acquire) != seen; };
    if (!poll_until(fresh, idle_since, kHotPeriod)) {
      std::unique_lock<std::mutex> lock(mu_);
      // seq_cst pairs with the caller's bump-then-check in run(): either it
      // sees us counted here or we see its new generation below.
      sleepers_.fetch_add(1, std::memory_order_seq_cst);
      cv_.wait(lock, [&] { return generation_.load(std::memory_order_seq_cst) != seen; });
      sleepers_.fetch_sub(1, std::memory_order_relaxed);
    }
    seen = generation_.load(std::memory_order_acquire);
    if (stop_.load(std::memory_order_acquire)) return;
    const uint32_t g = static_cast<uint32_t>(seen);
    if (claim(slots_[index].claimed, g)) {
      (*job_)(index, n_threads_);
      pending_.fetch_sub(1, std::memory_order_acq_rel);
    }
    idle_since = Clock::now();
  }
}

void ThreadPool::wait_workers() {
  const auto start = Clock::now();
  poll_until([&] { return pending_.load(std::memory_order_acquire) == 0; }, start, Clock::duration::max());
}

void ThreadPool::run(FnRef<void(int, int)> fn) {
  if (n_threads_ == 1) {
    fn(0, 1);
    return;
  }
  job_ = &fn;
  pending_.store(n_threads_ - 1, std::memory_order_relaxed);
  const uint32_t g = static_cast<uint32_t>(generation_.fetch_add(1, std::memory_order_seq_cst) + 1);
  if (sleepers_.load(std::memory_order_seq_cst) > 0) {
    // Taking the lock orders the bump with a worker between its check and
    // its wait, so the notify cannot be lost.
    { std::lock_guard<std::mutex> lock(mu_); }
    cv_.notify_all();
  }
  fn(0, n_threads_);
  // Calls no worker has started yet are ours.
  for (int t = 1; t < n_threads_; ++t)
    if (claim(slots_[t].claimed, g)) {
      fn(t, n_threads_);
      pending_.fetch_sub(1, std::memory_order_acq_rel);
    }
  wait_workers();
  job_ = nullptr;
}

void ThreadPool::parallel_chunks(int64_t n, int64_t grain, FnRef<void(int, int64_t, int64_t)> fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  const int64_t per = (n + n_threads_ * kChunksPerThread - 1) / (n_threads_ * kChunksPerThread);
  const int64_t chunk = std::max(grain, per);
  const int64_t n_chunks = (n + chunk - 1) / chunk;
  if (n_chunks <= 1 || n_threads_ == 1) {
    fn(0, 0, n);
    return;
  }
  next_.store(0, std::memory_order_relaxed);
  run([&](int t, int) {
    for (;;) {
      const int64_t c = next_.fetch_add(1, std::memory_order_relaxed);
      if (c >= n_chunks) return;
      fn(t, c * chunk, std::min(n, (c + 1) * chunk));
    }
  });
}

void ThreadPool::parallel_chunks_guided(int64_t n, int64_t grain, FnRef<void(int, int64_t, int64_t)> fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  if (n <= grain || n_threads_ == 1) {
    fn(0, 0, n);
    return;
  }
  next_.store(0, std::memory_order_relaxed);
  run([&](int t, int nt) {
    int64_t b = next_.load(std::memory_order_relaxed);
    for (;;) {
      int64_t e;
      do {
        if (b >= n) return;
        e = std::min(n, b + std::max(grain, (n - b) / (2 * nt)));
      } while (!next_.compare_exchange_weak(b, e, std::memory_order_relaxed));
      fn(t, b, e);
      b = next_.load(std::memory_order_relaxed);
    }
  });
}

void ThreadPool::parallel_for(int64_t n, int64_t grain, FnRef<void(int64_t, int64_t)> fn) {
  parallel_chunks(n, grain, [&](int, int64_t b, int64_t e) { fn(b, e); });
}

}  // namespace tandem

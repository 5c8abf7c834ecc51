// A persistent fork-join pool. A forward pass runs ~10 parallel loops per
// layer, each only tens of microseconds long in decode, so the fork/join
// itself must cost well under a microsecond: workers stay hot (spinning on a
// counter) for a while after each job and only then sleep; a job is a
// non-owning function reference, so starting one allocates nothing.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

namespace tandem {

// A non-owning reference to a callable: two words, no allocation, no copy of
// the callable. The callable must outlive the call it is passed to (a lambda
// argument does: it lives until the end of the full expression).
template <typename Sig>
class FnRef;

template <typename R, typename... Args>
class FnRef<R(Args...)> {
 public:
  template <typename F>
    requires(!std::is_same_v<std::remove_cvref_t<F>, FnRef> && std::is_invocable_r_v<R, F&, Args...>)
  FnRef(F&& f)  // NOLINT(google-explicit-constructor): used like std::function
      : obj_(const_cast<void*>(static_cast<const void*>(std::addressof(f)))),
        call_([](void* o, Args... a) -> R { return (*static_cast<std::remove_reference_t<F>*>(o))(std::forward<Args>(a)...); }) {}
  R operator()(Args... a) const { return call_(obj_, std::forward<Args>(a)...); }

 private:
  void* obj_;
  R (*call_)(void*, Args...);
};

class ThreadPool {
 public:
  explicit ThreadPool(int n_threads);  // n_threads <= 0: physical cores
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }

  // Calls fn(t, n_threads) exactly once for every t in [0, n_threads) and
  // returns when all calls are done. The caller runs t = 0, worker t the
  // rest; a worker that has not picked up its call by the time the caller
  // is free (preempted, asleep) has it run by the caller instead, so one
  // descheduled thread cannot stall the pool. Not reentrant: fn must not
  // call run or the parallel loops of the same pool.
  void run(FnRef<void(int, int)> fn);

  // Calls fn(begin, end) on contiguous, disjoint ranges that cover [0, n),
  // each at least `grain` long (but the last), in parallel. Ranges are handed
  // out dynamically, so a thread the OS preempts does not hold the others up;
  // a thread may get several ranges. Results must therefore not depend on
  // which thread runs a range (they cannot: fn does not learn it).
  void parallel_for(int64_t n, int64_t grain, FnRef<void(int64_t, int64_t)> fn);

  // As parallel_for, with the thread index for per-thread scratch:
  // fn(thread, begin, end), thread in [0, size()).
  void parallel_chunks(int64_t n, int64_t grain, FnRef<void(int, int64_t, int64_t)> fn);

  // As parallel_chunks, but the ranges taper: each claim takes 1/(2 x
  // threads) of what is left (at least `grain`), so the threads stream long
  // contiguous runs first and finish within one small range of each other.
  // The range boundaries depend on timing: fn's result for an index must not
  // depend on the range it came in (true of matmul tiles, whose outputs are
  // disjoint and computed alike whatever range holds them).
  void parallel_chunks_guided(int64_t n, int64_t grain, FnRef<void(int, int64_t, int64_t)> fn);

  static int default_threads();  // physical cores

 private:
  void worker(int index);
  void wait_workers();

  int n_threads_;
  std::vector<std::thread> threads_;
  // Written by the caller before the generation bump that publishes it.
  FnRef<void(int, int)>* job_ = nullptr;

  // Each on its own cache line: workers poll generation_, the caller polls
  // pending_, chunk claims hit next_.
  alignas(64) std::atomic<uint64_t> generation_{0};
  alignas(64) std::atomic<int> pending_{0};
  alignas(64) std::atomic<int64_t> next_{0};
  alignas(64) std::atomic<int> sleepers_{0};
  // Per thread slot: the low 32 bits of the generation whose call it last
  // claimed; the worker and the caller race to claim it, once per job.
  struct alignas(64) Slot {
    std::atomic<uint32_t> claimed{0};
  };
  std::unique_ptr<Slot[]> slots_;
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::condition_variable cv_;
};

}  // namespace tandem

// The thread pool under the products and every other parallel loop: each thread
// slot runs exactly once per job, parallel loops cover their range exactly
// once in contiguous pieces, per-slot scratch is never shared, workers that
// went to sleep are woken, and many back-to-back jobs neither lose nor
// repeat work.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <random>
#include <thread>
#include <vector>

#include "runtime/thread_pool.h"

namespace tandem {
namespace {

// Many tiny jobs, more threads than cores: workers are often preempted
// between seeing a job and claiming their slot, and the caller runs their
// calls instead; a late worker must not run a later job's slot.
TEST(ThreadPool, RunCallsEverySlotOnce) {
  constexpr int kJobs = 20000;
  for (int threads : {1, 2, 3, 5}) {
    ThreadPool pool(threads);
    EXPECT_EQ(pool.size(), threads);
    std::vector<std::atomic<int>> calls(threads);
    for (int job = 0; job < kJobs; ++job) {
      std::atomic<int> in_job{0};
      pool.run([&](int t, int n) {
        ASSERT_EQ(n, threads);
        ASSERT_GE(t, 0);
        ASSERT_LT(t, n);
        calls[t].fetch_add(1);
        in_job.fetch_add(1);
      });
      // run returns only after every call finished.
      ASSERT_EQ(in_job.load(), threads) << "job " << job;
    }
    for (int t = 0; t < threads; ++t) EXPECT_EQ(calls[t].load(), kJobs) << "slot " << t;
  }
}

TEST(ThreadPool, ParallelForCoversRangeOnceInGrains) {
  std::mt19937 rng(1);
  for (int threads : {1, 2, 3}) {
    ThreadPool pool(threads);
    for (int trial = 0; trial < 300; ++trial) {
      const int64_t n = rng() % 3000, grain = 1 + rng() % 40;
      std::vector<std::atomic<int>> hit(n);
      std::atomic<int64_t> short_ranges{0};
      pool.parallel_for(n, grain, [&](int64_t b, int64_t e) {
        ASSERT_LE(0, b);
        ASSERT_LT(b, e);
        ASSERT_LE(e, n);
        if (e - b < grain && e != n) short_ranges.fetch_add(1);
        for (int64_t i = b; i < e; ++i) hit[i].fetch_add(1);
      });
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hit[i].load(), 1) << "n=" << n << " grain=" << grain << " i=" << i;
      EXPECT_EQ(short_ranges.load(), 0) << "a range shorter than the grain that is not the last";
    }
  }
}

TEST(ThreadPool, ParallelChunksNeverShareASlot) {
  ThreadPool pool(3);
  std::vector<std::atomic<int>> busy(pool.size());
  std::atomic<int64_t> covered{0};
  for (int job = 0; job < 500; ++job) {
    pool.parallel_chunks(997, 3, [&](int t, int64_t b, int64_t e) {
      ASSERT_GE(t, 0);
      ASSERT_LT(t, pool.size());
      ASSERT_EQ(busy[t].fetch_add(1), 0) << "slot " << t << " in use twice at once";
      covered.fetch_add(e - b);
      busy[t].fetch_sub(1);
    });
  }
  EXPECT_EQ(covered.load(), 997 * 500);
}

// The tapering ranges cover [0, n) once, never shorter than the grain but at
// the end, each no longer than 1/(2 x threads) of what was left (but the
// grain), and never run on one slot twice at once.
TEST(ThreadPool, GuidedChunksTaperAndCoverOnce) {
  std::mt19937 rng(2);
  for (int threads : {1, 2, 3}) {
    ThreadPool pool(threads);
    std::vector<std::atomic<int>> busy(pool.size());
    for (int trial = 0; trial < 300; ++trial) {
      const int64_t n = rng() % 3000, grain = 1 + rng() % 40;
      std::vector<std::atomic<int>> hit(n);
      std::atomic<int64_t> bad{0};
      pool.parallel_chunks_guided(n, grain, [&](int t, int64_t b, int64_t e) {
        ASSERT_EQ(busy[t].fetch_add(1), 0) << "slot " << t << " in use twice at once";
        ASSERT_LE(0, b);
        ASSERT_LT(b, e);
        ASSERT_LE(e, n);
        const bool whole = threads == 1 || n <= grain;
        if (!whole && e - b > std::max(grain, (n - b) / (2 * threads))) bad.fetch_add(1);
        if (e - b < grain && e != n) bad.fetch_add(1);
        for (int64_t i = b; i < e; ++i) hit[i].fetch_add(1);
        busy[t].fetch_sub(1);
      });
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hit[i].load(), 1) << "n=" << n << " grain=" << grain << " i=" << i;
      EXPECT_EQ(bad.load(), 0) << "n=" << n << " grain=" << grain;
    }
  }
}

// Workers sleep after an idle spell longer than their hot period; the next
// job must wake them (a lost wake-up would hang here).
TEST(ThreadPool, WakesSleepingWorkers) {
  ThreadPool pool(2);
  for (int round = 0; round < 3; ++round) {
    std::this_thread::sleep_for(std::chrono::milliseconds(60));
    std::atomic<int> calls{0};
    pool.run([&](int, int) { calls.fetch_add(1); });
    EXPECT_EQ(calls.load(), 2);
  }
}

// A job that keeps one slot busy: the others still all run, once.
TEST(ThreadPool, UnevenSlotsStillRunOnce) {
  ThreadPool pool(2);
  for (int job = 0; job < 20; ++job) {
    std::atomic<int> calls{0};
    pool.run([&](int t, int) {
      if (t == job % 2) std::this_thread::sleep_for(std::chrono::microseconds(300));
      calls.fetch_add(1);
    });
    EXPECT_EQ(calls.load(), 2);
  }
}

TEST(ThreadPool, FnRefCallsTheReferencedCallable) {
  int hits = 0;
  std::vector<int> big(100, 1);  // a capture larger than any small-buffer optimisation
  auto f = [&, big](int x) { hits += x + big[99]; };
  FnRef<void(int)> r = f;
  r(2);
  r(3);
  EXPECT_EQ(hits, 7);
}

}  // namespace
}  // namespace tandem

// A ring buffer of the last forward steps: when each ran, how many rows, and
// which phase. Reports and metrics read from it instead of timing ad hoc.
#pragma once

#include <chrono>
#include <cstdint>
#include <vector>

namespace tandem {

enum class Phase { kPrefill, kDecode, kMixed };
inline const char* phase_name(Phase p) {
  switch (p) {
    case Phase::kPrefill: return "prefill";
    case Phase::kDecode: return "decode";
    case Phase::kMixed: return "mixed";
  }
  return "?";
}

struct StepRecord {
  Phase phase = Phase::kDecode;
  double start_s = 0;   // seconds since the log was created
  double end_s = 0;
  int32_t rows = 0;     // tokens in the batch
  int32_t seqs = 0;     // sequences in the batch
};

class StepLog {
 public:
  explicit StepLog(size_t capacity = 4096) : ring_(capacity) {}

  double now() const { return std::chrono::duration<double>(Clock::now() - t0_).count(); }
  void add(const StepRecord& r) {
    ring_[count_ % ring_.size()] = r;
    ++count_;
  }
  uint64_t count() const { return count_; }
  // The i-th most recent record (0 = newest); i < min(count, capacity).
  const StepRecord& recent(size_t i) const { return ring_[(count_ - 1 - i) % ring_.size()]; }
  size_t available() const { return count_ < ring_.size() ? count_ : ring_.size(); }

 private:
  using Clock = std::chrono::steady_clock;
  Clock::time_point t0_ = Clock::now();
  std::vector<StepRecord> ring_;
  uint64_t count_ = 0;
};

}  // namespace tandem

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

// One engine step as the live timeline shows it: which requests had rows in
// it (prompt rows and decode rows), who arrived and who ended since the step
// before, and the preemptions it took.
struct StepReport {
  uint64_t step = 0;
  double start_s = 0;   // the forward pass, seconds since the engine started
  double end_s = 0;
  Phase phase = Phase::kDecode;
  int32_t rows = 0;
  struct Part {
    uint64_t request = 0;
    int32_t choice = 0;
    int32_t prompt_rows = 0;
    int32_t decode_rows = 0;  // a decoding sequence's rows: its token and its drafts
  };
  std::vector<Part> parts;
  std::vector<std::pair<uint64_t, double>> arrived;         // request, when it arrived
  std::vector<std::pair<uint64_t, std::string>> finished;   // request, its finish reason
  int32_t preempted = 0;
};

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

// The machine's ceilings for the roofline, measured with the microbenchmarks
// and cached per (CPU model, thread count, kernel level), since the full
// measurement reads a 1 GiB buffer several times and that is not worth
// repeating on every `tandem bench`.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json_fwd.hpp>

#include "perf/microbench.h"

namespace tandem {

struct RooflineSizes {
  size_t read_bytes = size_t{1} << 30;  // >> any last-level cache
  int read_passes = 5;
  int64_t compute_iters = 20'000'000;   // per thread per trial (~50 ms at AVX-512 rates)
  int compute_trials = 3;

  static RooflineSizes full() { return {}; }
  // A rough measurement for a bench run that has no cached one. Five short
  // compute trials, the best kept: with two, a core busy elsewhere for a
  // moment could halve a peak.
  static RooflineSizes quick() { return {size_t{256} << 20, 3, 5'000'000, 5}; }
};

struct Roofline {
  std::string cpu;           // /proc/cpuinfo "model name"
  int threads = 0;
  std::string kernel_level;  // the level whose instructions were measured
  std::string source;        // "measured", "cached" or "quick"
  std::string measured_at;   // UTC, ISO 8601
  size_t read_bytes = 0;     // buffer size of the bandwidth measurement
  PeakMeasure read_gb_s;     // GB/s (1e9 bytes)
  PeakMeasure fp32_gop_s;    // G floating-point operations/s (FMA = 2)
  PeakMeasure int8_gop_s;    // G integer operations/s (multiply-add = 2)
  PeakMeasure bf16_gop_s;    // G floating-point operations/s
};

// Runs all four microbenchmarks on the pool's threads. source = "measured".
Roofline measure_roofline(ThreadPool& pool, const RooflineSizes& sizes, KernelLevel level);

nlohmann::json roofline_to_json(const Roofline& r);
// Throws tandem::Error (kInvalidFile) naming a missing or mistyped field.
Roofline roofline_from_json(const nlohmann::json& j);

std::string cpu_model_name();
// The cached entry for this CPU, thread count and level (source = "cached");
// nullopt when the file is absent, unreadable or has none.
std::optional<Roofline> load_cached_roofline(const std::string& path, const std::string& cpu, int threads,
                                             const std::string& kernel_level);
// Adds or replaces the entry with r's key. Throws kIo when the file cannot be written.
void save_roofline(const std::string& path, const Roofline& r);

// The ceilings a bench run compares against, at the active kernel level:
// `measure` runs the full microbenchmarks and stores them in the cache
// (a cache that cannot be written only adds a line to `warning`); otherwise
// the cached entry, else a quick measurement (source = "quick", not cached).
Roofline roofline_for_bench(int threads, bool measure, const std::string& cache_path, std::string& warning);

}  // namespace tandem

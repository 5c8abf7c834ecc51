// `tandem bench`: prefill and decode speed of one model, measured apart.
//
// Each repetition sends B requests (B = 1 unless --batch) of the same P
// fixed prompt tokens to the serving engine at once: its first step computes
// every prompt, the next N steps decode all B together, one greedy token each
// (end-of-generation ignored). Every time is of the engine's own steps,
// scheduling and sampling included: what serving B running requests costs.
// The prompt ids are chosen in advance and the greedy continuation is fixed
// by the model, so every run does identical work, and another engine can be
// given the very same ids (BenchResult::tokens).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "runtime/options.h"
#include "engine/speculation.h"
#include "kv/kv_cache.h"
#include "perf/model_cost.h"
#include "perf/roofline.h"

namespace tandem {

class Model;

struct BenchOptions {
  std::string model_path;
  int32_t n_prompt = 512;
  int32_t n_gen = 128;
  int32_t threads = 0;  // 0: physical cores
  int32_t reps = 5;
  int32_t warmup = 1;   // untimed repetitions first (page-in, caches, thread spin-up)
  int32_t batch = 1;    // sequences decoding together (rows per decode step)
  RuntimeOptions runtime;  // what Model::load gets (prepack, repack cache, kernels, ...)
  // A text whose tokens are the prompt (cycled to P tokens) instead of ids
  // drawn from the vocabulary: what speculation needs to find anything.
  std::string prompt_file;
  SpecConfig spec;               // speculative decoding of the decode steps
  std::string draft_model;       // for SpecMode::kDraft
  std::string device = "cpu";    // model/executor.h
  KvCacheTypes kv_cache = {};    // kv/kv_cache.h
  // A KV store folder (engine/kv_store.h): each repetition starts with the
  // in-memory prefix cache cleared, so its prefill brings the prompt's blocks
  // from the store (written by the warm-up, or an earlier run) and computes
  // only what is not there.
  std::string kv_store;
  int64_t kv_store_bytes = int64_t{4} << 30;
};

struct Stats {
  double median = 0, min = 0, max = 0;
  static Stats of(std::vector<double> v);  // all 0 for an empty vector
};

struct BenchResult {
  BenchOptions opts;
  std::string model_name, arch;
  uint64_t file_bytes = 0;
  int threads = 0;
  std::string kernel_level;
  double load_s = 0;    // map + bind + tokenizer + thread pool + KV cache allocation
  bool repack_cache_hit = false;  // the repacked weights were mapped from --repack-cache
  double warmup_s = 0;  // the untimed repetitions (the first touches every weight page)
  std::vector<double> prefill_s, decode_s;  // wall seconds per repetition
  // Process CPU seconds per repetition (every thread, spinning included): with
  // one thread a measure that other processes on the machine barely disturb.
  std::vector<double> prefill_cpu_s, decode_cpu_s;
  Stats prefill_tok_s, decode_tok_s;  // tokens of all sequences per second
  // After each repetition's decode, a plain read of the very bytes decode
  // streams (Model::decode_weight_regions), in GB/s: the machine's read
  // bandwidth at that moment, for these pages. This machine's bandwidth
  // drifts by 1.5x within minutes, so a ceiling measured apart says little.
  std::vector<double> read_gb_s_beside;
  std::vector<double> decode_frac_beside;  // each repetition's decode GB/s over its read
  // Where the forward passes ran (Engine::device()). On a GPU the reads
  // beside are not made; instead its memory's read bandwidth is measured
  // once after the repetitions (cuda_read_bandwidth_gb_s, 4 GiB).
  std::string device = "cpu";
  double device_read_gb_s = 0;
  uint64_t peak_rss_bytes = 0;  // getrusage high-water mark, whole process
  uint64_t kv_cache_bytes = 0;
  KvCacheTypes kv_cache = {};
  ModelCost cost;
  std::vector<int32_t> tokens;  // P prompt ids, then the N ids the decode steps fed (the first request's)
  // Speculation, over the timed repetitions: drafted and kept tokens, and
  // the decode tokens per sequence-step.
  uint64_t spec_drafted = 0, spec_accepted = 0;
  double tokens_per_step = 0;
};

// Valid ids for a benchmark prompt: `count` ids drawn deterministically from
// the vocabulary's normal tokens (no control, BOS/EOS/end-of-generation,
// unused or byte tokens). Throws when the vocabulary has no such token.
std::vector<int32_t> bench_tokens(const Model& m, int64_t count);
// The first `count` tokens of a text file (BOS first), cycled when it is shorter.
std::vector<int32_t> text_tokens(const Model& m, const std::string& path, int64_t count);

// Loads the model, runs the warm-up and the repetitions; the model is
// released before returning. Throws tandem::Error on bad options or files.
BenchResult run_bench(const BenchOptions& opts);

// Roofline fractions of a result against the machine's ceilings.
struct RooflineUse {
  double decode_gb_s = 0;        // weight bytes per token * median decode tok/s
  double decode_frac = 0;        // of the read bandwidth
  double read_gb_s_beside = 0;   // median of BenchResult::read_gb_s_beside
  Stats decode_frac_beside;      // of the reads beside each repetition
  double prefill_gop_s = 0;      // 2 * prefill MACs / median prefill time
  double prefill_peak_gop_s = 0; // the peak of the model's compute family
  std::string prefill_peak_isa;
  double prefill_frac = 0;
};
RooflineUse roofline_use(const BenchResult& r, const Roofline& roof);

// A GPU run against its card: decode GB/s (weight bytes per step x steps/s)
// over the measured read bandwidth; prefill TFLOPS (2 x the prefill's
// multiply-adds / time) over a peak (dense bf16 by the datasheet).
struct DeviceUse {
  double decode_gb_s = 0, decode_frac = 0;
  double prefill_tflops = 0, prefill_peak_tflops = 0, prefill_frac = 0;
};
// H100 / H200 SXM: 989.4 dense bf16 TFLOPS by NVIDIA's datasheet.
inline constexpr double kH200DenseBf16Tflops = 989.4;
DeviceUse device_use(const BenchResult& r, double peak_tflops = kH200DenseBf16Tflops);

// The one JSON object `tandem bench --json` prints.
nlohmann::json bench_to_json(const BenchResult& r, const Roofline& roof);

}  // namespace tandem

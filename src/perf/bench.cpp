#include "perf/bench.h"

#include <sys/resource.h>
#include <time.h>

#include <algorithm>
#include <cstdio>
#include <chrono>
#include <fstream>
#include <numeric>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "runtime/thread_pool.h"
#include "gguf/gguf.h"
#include "kernels/vec_dot.h"
#include "kernels/vec_dot_impl.h"
#include "engine/llm_engine.h"
#include "kv/kv_cache.h"
#include "model/executor.h"
#include "model/model.h"
#include "perf/microbench.h"
#include "tokenizer/tokenizer.h"

namespace tandem {
namespace {

constexpr int32_t kBlockSize = 16;

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

uint64_t peak_rss_bytes() {
  rusage ru{};
  if (getrusage(RUSAGE_SELF, &ru) != 0) return 0;
  return static_cast<uint64_t>(ru.ru_maxrss) * 1024;  // Linux reports KiB
}

void check_options(const BenchOptions& o) {
  if (o.n_prompt < 1) fail(ErrorKind::kInvalidArgument, "bench: -p (prompt tokens) must be at least 1, got {}", o.n_prompt);
  if (o.n_gen < 0) fail(ErrorKind::kInvalidArgument, "bench: -n (decode steps) must not be negative, got {}", o.n_gen);
  if (o.reps < 1) fail(ErrorKind::kInvalidArgument, "bench: --reps must be at least 1, got {}", o.reps);
  if (o.warmup < 0) fail(ErrorKind::kInvalidArgument, "bench: --warmup must not be negative, got {}", o.warmup);
  if (o.threads < 0) fail(ErrorKind::kInvalidArgument, "bench: --threads must not be negative, got {}", o.threads);
  if (o.batch < 1 || o.batch > 1024)
    fail(ErrorKind::kInvalidArgument, "bench: --batch must be between 1 and 1024, got {}", o.batch);
  // A streaming window stops a prompt's chunk where it evicts; the prefill
  // is timed as one step.
  const int64_t most = stream_positions(o.kv_cache, kBlockSize);
  if (most > 0 && o.n_prompt > most)
    fail(ErrorKind::kInvalidArgument,
         "bench: a prompt of {} tokens does not run in one step through a streaming window of {} positions ({} with "
         "the sinks, heavy hitters and a block): use -p {} or less",
         o.n_prompt, o.kv_cache.window, most, most);
}

// Process CPU time (all threads). With one thread it is the time the work
// itself took, whatever else the machine runs, which wall time is not.
double cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

struct RepTimes {
  double prefill_s, decode_s, prefill_cpu_s, decode_cpu_s;
  std::vector<int32_t> generated;  // the first sequence's tokens
};

// One repetition on the serving engine: B requests of the same P-token
// prompt arrive together; the first step computes every prompt (and samples
// each first token), the next N steps decode all B together, greedily.
RepTimes one_rep(Engine& e, const std::vector<int32_t>& prompt, int32_t N, int32_t B, bool store) {
  if (store) {
    // The prompt from the store, not from the last repetition's cache: the
    // reset happens between steps, so one idle step carries it out.
    e.reset_prefix_cache();
    e.step();
  }
  RequestParams p;
  p.sampling.temperature = 0;
  p.max_tokens = N + 1;  // the prefill's token, then one per decode step
  p.stop_at_eog = false;
  RepTimes t{};
  std::vector<std::vector<int32_t>> out(static_cast<size_t>(B));
  for (int32_t b = 0; b < B; ++b)
    e.submit(prompt, p, [&out, b](const RequestEvent& ev) {
      out[b].insert(out[b].end(), ev.tokens.begin(), ev.tokens.end());
    });
  const uint64_t before = e.metrics().generation_tokens;
  double c0 = cpu_seconds();
  auto t0 = Clock::now();
  e.step();
  t.prefill_s = since(t0);
  t.prefill_cpu_s = cpu_seconds() - c0;
  if (e.metrics().generation_tokens - before != static_cast<uint64_t>(B))
    fail(ErrorKind::kResource, "bench: the {} prompts did not run in one engine step", B);
  c0 = cpu_seconds();
  t0 = Clock::now();
  while (e.step()) {
  }
  t.decode_s = since(t0);
  t.decode_cpu_s = cpu_seconds() - c0;
  out[0].resize(std::min<size_t>(out[0].size(), static_cast<size_t>(N)));  // the last token is never fed back
  t.generated = std::move(out[0]);
  if (store) e.flush_kv_store();  // every block on disk before the next repetition reads it
  return t;
}

}  // namespace

Stats Stats::of(std::vector<double> v) {
  Stats s;
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  s.min = v.front();
  s.max = v.back();
  s.median = n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
  return s;
}

std::vector<int32_t> text_tokens(const Model& m, const std::string& path, int64_t count) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(ErrorKind::kIo, "bench: cannot read the prompt file {}", path);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::vector<int32_t> ids = m.tokenizer().encode(ss.str(), true, false);
  if (ids.size() < 2) fail(ErrorKind::kInvalidArgument, "bench: the prompt file {} has no text", path);
  std::vector<int32_t> out;
  while (static_cast<int64_t>(out.size()) < count) out.push_back(ids[out.size() % ids.size()]);
  return out;
}

std::vector<int32_t> bench_tokens(const Model& m, int64_t count) {
  const Tokenizer& tok = m.tokenizer();
  const int32_t V = tok.n_vocab();
  const auto types = m.file().get_int_array("tokenizer.ggml.token_type");
  m.file().release_metadata_pages();  // read from the mapping: not part of the measured memory
  auto usable = [&](int32_t id) {
    if (id == tok.bos_id() || id == tok.eos_id() || tok.is_eog(id)) return false;
    if (types && static_cast<int64_t>(types->size()) == V)
      return (*types)[id] == static_cast<int64_t>(TokenType::kNormal);
    return !tok.token_to_piece(id, false).empty();  // control tokens render as ""
  };
  // A stride coprime with V visits every id once per cycle, spread over the
  // vocabulary rather than clustered at its start.
  int64_t stride = 7919;
  while (std::gcd(stride, static_cast<int64_t>(V)) != 1) ++stride;
  std::vector<int32_t> out;
  out.reserve(count);
  int64_t id = V / 3, misses = 0;
  while (static_cast<int64_t>(out.size()) < count) {
    id = (id + stride) % V;
    if (usable(static_cast<int32_t>(id))) {
      out.push_back(static_cast<int32_t>(id));
      misses = 0;
    } else if (++misses > V) {
      fail(ErrorKind::kInvalidArgument, "bench: the vocabulary of {} has no normal (non-special) token",
           m.file().path());
    }
  }
  return out;
}

BenchResult run_bench(const BenchOptions& opts) {
  check_options(opts);
  BenchResult r;
  r.opts = opts;
  const int32_t P = opts.n_prompt, N = opts.n_gen, B = opts.batch;

  const auto t0 = Clock::now();
  // A GPU reads the file's layout: no repacked copy in host memory.
  const bool cpu = opts.device == "cpu";
  RuntimeOptions runtime = opts.runtime;
  if (!cpu) runtime.prepack = PrepackMode::kOff;
  std::unique_ptr<Model> model = Model::load(opts.model_path, runtime);
  if (!model->load_warning().empty()) std::fprintf(stderr, "warning: %s\n", model->load_warning().c_str());
  const ModelConfig& c = model->config();
  if (static_cast<int64_t>(P) + N >= c.n_ctx_train)
    fail(ErrorKind::kInvalidArgument, "bench: -p {} plus -n {} leaves no room in the model's training context of {} tokens",
         P, N, c.n_ctx_train);
  // The serving engine, sized for this run: B sequences of P + N + 1 tokens,
  // every prompt in one step, no prefix sharing between the B equal prompts.
  EngineConfig ec;
  ec.threads = opts.threads;
  ec.max_context = P + N + 1;
  ec.kv_tokens = int64_t{B} * ((int64_t{P} + N + 1 + kBlockSize - 1) / kBlockSize * kBlockSize);
  ec.block_size = kBlockSize;
  ec.max_seqs = B;
  ec.max_waiting = B;
  ec.policy = SchedulePolicy::kThroughput;
  ec.max_batch_tokens = B * P;
  ec.prefix_caching = !opts.kv_store.empty();  // a store's blocks enter through the prefix cache
  ec.kv_store = opts.kv_store;
  ec.kv_store_bytes = opts.kv_store_bytes;
  ec.spec = opts.spec;
  ec.device = opts.device;
  ec.memory_available = opts.runtime.memory_available;
  ec.kv_cache = opts.kv_cache;
  std::unique_ptr<Model> draft;
  if (!opts.draft_model.empty())
    draft = Model::load(opts.draft_model, opts.runtime);
  Engine engine(*model, ec, draft.get());
  r.load_s = since(t0);
  r.repack_cache_hit = model->repack_cache_hit();

  r.model_name = c.name;
  r.arch = c.arch_name;
  r.file_bytes = model->file().file_size();
  r.threads = engine.threads();
  r.kernel_level = cpu_kernel_level();
  r.kv_cache_bytes = engine.kv_bytes();
  r.kv_cache = ec.kv_cache;
  r.cost = model_cost(*model);
  const std::vector<int32_t> prompt = opts.prompt_file.empty() ? bench_tokens(*model, P) : text_tokens(*model, opts.prompt_file, P);

  const auto tw = Clock::now();
  for (int32_t i = 0; i < opts.warmup; ++i) one_rep(engine, prompt, N, B, !opts.kv_store.empty());
  r.warmup_s = since(tw);

  ThreadPool& read_pool = engine.compute_pool();
  const auto regions = model->decode_weight_regions();
  std::vector<double> prefill_tps, decode_tps;
  const MetricsSnapshot before = engine.metrics();
  for (int32_t i = 0; i < opts.reps; ++i) {
    const RepTimes t = one_rep(engine, prompt, N, B, !opts.kv_store.empty());
    if (r.tokens.empty()) {
      r.tokens = prompt;
      r.tokens.insert(r.tokens.end(), t.generated.begin(), t.generated.end());
    }
    if (N > 0 && cpu) {
      const double read = measure_read_bandwidth_of(read_pool, regions, 2, active_kernel_level()).value;
      const double decode = static_cast<double>(r.cost.decode_weight_bytes) * N / t.decode_s / 1e9;
      r.read_gb_s_beside.push_back(read);
      r.decode_frac_beside.push_back(decode / read);
    }
    r.prefill_s.push_back(t.prefill_s);
    r.decode_s.push_back(t.decode_s);
    r.prefill_cpu_s.push_back(t.prefill_cpu_s);
    r.decode_cpu_s.push_back(t.decode_cpu_s);
    prefill_tps.push_back(double(B) * P / t.prefill_s);
    if (N > 0) decode_tps.push_back(double(B) * N / t.decode_s);
  }
  const MetricsSnapshot after = engine.metrics();
  r.spec_drafted = after.spec_drafted - before.spec_drafted;
  r.spec_accepted = after.spec_accepted - before.spec_accepted;
  const uint64_t decode_steps = after.phases[static_cast<size_t>(Phase::kDecode)].steps -
                                before.phases[static_cast<size_t>(Phase::kDecode)].steps;
  if (decode_steps > 0) r.tokens_per_step = double(N) * opts.reps / double(decode_steps);
  r.prefill_tok_s = Stats::of(prefill_tps);
  r.decode_tok_s = Stats::of(decode_tps);
  r.device = engine.device();
  if (!cpu) r.device_read_gb_s = cuda_read_bandwidth_gb_s(size_t{4} << 30);
  r.peak_rss_bytes = peak_rss_bytes();
  return r;
}

RooflineUse roofline_use(const BenchResult& r, const Roofline& roof) {
  RooflineUse u;
  // A decode step reads the weights once for all B rows.
  u.decode_gb_s = static_cast<double>(r.cost.decode_weight_bytes) * r.decode_tok_s.median / r.opts.batch / 1e9;
  u.decode_frac = roof.read_gb_s.value > 0 ? u.decode_gb_s / roof.read_gb_s.value : 0;
  u.read_gb_s_beside = Stats::of(r.read_gb_s_beside).median;
  u.decode_frac_beside = Stats::of(r.decode_frac_beside);
  const int64_t P = r.opts.n_prompt;
  // Median time per prefill = P / median tok/s.
  if (r.prefill_tok_s.median > 0)
    u.prefill_gop_s = 2.0 * static_cast<double>(r.cost.prefill_macs(P)) * r.prefill_tok_s.median / P / 1e9;
  const PeakMeasure& peak = r.cost.family == ComputeFamily::kInt8   ? roof.int8_gop_s
                            : r.cost.family == ComputeFamily::kBf16 ? roof.bf16_gop_s
                                                                    : roof.fp32_gop_s;
  u.prefill_peak_gop_s = peak.value;
  u.prefill_peak_isa = peak.isa;
  u.prefill_frac = peak.value > 0 ? u.prefill_gop_s / peak.value : 0;
  return u;
}

DeviceUse device_use(const BenchResult& r, double peak_tflops) {
  DeviceUse u;
  u.decode_gb_s = static_cast<double>(r.cost.decode_weight_bytes) * r.decode_tok_s.median / r.opts.batch / 1e9;
  u.decode_frac = r.device_read_gb_s > 0 ? u.decode_gb_s / r.device_read_gb_s : 0;
  const int64_t P = r.opts.n_prompt;
  // The B prompts of a repetition run in one step: B * P tokens.
  if (r.prefill_tok_s.median > 0)
    u.prefill_tflops = 2.0 * static_cast<double>(r.cost.prefill_macs(P)) * r.prefill_tok_s.median / P / 1e12;
  u.prefill_peak_tflops = peak_tflops;
  u.prefill_frac = u.prefill_tflops / peak_tflops;
  return u;
}

nlohmann::json bench_to_json(const BenchResult& r, const Roofline& roof) {
  const RooflineUse u = roofline_use(r, roof);
  const ModelCost& mc = r.cost;
  const int64_t P = r.opts.n_prompt, N = r.opts.n_gen;
  nlohmann::json j = {
      {"model", r.opts.model_path},
      {"model_name", r.model_name},
      {"arch", r.arch},
      {"model_type", mc.file_type.empty() ? std::string(type_traits(mc.main_type).name) : mc.file_type},
      {"weight_type_main", std::string(type_traits(mc.main_type).name)},
      {"weight_type_prefill", std::string(type_traits(mc.prefill_type).name)},
      {"weight_bytes_by_type", mc.bytes_by_type},
      {"file_bytes", r.file_bytes},
      {"threads", r.threads},
      {"kernels", r.kernel_level},
      {"n_prompt", P},
      {"n_gen", N},
      {"batch", r.opts.batch},
      {"prepack", prepack_mode_name(r.opts.runtime.prepack)},
      {"reps", r.opts.reps},
      {"warmup", r.opts.warmup},
      {"load_s", r.load_s},
      {"repack_cache_hit", r.repack_cache_hit},
      {"warmup_s", r.warmup_s},
      {"prefill_tok_s", r.prefill_tok_s.median},
      {"prefill_tok_s_min", r.prefill_tok_s.min},
      {"prefill_tok_s_max", r.prefill_tok_s.max},
      {"decode_tok_s", r.decode_tok_s.median},
      {"decode_tok_s_min", r.decode_tok_s.min},
      {"decode_tok_s_max", r.decode_tok_s.max},
      {"prefill_s", r.prefill_s},
      {"decode_s", r.decode_s},
      {"prefill_cpu_s", r.prefill_cpu_s},
      {"decode_cpu_s", r.decode_cpu_s},
      {"peak_rss_bytes", r.peak_rss_bytes},
      {"kv_cache_bytes", r.kv_cache_bytes},
      {"kv_type", kv_format_name(kv_format(r.kv_cache))},
      {"decode_weight_bytes_per_token", mc.decode_weight_bytes},
      {"decode_kv_bytes_per_token", mc.kv_read_bytes_per_step(P, N, kv_bytes(r.kv_cache.k, kKvGroup) / double(kKvGroup),
                                                         kv_bytes(r.kv_cache.v, kKvGroup) / double(kKvGroup))},
      {"decode_gb_s", u.decode_gb_s},
      {"decode_bandwidth_fraction", u.decode_frac},
      {"read_gb_s_beside", r.read_gb_s_beside},
      {"decode_bandwidth_fraction_beside", u.decode_frac_beside.median},
      {"decode_bandwidth_fraction_beside_min", u.decode_frac_beside.min},
      {"decode_bandwidth_fraction_beside_max", u.decode_frac_beside.max},
      {"prefill_ops", 2 * mc.prefill_macs(P)},
      {"prefill_gop_s", u.prefill_gop_s},
      {"prefill_compute_family", compute_family_name(mc.family)},
      {"prefill_peak_gop_s", u.prefill_peak_gop_s},
      {"prefill_peak_isa", u.prefill_peak_isa},
      {"prefill_peak_fraction", u.prefill_frac},
      {"roofline", roofline_to_json(roof)},
      {"token_ids", r.tokens},
      {"spec", spec_mode_name(r.opts.spec.mode)},
      {"spec_drafted", r.spec_drafted},
      {"spec_accepted", r.spec_accepted},
      {"decode_tokens_per_step", r.tokens_per_step},
      {"device", r.device},
  };
  if (r.device != "cpu") {
    const DeviceUse d = device_use(r);
    j["device_read_gb_s"] = r.device_read_gb_s;
    j["device_decode_gb_s"] = d.decode_gb_s;
    j["device_decode_bandwidth_fraction"] = d.decode_frac;
    j["device_prefill_tflops"] = d.prefill_tflops;
    j["device_prefill_peak_tflops"] = d.prefill_peak_tflops;
    j["device_prefill_peak_fraction"] = d.prefill_frac;
  }
  return j;
}

}  // namespace tandem

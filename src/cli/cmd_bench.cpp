// tandem bench: prefill and decode speed of one model, with the roofline.
// The measuring lives in src/perf; this file parses flags and prints.
#include <cstdio>
#include <memory>
#include <string>
#include <tuple>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/common.h"
#include "kv/kv_cache.h"
#include "quant/ggml_type.h"
#include "perf/bench.h"
#include "perf/roofline.h"

namespace tandem::cli {
namespace {

struct BenchCliOpts {
  BenchOptions bench;
  SpecFlags spec;
  KvCacheFlags kv;
  KvStoreFlags store;
  bool json = false;
  bool roofline = false;
  std::string roofline_cache;
};

double mib(uint64_t b) { return static_cast<double>(b) / (1024.0 * 1024.0); }

void print_table(const BenchResult& r, const Roofline& roof) {
  const RooflineUse u = roofline_use(r, roof);
  const ModelCost& mc = r.cost;
  std::string types;
  for (const auto& [name, bytes] : mc.bytes_by_type)
    types += fmt::format("{}{} {:.1f} MiB", types.empty() ? "" : ", ", name, mib(bytes));
  std::string out = fmt::format(
      "model    {} ({}, {}), {} | {} threads, {} kernels, prepack {}\n"
      "load     {:.3f} s   warm-up {:.3f} s   peak RSS {:.1f} MiB (file {:.1f} MiB, KV cache {:.1f} MiB {})\n\n",
      r.opts.model_path, r.model_name.empty() ? "unnamed" : r.model_name, r.arch,
      mc.file_type.empty() ? std::string(type_traits(mc.main_type).name) : mc.file_type, r.threads, r.kernel_level,
      prepack_mode_name(r.opts.runtime.prepack), r.load_s, r.warmup_s, mib(r.peak_rss_bytes), mib(r.file_bytes),
      mib(r.kv_cache_bytes), kv_format_name(kv_format(r.kv_cache)));
  if (r.opts.batch > 1)
    out += fmt::format("batch    {} requests on the engine: one step of {} prompts of {} tokens, then {} decode steps "
                       "of {} rows\n\n",
                       r.opts.batch, r.opts.batch, r.opts.n_prompt, r.opts.n_gen, r.opts.batch);
  out += fmt::format("{:<8} {:>7} {:>5} {:>12} {:>10} {:>10}\n", "phase", "tokens", "reps", "median tok/s", "min",
                     "max");
  out += fmt::format("{:<8} {:>7} {:>5} {:>12.2f} {:>10.2f} {:>10.2f}\n", "prefill", r.opts.n_prompt, r.opts.reps,
                     r.prefill_tok_s.median, r.prefill_tok_s.min, r.prefill_tok_s.max);
  if (r.opts.n_gen > 0)
    out += fmt::format("{:<8} {:>7} {:>5} {:>12.2f} {:>10.2f} {:>10.2f}\n", "decode", r.opts.n_gen, r.opts.reps,
                       r.decode_tok_s.median, r.decode_tok_s.min, r.decode_tok_s.max);
  if (r.opts.spec.mode != SpecMode::kOff)
    out += fmt::format("spec     {}: {} drafted, {} kept ({:.0f}%), {:.2f} decode tokens per step\n",
                       spec_mode_name(r.opts.spec.mode), r.spec_drafted, r.spec_accepted,
                       r.spec_drafted ? 100.0 * r.spec_accepted / r.spec_drafted : 0.0, r.tokens_per_step);
  out += fmt::format("\nroofline ({} {}, {} threads, {} level)\n", roof.source, roof.measured_at, roof.threads,
                     roof.kernel_level);
  out += fmt::format("  weights read per decode token: {:.1f} MiB ({}; linear layers + output matrix)\n",
                     mib(mc.decode_weight_bytes), types);
  if (r.opts.n_gen > 0) {
    out += fmt::format("  decode   {:8.2f} GB/s  of {:8.2f} GB/s read bandwidth ({})  = {:5.1f}%\n", u.decode_gb_s,
                       roof.read_gb_s.value, roof.read_gb_s.isa, 100 * u.decode_frac);
    out += fmt::format("           against a read of the same weights after each repetition ({:.2f} GB/s median):"
                       " {:5.1f}% ({:.1f}-{:.1f}%)\n",
                       u.read_gb_s_beside, 100 * u.decode_frac_beside.median, 100 * u.decode_frac_beside.min,
                       100 * u.decode_frac_beside.max);
  }
  out += fmt::format("  prefill  {:8.2f} GOP/s of {:8.2f} GOP/s {} peak ({}, for {} weights)  = {:5.1f}%\n",
                     u.prefill_gop_s, u.prefill_peak_gop_s, compute_family_name(mc.family), u.prefill_peak_isa,
                     type_traits(mc.prefill_type).name, 100 * u.prefill_frac);
  out += fmt::format("  peaks: fp32 {:.1f} GOP/s ({}), int8 {:.1f} GOP/s ({}), bf16 {:.1f} GOP/s ({})\n",
                     roof.fp32_gop_s.value, roof.fp32_gop_s.isa, roof.int8_gop_s.value, roof.int8_gop_s.isa,
                     roof.bf16_gop_s.value, roof.bf16_gop_s.isa);
  std::fputs(out.c_str(), stdout);
}

// A GPU run: the card's measured read bandwidth and peak instead of the
// CPU roofline.
void print_device_table(const BenchResult& r) {
  const DeviceUse u = device_use(r);
  const ModelCost& mc = r.cost;
  std::string types;
  for (const auto& [name, bytes] : mc.bytes_by_type)
    types += fmt::format("{}{} {:.1f} MiB", types.empty() ? "" : ", ", name, mib(bytes));
  std::string out = fmt::format(
      "model    {} ({}, {}), {} | {}\n"
      "load     {:.3f} s   warm-up {:.3f} s   KV cache {:.1f} MiB (device)\n\n",
      r.opts.model_path, r.model_name.empty() ? "unnamed" : r.model_name, r.arch,
      mc.file_type.empty() ? std::string(type_traits(mc.main_type).name) : mc.file_type, r.device, r.load_s,
      r.warmup_s, mib(r.kv_cache_bytes));
  if (r.opts.batch > 1)
    out += fmt::format("batch    {} requests: one step of {} prompts of {} tokens, then {} decode steps of {} rows\n\n",
                       r.opts.batch, r.opts.batch, r.opts.n_prompt, r.opts.n_gen, r.opts.batch);
  out += fmt::format("{:<8} {:>7} {:>5} {:>12} {:>10} {:>10}\n", "phase", "tokens", "reps", "median tok/s", "min",
                     "max");
  out += fmt::format("{:<8} {:>7} {:>5} {:>12.2f} {:>10.2f} {:>10.2f}\n", "prefill", r.opts.n_prompt, r.opts.reps,
                     r.prefill_tok_s.median, r.prefill_tok_s.min, r.prefill_tok_s.max);
  if (r.opts.n_gen > 0)
    out += fmt::format("{:<8} {:>7} {:>5} {:>12.2f} {:>10.2f} {:>10.2f}\n", "decode", r.opts.n_gen, r.opts.reps,
                       r.decode_tok_s.median, r.decode_tok_s.min, r.decode_tok_s.max);
  out += fmt::format("\ndevice   {}: measured read bandwidth {:.1f} GB/s (4 GiB, 16-byte loads)\n", r.device,
                     r.device_read_gb_s);
  out += fmt::format("  weights read per decode token: {:.1f} MiB ({}; linear layers + output matrix)\n",
                     mib(mc.decode_weight_bytes), types);
  if (r.opts.n_gen > 0)
    out += fmt::format("  decode   {:8.1f} GB/s of weights ({} per step) = {:5.1f}% of the measured read bandwidth\n",
                       u.decode_gb_s, r.opts.batch > 1 ? "read once for all rows" : "one row", 100 * u.decode_frac);
  out += fmt::format("  prefill  {:8.1f} TFLOPS (2 x multiply-adds / time) = {:5.1f}% of {:.0f} TFLOPS dense bf16 "
                     "(datasheet; ~790 measured by others)\n",
                     u.prefill_tflops, 100 * u.prefill_frac, u.prefill_peak_tflops);
  std::fputs(out.c_str(), stdout);
}

}  // namespace

void add_bench_command(CLI::App& app, int& rc) {
  auto o = std::make_shared<BenchCliOpts>();
  o->roofline_cache = default_roofline_cache_path();
  CLI::App* cmd = app.add_subcommand("bench", "Measure prefill and decode speed against the machine's roofline");
  cmd->add_option("-m,--model", o->bench.model_path, "GGUF model file (default: the installed Gemma 3 270M)");
  cmd->add_option("-p,--prompt-tokens", o->bench.n_prompt, "Prompt tokens prefilled in one pass")
      ->capture_default_str();
  cmd->add_option("-n,--decode-tokens", o->bench.n_gen, "Decode steps after the prompt")->capture_default_str();
  cmd->add_option("-t,--threads", o->bench.threads, "Threads (0: physical cores)")->capture_default_str();
  cmd->add_option("--reps", o->bench.reps, "Timed repetitions (median, min, max are reported)")
      ->capture_default_str();
  cmd->add_option("--warmup", o->bench.warmup, "Untimed repetitions before them")->capture_default_str();
  cmd->add_option("--batch", o->bench.batch,
                  "Sequences decoding together: B prompts are prefilled, then every decode step runs B rows "
                  "(tok/s count all sequences)")
      ->capture_default_str();
  add_runtime_options(cmd, o->bench.runtime);
  add_sparse_attention_option(cmd, o->bench.runtime);
  add_spec_options(cmd, o->spec);
  add_kv_cache_options(cmd, o->kv);
  add_kv_store_options(cmd, o->store);
  add_device_option(cmd, o->bench.device);
  cmd->add_option("-f,--prompt-file", o->bench.prompt_file,
                  "Take the prompt from this text (cycled to -p tokens) instead of ids drawn from the vocabulary");
  cmd->add_flag("--json", o->json, "Print one JSON object instead of the table");
  cmd->add_flag("--roofline", o->roofline,
                "Measure the machine's ceilings now (1 GiB read, compute peaks) and cache them");
  cmd->add_option("--roofline-cache", o->roofline_cache, "Where measured ceilings are cached")
      ->capture_default_str();
  cmd->callback([o, &rc] {
    o->bench.model_path = resolve_model_path(o->bench.model_path);
    o->bench.spec.mode = parse_spec_mode(o->spec.mode);
    o->bench.spec.max_draft = o->spec.draft_max;
    o->bench.spec.adaptive = !o->spec.fixed;
    o->bench.draft_model = o->spec.draft_model;
    o->bench.kv_cache = kv_cache_types(o->kv);
    o->bench.kv_store = o->store.dir;
    o->bench.kv_store_bytes = kv_store_bytes(o->store);
    const BenchResult r = run_bench(o->bench);
    if (r.device != "cpu") {  // the CPU's ceilings say nothing about a GPU run
      if (o->json)
        std::printf("%s\n", bench_to_json(r, Roofline{}).dump().c_str());
      else
        print_device_table(r);
      rc = 0;
      return;
    }
    // After the run, so the microbenchmark's buffer stays out of peak RSS.
    std::string warning;
    const Roofline roof = roofline_for_bench(r.threads, o->roofline, o->roofline_cache, warning);
    if (!warning.empty()) std::fprintf(stderr, "warning: %s\n", warning.c_str());
    if (o->json)
      std::printf("%s\n", bench_to_json(r, roof).dump().c_str());
    else
      print_table(r, roof);
    rc = 0;
  });
}

}  // namespace tandem::cli

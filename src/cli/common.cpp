#include "cli/common.h"

#include "kv/kv_cache.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>

#include <CLI/CLI.hpp>

#include "core/error.h"

namespace tandem::cli {

namespace {

// The flags' text, turned into RuntimeOptions once the command line is parsed.
struct RuntimeFlags {
  std::string kernels, prepack = "auto", prefetch = "auto", stream_out = "on", memory_available;
  std::vector<std::string> cuda_disable;
  int64_t panel_pairs = -1;
};

}  // namespace

void add_runtime_options(CLI::App* cmd, RuntimeOptions& opts) {
  auto f = std::make_shared<RuntimeFlags>();
  cmd->add_option("--kernels", f->kernels,
                  "Instruction-set level of the kernels: scalar, avx2 or avx512 (default: the best this CPU runs)")
      ->envname("TANDEM_KERNELS");
  cmd->add_option("--prepack", f->prepack,
                  "Weights repacked at load: auto (q8_0 panels, q4_0 tiles: no extra memory), all (every "
                  "quantized type: faster batched decode on small models, more memory), off")
      ->check(CLI::IsMember({"auto", "all", "off", "0"}))
      ->envname("TANDEM_PREPACK")
      ->capture_default_str();
  cmd->add_option("--repack-cache", opts.repack_cache,
                  "Directory for a file of the repacked weights, one per model file: the next load maps it "
                  "instead of repacking (as large as the repacked weights)")
      ->envname("TANDEM_REPACK_CACHE");
  const char* advanced = "Advanced (docs/performance.md)";
  cmd->add_option("--prefetch", f->prefetch,
                  "Software prefetch in the streaming kernels: auto (what this CPU was measured to want), on, off")
      ->check(CLI::IsMember({"auto", "on", "off", "0", "1"}))
      ->envname("TANDEM_PREFETCH")
      ->group(advanced);
  cmd->add_option("--panel-pairs", f->panel_pairs,
                  "Products of at least N rows run two panels per kernel call (0: never; default 9)")
      ->check(CLI::NonNegativeNumber)
      ->envname("TANDEM_PANEL_PAIRS")
      ->group(advanced);
  cmd->add_option("--stream-out", f->stream_out,
                  "Outputs larger than the caches written with streaming stores: on, off")
      ->check(CLI::IsMember({"on", "off", "0", "1"}))
      ->envname("TANDEM_STREAM_OUT")
      ->group(advanced);
  cmd->add_flag("--huge-pages", opts.huge_pages,
                "Repacked weights on transparent huge pages (faster decode where TLB misses cost, slower load)")
      ->envname("TANDEM_HUGEPAGES")
      ->group(advanced);
  cmd->add_option("--memory-available", f->memory_available,
                  "Stands in for the memory available in every sizing check (suffixes K, M, G): to try them")
      ->envname("TANDEM_MEMORY_AVAILABLE")
      ->group(advanced);
  cmd->add_option("--cuda-disable", f->cuda_disable,
                  "With --device cuda, turn off: graphs (decode steps as CUDA graphs), pdl (programmatic "
                  "dependent launch), f16-copies (f16 copies of quantized matrices for cuBLAS); comma-separated")
      ->delimiter(',')
      ->check(CLI::IsMember({"graphs", "pdl", "f16-copies"}))
      ->group(advanced);
  cmd->parse_complete_callback([f, &opts] {
    std::string warning;
    const KernelLevel level = choose_kernel_level(f->kernels, best_kernel_level(), &warning);
    if (!warning.empty()) std::fprintf(stderr, "tandem: warning: %s\n", warning.c_str());
    set_active_kernel_level(level);
    opts.kernels = level;
    opts.prepack = parse_prepack_mode(f->prepack);
    opts.prefetch = parse_prefetch_mode(f->prefetch);
    if (f->panel_pairs >= 0) opts.panel_pair_min_rows = f->panel_pairs;
    opts.stream_out = f->stream_out != "off" && f->stream_out != "0";
    for (const std::string& what : f->cuda_disable) {
      if (what == "graphs") opts.cuda_graphs = false;
      if (what == "pdl") opts.cuda_pdl = false;
      if (what == "f16-copies") opts.cuda_f16_copies = false;
    }
    if (!f->memory_available.empty())
      opts.memory_available = static_cast<uint64_t>(parse_bytes(f->memory_available, "--memory-available"));
  });
}

std::string default_roofline_cache_path() {
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) return std::string(x) + "/tandem/roofline.json";
  if (const char* h = std::getenv("HOME"); h && *h) return std::string(h) + "/.cache/tandem/roofline.json";
  return "";
}

int64_t parse_bytes(const std::string& s, const char* flag) {
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(s, &used);
  } catch (const std::exception&) {
    fail(ErrorKind::kInvalidArgument, "{}: '{}' is not a size (e.g. 512M, 2G)", flag, s);
  }
  std::string unit = s.substr(used);
  std::transform(unit.begin(), unit.end(), unit.begin(), [](unsigned char c) { return std::tolower(c); });
  double mult = 1;
  if (unit.empty() || unit == "b") mult = 1;
  else if (unit == "k" || unit == "kb" || unit == "kib") mult = 1024.0;
  else if (unit == "m" || unit == "mb" || unit == "mib") mult = 1024.0 * 1024;
  else if (unit == "g" || unit == "gb" || unit == "gib") mult = 1024.0 * 1024 * 1024;
  else fail(ErrorKind::kInvalidArgument, "{}: unknown unit '{}' in '{}' (use K, M or G)", flag, unit, s);
  const double bytes = v * mult;
  if (!(bytes >= 1) || bytes > 1e15) fail(ErrorKind::kInvalidArgument, "{}: '{}' is out of range", flag, s);
  return static_cast<int64_t>(bytes);
}

void add_spec_options(CLI::App* cmd, SpecFlags& f) {
  cmd->add_option("--spec", f.mode,
                  "Speculative decoding: ngram (drafts looked up in the text so far), draft (a draft model), off; "
                  "never changes the output")
      ->check(CLI::IsMember({"off", "ngram", "draft"}))
      ->capture_default_str();
  cmd->add_option("--draft-model", f.draft_model, "GGUF draft model for --spec draft (the same vocabulary)");
  cmd->add_option("--draft-max", f.draft_max, "Most tokens drafted per sequence and step")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  cmd->add_flag("--draft-fixed", f.fixed,
                "Always draft --draft-max tokens where a draft exists, instead of as many as the measured costs "
                "and acceptance say pay (for measuring)");
}

void add_kv_cache_options(CLI::App* cmd, KvCacheFlags& f) {
  cmd->add_option("--cache-type-k", f.k, "KV cache type of K: f16 (default), f32, q8_0 (smoothed), q4_0 (rotated and smoothed)");
  cmd->add_option("--cache-type-v", f.v, "KV cache type of V: f16 (default), f32, q8_0, q4_0");
  cmd->add_option("--kv-type", f.both, "KV cache type of both K and V");
  cmd->add_option("--kv-rotation", f.rotation,
                  "Hadamard rotation of quantized heads: auto (q4_0 ones), off, all (every quantized one)")
      ->capture_default_str();
  cmd->add_option("--kv-smoothing", f.smoothing,
                  "Quantized keys stored less each layer's mean key and scaled against the queries' magnitudes "
                  "(exact in arithmetic): on, off")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
  cmd->add_flag("--swa-full", f.swa_full,
                "Sliding-window layers keep every KV block (by default they give back the ones their window has "
                "passed)");
  cmd->add_option("--kv-window", f.window,
                  "Streaming window: keep the first --kv-sinks positions and the last N of a sequence, evicting the "
                  "ones between, so generation runs past the context at constant memory (0: off)")
      ->capture_default_str();
  cmd->add_option("--kv-sinks", f.sinks, "Positions kept from a sequence's start with --kv-window (attention sinks)")
      ->capture_default_str();
  cmd->add_option("--kv-heavy", f.heavy,
                  "With --kv-window: also keep this many older positions, whole blocks of them, those that have had "
                  "the most attention (heavy hitters, H2O); a multiple of the block size (0: off)")
      ->capture_default_str();
}

void add_kv_store_options(CLI::App* cmd, KvStoreFlags& f) {
  cmd->add_option("--kv-store", f.dir,
                  "Folder of KV blocks that outlives the process: full prefix blocks are written there as they are "
                  "cached and read back when a prompt's prefix is not in memory (at the next start, or written by "
                  "another instance of the same model sharing the folder)");
  cmd->add_option("--kv-store-size", f.size,
                  "Most bytes of --kv-store files; the least recently used go beyond it (suffixes K, M, G)")
      ->capture_default_str();
}

int64_t kv_store_bytes(const KvStoreFlags& f) {
  const int64_t n = parse_bytes(f.size, "--kv-store-size");
  if (n <= 0) fail(ErrorKind::kInvalidArgument, "--kv-store-size must be more than 0 bytes, got '{}'", f.size);
  return n;
}

KvCacheTypes kv_cache_types(const KvCacheFlags& f) {
  auto one = [&](const std::string& own, const char* flag) {
    const std::string& name = !own.empty() ? own : !f.both.empty() ? f.both : std::string("f16");
    try {
      return parse_kv_type(name);
    } catch (const Error& e) {
      fail(ErrorKind::kInvalidArgument, "{}: {}", !own.empty() ? flag : "--kv-type", e.what());
    }
  };
  KvCacheTypes t{one(f.k, "--cache-type-k"), one(f.v, "--cache-type-v")};
  t.swa_full = f.swa_full;
  t.window = f.window;
  t.sinks = f.sinks;
  t.heavy = f.heavy;
  try {
    t.rotation = parse_kv_rotation(f.rotation);
  } catch (const Error& e) {
    fail(ErrorKind::kInvalidArgument, "--kv-rotation: {}", e.what());
  }
  t.smooth_keys = f.smoothing != "off";
  return t;
}

void add_sparse_attention_option(CLI::App* cmd, RuntimeOptions& opts) {
  cmd->add_option("--sparse-attention", opts.sparse_attention.budget,
                  "Sparse attention (Quest): each decode row of a full-attention layer reads the first 16 "
                  "positions, the last 64 and the blocks whose key bounds score highest, BUDGET positions in all "
                  "(a multiple of the block size, at least 80; 0: off)")
      ->capture_default_str();
}

void add_device_option(CLI::App* cmd, std::string& device) {
  cmd->add_option("--device", device, "Where the forward passes run: cpu, or cuda (a build with -DTANDEM_CUDA=ON)")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
}

std::string resolve_model_path(const std::string& flag) {
  if (!flag.empty()) return flag;
  if (const char* env = std::getenv("TANDEM_MODEL"); env && *env) return env;
  std::string dir;
  if (const char* d = std::getenv("TANDEM_MODEL_DIR"); d && *d) {
    dir = d;
  } else if (const char* home = std::getenv("HOME"); home && *home) {
    dir = std::string(home) + "/.cache/tandem/models";
  }
  const std::string path = dir + "/gemma-3-270m-q4_k_m.gguf";
  if (!dir.empty() && std::filesystem::exists(path)) return path;
  fail(ErrorKind::kInvalidArgument,
       "no model given (-m FILE) and the default model is not installed at {} (run scripts/setup.sh)", path);
}

std::string read_text_file(const std::string& path, const char* flag) {
  std::FILE* f = path == "-" ? stdin : std::fopen(path.c_str(), "rb");
  if (!f) fail(ErrorKind::kIo, "{} {}: cannot open: {}", flag, path, std::strerror(errno));
  std::string text;
  char buf[1 << 16];
  size_t n = 0;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) text.append(buf, n);
  const bool bad = std::ferror(f);
  if (f != stdin) std::fclose(f);
  if (bad) fail(ErrorKind::kIo, "{} {}: read error", flag, path);
  if (text.ends_with('\n')) text.pop_back();
  if (text.ends_with('\r')) text.pop_back();
  if (text.empty()) fail(ErrorKind::kInvalidArgument, "{} {}: the file is empty", flag, path);
  return text;
}

}  // namespace tandem::cli

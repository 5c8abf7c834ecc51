// Pieces shared by the subcommands.
#pragma once

#include <cstdint>
#include <string>
#include <utility>

#include "runtime/options.h"
#include "kv/kv_cache.h"

namespace CLI {
class App;
}

namespace tandem::cli {

// The library's options (runtime/options.h) as flags of a subcommand that loads
// a model: --kernels, --prepack, --repack-cache and the advanced ones
// (--prefetch, --panel-pairs, --stream-out, --huge-pages, --memory-available).
// Each flag also reads the environment variable it replaces (TANDEM_KERNELS,
// TANDEM_PREPACK=0, TANDEM_REPACK_CACHE, TANDEM_PREFETCH, TANDEM_PANEL_PAIRS,
// TANDEM_STREAM_OUT=0, TANDEM_HUGEPAGES=1, TANDEM_MEMORY_AVAILABLE). Once the
// command line is parsed, `opts` holds them and the kernel level is the
// process's (set_active_kernel_level).
void add_runtime_options(CLI::App* cmd, RuntimeOptions& opts);

// $XDG_CACHE_HOME/tandem/roofline.json, else $HOME/.cache/tandem/roofline.json
// ("" when neither is set): where `tandem bench` keeps its measured ceilings.
std::string default_roofline_cache_path();

// "2147483648", "512M", "2G", "1.5GiB": binary multiples; `flag` names the option in errors.
int64_t parse_bytes(const std::string& s, const char* flag);

// --spec off|ngram|draft, --draft-model FILE, --draft-max K (engine/speculation.h).
struct SpecFlags {
  std::string mode = "off", draft_model;
  int32_t draft_max = 16;
  bool fixed = false;
};
void add_spec_options(CLI::App* cmd, SpecFlags& f);

// --cache-type-k T, --cache-type-v T (llama.cpp's names) and --kv-type T
// (both; the specific flags win): f16, f32, q8_0, q4_0 (kv/kv_cache.h).
// --kv-rotation auto|off|all: which quantized parts are Hadamard-rotated;
// --kv-smoothing on|off: whether quantized keys are smoothed.
// --swa-full: sliding-window layers keep every block.
// --kv-window N --kv-sinks S: a streaming window of N positions after S sinks;
// --kv-heavy H: and the H older positions with the most attention.
struct KvCacheFlags {
  std::string k, v, both, rotation = "auto", smoothing = "on";
  bool swa_full = false;
  int32_t window = 0, sinks = 4, heavy = 0;
};
void add_kv_cache_options(CLI::App* cmd, KvCacheFlags& f);
// f16 where nothing is given. Throws kInvalidArgument naming an unknown type
// and its flag.
KvCacheTypes kv_cache_types(const KvCacheFlags& f);

// --kv-store DIR, --kv-store-size BYTES: a folder of KV blocks that
// outlives the process (engine/kv_store.h).
struct KvStoreFlags {
  std::string dir, size = "4G";
};
void add_kv_store_options(CLI::App* cmd, KvStoreFlags& f);
// --kv-store-size in bytes; kInvalidArgument naming the flag.
int64_t kv_store_bytes(const KvStoreFlags& f);
// --sparse-attention BUDGET (runtime/options.h: SparseAttention; 0: off).
void add_sparse_attention_option(CLI::App* cmd, RuntimeOptions& opts);

// --device cpu|cuda (model/executor.h).
void add_device_option(CLI::App* cmd, std::string& device);

// -m when given, else $TANDEM_MODEL, else the default model installed by
// scripts/setup.sh. Throws tandem::Error when none exists.
std::string resolve_model_path(const std::string& flag);

// The whole of `path` ("-": standard input), less one final line break (the
// one an editor adds; llama.cpp's -f drops it too). `flag` names the option
// in errors; an empty text is one.
std::string read_text_file(const std::string& path, const char* flag);

}  // namespace tandem::cli

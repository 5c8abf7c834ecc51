// The choices a run makes about how the library computes, in one struct: the
// command line fills it from its flags (and from the environment variables
// it maps to them) and hands it to Model::load, which passes the parts the
// kernels need down to them. Nothing below the command line reads the
// environment. docs/performance.md ("Kernel selection") describes the flags.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "runtime/cpu_features.h"

namespace tandem {

// Which weight matrices are rearranged at load (kernels/layouts.h):
//   kOff:  none, every product reads the file's rows;
//   kAuto: those whose new layout is no larger than the file, or barely
//          (q8_0 panels; q4_0, q5_0, q4_K, f16, bf16 tiles);
//   kAll:  also every other quantized type with panels (q4_0 / q5_0 at 1.5-2x
//          their file size, the K-quants at 1.5-2.2x): batched decode stops
//          packing panels every step, for more memory and more bytes a token.
enum class PrepackMode { kOff, kAuto, kAll };
// "off" (or "0", the old TANDEM_PREPACK=0), "auto", "all"; throws kInvalidArgument otherwise.
PrepackMode parse_prepack_mode(std::string_view name);
const char* prepack_mode_name(PrepackMode mode);

// Software prefetch in the streaming (decode) kernels (kernels/stream_tuning.h).
enum class PrefetchMode {
  kAuto,  // what this CPU was measured to want
  kOn,    // every prefetch on, the panels' from the first row
  kOff,   // none
};
// "auto", "on" (or "1"), "off" (or "0"); throws kInvalidArgument otherwise.
PrefetchMode parse_prefetch_mode(std::string_view name);

// Sparse attention (Quest, docs/kv-cache.md): a decode row of a
// full-attention layer attends to its sequence's first `sinks` positions, its
// last `window` (the block being filled included) and the blocks whose key
// bounds score highest against its query, `budget` positions in all; 0: off.
// Positions are whole blocks: check_sparse_attention says what is refused.
struct SparseAttention {
  int32_t budget = 0;
  int32_t sinks = 16;
  int32_t window = 64;
};
// Throws kInvalidArgument naming the problem: a budget that is negative,
// not a multiple of the block size, or below sinks + window (sinks and
// window whole blocks too).
void check_sparse_attention(const SparseAttention& s, int32_t block_size);

struct RuntimeOptions {
  // Instruction-set level of the model's kernels (products, attention,
  // norms); nullopt: active_kernel_level(). The command line also makes it
  // the process's level at start-up.
  std::optional<KernelLevel> kernels = std::nullopt;

  // Weight layouts chosen at load (see PrepackMode).
  PrepackMode prepack = PrepackMode::kAuto;
  // A directory for a file of the repacked weights, mapped at the next load
  // instead of repacking (model/repack_cache.h); "" for none.
  std::string repack_cache = {};
  // Repacked buffers of 2 MiB or more on 2 MiB-aligned transparent huge pages
  // (fewer TLB misses in decode; slower loads where fresh huge pages are
  // slow to fault in).
  bool huge_pages = false;
  // Stands in for the memory available (runtime/memory_info.h) in every sizing
  // check: repacking at load, the server's KV pool. To try the checks on
  // small sizes.
  std::optional<uint64_t> memory_available = std::nullopt;

  // Advanced, how the products stream memory (kernels/stream_tuning.h); every
  // choice gives the same bits.
  PrefetchMode prefetch = PrefetchMode::kAuto;
  // Products of at least this many rows run two panels per kernel call
  // (0: never); nullopt: the default.
  std::optional<int64_t> panel_pair_min_rows = std::nullopt;
  // Outputs too large for any cache go out with streaming stores.
  bool stream_out = true;

  // The CUDA backend's optional mechanisms (docs/cuda.md), each on by default
  // and off for diagnosis: decode steps as CUDA graphs, programmatic dependent
  // launch, f16 copies of the quantized matrices kept for cuBLAS.
  bool cuda_graphs = true;
  bool cuda_pdl = true;
  bool cuda_f16_copies = true;

  // Sparse attention's default for every sequence (off unless budget > 0;
  // a request may choose its own budget where it is on).
  SparseAttention sparse_attention = {};
};

}  // namespace tandem

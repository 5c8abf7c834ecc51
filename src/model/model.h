// A loaded model: its file, config, weights, tokenizer, and the forward pass.
//
// forward() runs one batch of token rows through every layer. A batch is any
// mix of sequences: a prompt's N tokens (prefill), one new token of each of B
// sequences (decode), or both. The phase shows in the kernels each step picks:
// matrix-matrix products and causal-chunk attention for many rows of a
// sequence, matrix-vector products and single-query attention for one.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/aligned_vector.h"
#include "kernels/matmul.h"
#include "runtime/options.h"
#include "model/config.h"
#include "model/weights.h"

namespace tandem {

class GgufFile;
class KvCache;
class RepackCache;
struct KvPaging;
struct KvShape;
class ThreadPool;
class Tokenizer;
struct LatentScratch;
struct SeqKv;

struct BatchRow {
  int32_t token = 0;
  int32_t pos = 0;
  int32_t seq = 0;       // index into the `seqs` span given to forward()
  bool logits = false;   // compute this row's next-token logits
};
// Rows of one sequence must be adjacent and at consecutive positions.
using Batch = std::vector<BatchRow>;

// Logits of the rows that ask for them, on a cache line: the vocab-sized
// product may then write them with streaming stores (kernels/matmul.cpp).
using Logits = CacheAlignedVector<float>;

// Rows of `b` that ask for logits: forward() produces n_vocab floats for each.
inline size_t rows_with_logits(const Batch& b) {
  size_t n = 0;
  for (const BatchRow& row : b) n += row.logits;
  return n;
}

// What every runner checks before a forward pass, whichever computes it:
// tokens in the vocabulary, rows naming a sequence whose blocks (and
// sliding-window pages) cover their positions, a sequence's rows at
// consecutive positions, and room for the logits asked for. Throws
// Error(kInvalidArgument) naming the first problem.
void check_batch(const Batch& batch, std::span<SeqKv* const> seqs, int32_t n_vocab, int32_t block_size,
                 const KvPaging& paging, size_t logits_floats);

// Rows per chunk of a layer's attention and feed-forward blocks in a long
// prompt (Model::LayerSteps): the widest buffers shrink while the products still
// run at their many-row speed; more rows per attention chunk, since each
// chunk reads the q/k/v/o weights again. docs/performance.md has the numbers.
inline constexpr int64_t kAttnChunkRows = 256;
inline constexpr int64_t kFfnChunkRows = 128;
// Rows per chunk of a mixture-of-experts block: each picked expert is read
// once per chunk, so a chunk holds a whole default prefill step; its buffers
// grow with rows x top-k x n_embd (model/moe_ffn.h).
inline constexpr int64_t kMoeChunkRows = 512;

// The KV cache's shape for a model of this config: n_layer layers of
// n_head_kv heads, or for latent attention one latent (as V) and one shared
// rotated key part (as K) per token and layer.
KvShape kv_shape_of(const ModelConfig& c);

// One line on what the cache holds per token: its layout, and the bytes a
// token takes over every layer in f16, f32 and q8_0 (tandem inspect).
std::string describe_kv_cache(const ModelConfig& c);

class Model {
 public:
  // Maps the file, binds everything and repacks weights per opts.prepack
  // (kernels/products.h). With opts.repack_cache, the repacked weights are
  // mapped from a file there when one matches, and written there when none
  // does (model/repack_cache.h). The kernels run at opts.kernels (or the
  // process's level) with the stream tuning the options give. Throws tandem::Error.
  static std::unique_ptr<Model> load(const std::string& path, const RuntimeOptions& opts = {});
  ~Model();

  const GgufFile& file() const { return *file_; }
  const ModelConfig& config() const { return cfg_; }
  // What the model was loaded with (executors read their parts of it).
  const RuntimeOptions& options() const { return opts_; }
  const ModelWeights& weights() const { return w_; }
  const Tokenizer& tokenizer() const { return *tok_; }
  // The level every kernel of this model runs at.
  KernelLevel kernel_level() const { return level_; }
  // The KV cache this model's layers write: n_layer layers of n_head_kv heads.
  KvShape kv_shape() const;

  // Writes K/V of every row into its sequence's blocks (which must already
  // cover the row's position) and, for rows with logits = true, appends
  // n_vocab logits to `logits` in row order.
  void forward(const Batch& batch, std::span<SeqKv* const> seqs, KvCache& kv, ThreadPool& pool,
               Logits& logits);
  // The same, writing the logits to `out`, which must hold n_vocab floats per
  // row that asks for them (a serving step's buffer is reused as it is:
  // growing a vector from empty zero-fills it, 16 MiB a step for 16 rows of
  // a 262k vocabulary).
  void forward(const Batch& batch, std::span<SeqKv* const> seqs, KvCache& kv, ThreadPool& pool,
               std::span<float> out);

  // While set, each forward pass adds every query element squared, after
  // RoPE and the score scale, to (*sums)[il * n_head * head_dim + element]
  // (key smoothing's calibration over a plain cache: model/key_smoothing.h).
  void set_query_energy(std::vector<double>* sums) { query_energy_ = sums; }
  // Sparse attention's blocks since load, counted per layer and KV head over
  // the rows attended sparsely (SeqKv::sparse_budget): blocks read, and the
  // blocks those rows' sequences held. Read between forward passes.
  struct SparseCounts {
    int64_t read = 0, held = 0;
  };
  SparseCounts sparse_counts() const { return sparse_counts_; }
  // Layer il's rotary embedding (local and global layers may differ).
  RopeParams rope_params(int32_t il) const;
  // Turns one token's keys of layer il (n_head_kv heads, as the cache
  // returns them: KvCache::read_key) `delta` positions further on: RoPE is
  // a rotation, so RoPE(p + delta) = R(delta) RoPE(p).
  void rope_shift_key(int32_t il, float* k, int32_t delta) const { rope_shift_keys(il, k, 0, 1, delta); }
  // The same for n keys `stride` floats apart, the angles computed once.
  void rope_shift_keys(int32_t il, float* k, int64_t stride, int32_t n, int32_t delta) const;

  // The two phases as the engine calls them.
  // Prefill: the N prompt tokens of one sequence from position seq.n_tokens;
  // returns the last position's logits.
  void prefill(SeqKv& seq, std::span<const int32_t> tokens, KvCache& kv, ThreadPool& pool,
               Logits& logits);
  // Decode: one new token for each sequence; logits[b * n_vocab ...] for each.
  void decode(std::span<SeqKv* const> seqs, std::span<const int32_t> tokens, KvCache& kv, ThreadPool& pool,
              Logits& logits);

 private:
  Model() = default;
  struct Scratch;
  // A pass's steps of decoder_layer (model/layer_recipe.h). The last layer
  // may keep only some rows (in increasing order) past its attention; they
  // end up compacted into the first rows.
  struct LayerSteps;
  // Rows [c0, c0 + n) through a latent-attention layer (deepseek2), xn their
  // normed rows, up to the output projection's input `attn` (n rows of
  // n_head * head_dim_v): model/latent_attention.cpp.
  void latent_attention_rows(int32_t il, const Batch& batch, int64_t c0, int64_t n, std::span<SeqKv* const> seqs,
                             KvCache& kv, ThreadPool& pool, const float* xn, float* attn);
  void attention_rows(int32_t il, const Batch& batch, int64_t c0, int64_t n, std::span<SeqKv* const> seqs, KvCache& kv,
                      ThreadPool& pool);

  std::unique_ptr<GgufFile> file_;
  ModelConfig cfg_;
  ModelWeights w_;
  std::unique_ptr<Tokenizer> tok_;
  std::unique_ptr<Scratch> s_;
  std::unique_ptr<LatentScratch> latent_;  // latent attention models only
  KernelLevel level_ = KernelLevel::kScalar;
  RuntimeOptions opts_;
  struct FreeDeleter {
    void operator()(uint8_t* p) const;
  };
  struct Repacked {  // see kernels/layouts.h
    std::unique_ptr<uint8_t, FreeDeleter> owned;  // null when mapped from the cache file
    const uint8_t* buf;
    size_t bytes;
  };
  std::vector<Repacked> packed_;
  std::unique_ptr<RepackCache> repack_cache_;

  void prepack_weights(const RuntimeOptions& opts);
  std::string load_warning_;
  std::vector<double>* query_energy_ = nullptr;
  SparseCounts sparse_counts_;
  bool repack_cache_hit_ = false;

 public:
  // Bytes of weights held repacked in memory (instead of the file's pages).
  size_t packed_bytes() const;
  // Whether the repacked weights came from the repack cache's file.
  bool repack_cache_hit() const { return repack_cache_hit_; }
  // What the load had to do differently from what was asked (repacking
  // skipped for lack of memory), for the caller to show; "" when nothing.
  const std::string& load_warning() const { return load_warning_; }
  // The memory a decode step streams: every linear layer's and the output
  // matrix's bytes, where they are (repacked buffers, tiles, the mapping),
  // so a benchmark can time a plain read of the very same pages (of a MoE
  // layer: k experts, as many bytes as one row's picks).
  std::vector<std::span<const uint8_t>> decode_weight_regions() const;
};

}  // namespace tandem

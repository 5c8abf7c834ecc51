// What runs the engine's forward passes and holds the K/V they write: the
// model on this machine's cores over a KvCache, or on a GPU (src/cuda/).
// The engine decides which rows run and which blocks they use; an executor
// computes them where its weights and K/V live.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "kv/kv_cache.h"
#include "model/model.h"

namespace tandem {

class ThreadPool;

class Executor {
 public:
  virtual ~Executor() = default;
  // Model::forward's contract: the K/V of every row goes into its sequence's
  // blocks; rows that ask for logits get n_vocab floats each, in row order.
  virtual void forward(const Batch& batch, std::span<SeqKv* const> seqs, std::span<float> logits) = 0;
  // Block `dst` gets block `src`'s K/V (copy-on-write, sessions).
  virtual void copy_block(int32_t src, int32_t dst) = 0;
  // A block's K/V as block_bytes() bytes and back (swapping to host memory).
  virtual size_t block_bytes() const = 0;
  virtual void save_block(int32_t block, std::byte* out) = 0;
  virtual void load_block(int32_t block, const std::byte* in) = 0;
  // Slots [from, to) of block `dst` get block `src`'s (a streaming window
  // closing the gap it evicted).
  virtual void copy_slots(int32_t src, int32_t dst, int32_t from, int32_t to) = 0;
  // The keys of a sequence's slots [from, from + n), every layer (n x
  // n_layer x k_width floats, in the model's space), and back, slot i
  // rotated delta[i] positions further on (the keys a streaming window keeps
  // before the gap it evicts).
  virtual void read_keys(const SeqKv& seq, int32_t from, int32_t n, float* out) = 0;
  virtual void write_keys(const SeqKv& seq, int32_t from, int32_t n, const float* keys, const int32_t* delta) = 0;
  virtual size_t kv_bytes() const = 0;  // the whole pool
  virtual std::string device() const = 0;  // "cpu", "cuda:0 (NVIDIA H200)", ...
};

struct KvPlan {
  KvShape shape;
  int32_t n_blocks = 0;
  int32_t block_size = 16;
  KvFormat format;
  KvPaging paging;  // default: one group of every layer
  // The positions keys take (the context): a smoothed format's offsets keep
  // what RoPE turns little over them (model/key_smoothing.h). 0: the
  // model's training context.
  int32_t max_positions = 0;
  // Layers whose blocks keep key bounds (sparse attention: kv/key_bounds.h);
  // empty: none. The CPU runner only.
  std::vector<bool> key_bounds;
};

// The model on the pool's threads over a KvCache of the plan's size.
std::unique_ptr<Executor> make_cpu_executor(Model& model, const KvPlan& plan, ThreadPool& pool);
// The model on the first CUDA device, its weights uploaded once in their
// stored formats, its KV pool in device memory. Throws Error(kUnsupported)
// in a build without CUDA (-DTANDEM_CUDA=ON) or on a machine without a GPU.
std::unique_ptr<Executor> make_cuda_executor(Model& model, const KvPlan& plan);
// The first CUDA device's memory read bandwidth in GB/s (1e9 bytes): the
// best of a few plain reads of `bytes` with 16-byte loads. Throws like
// make_cuda_executor.
double cuda_read_bandwidth_gb_s(size_t bytes);

}  // namespace tandem

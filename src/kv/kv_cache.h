// The KV cache: keys and values of every layer, kept in fixed-size blocks of
// `block_size` token slots drawn from one pool. A sequence owns a block table
// (its blocks in position order), so attention always reads K/V through the
// table; how blocks are handed out (contiguously now, shared and paged by the
// serving engine) does not change the kernels.
//
// Elements are stored as f16 (the default, as in llama.cpp: half the memory
// and half the bytes decode attention streams) or f32. Rows are written from
// f32 with round-to-nearest-even; attention converts f16 back to f32 as it
// reads, so queries and all accumulation stay f32.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "kernels/attention_kv.h"

namespace tandem {

const char* kv_type_name(KvType t);          // "f16", "f32"
// Throws kInvalidArgument naming the value when it is neither "f16" nor "f32".
KvType parse_kv_type(std::string_view name);

struct KvShape {
  int32_t n_layer = 0;
  int32_t k_width = 0;  // n_head_kv * head_dim
  int32_t v_width = 0;  // n_head_kv * head_dim_v
  int32_t n_head_kv = 0;
};

class KvCache {
 public:
  // Throws kInvalidArgument for an empty pool or shape, kResource when the
  // pool cannot be allocated.
  KvCache(const KvShape& shape, int32_t n_blocks, int32_t block_size = 16, KvType type = KvType::kF16);

  const KvShape& shape() const { return shape_; }
  KvType type() const { return type_; }
  int32_t block_size() const { return block_size_; }
  int32_t n_blocks() const { return n_blocks_; }
  int32_t n_free() const { return static_cast<int32_t>(free_.size()); }
  size_t bytes() const { return bytes_per_token(shape_, type_) * size_t(n_blocks_) * block_size_; }
  static size_t bytes_per_token(const KvShape& s, KvType type) {
    return size_t(s.n_layer) * (s.k_width + s.v_width) * kv_type_size(type);
  }

  int32_t allocate();  // -1 when the pool is empty
  void release(int32_t block);

  // Stores one token's k (k_width floats) and v (v_width floats) in a slot,
  // converted to the cache's element type.
  void write(int32_t layer, int32_t block, int32_t slot, const float* k, const float* v);
  // Reads a slot back as f32 (for tests and tools; attention uses views).
  void read(int32_t layer, int32_t block, int32_t slot, float* k, float* v) const;

  // K/V bytes of one block over every layer and head.
  size_t block_bytes() const { return bytes_per_token(shape_, type_) * size_t(block_size_); }
  // Block `dst` gets block `src`'s K/V, bit for bit (copy-on-write).
  void copy_block(int32_t src, int32_t dst);
  // A block's K/V as block_bytes() bytes, and back (swapping a preempted
  // sequence out of the pool and in again). kInvalidArgument for a block
  // outside the pool.
  void save_block(int32_t block, std::byte* out) const;
  void load_block(int32_t block, const std::byte* in);

  KvLayerView layer_view(int32_t layer, const int32_t* blocks) const;

 private:
  void check_block(int32_t block) const;
  // Calls f(run, bytes) for each (layer, head) run of K and of V that
  // `block` holds, in one fixed order.
  template <typename F>
  void for_each_run(int32_t block, F&& f) const;
  // Elements of one head's K or V row.
  int32_t k_head() const { return shape_.k_width / shape_.n_head_kv; }
  int32_t v_head() const { return shape_.v_width / shape_.n_head_kv; }
  // Byte offset of head h's block (block_size * head elements): [layer][head][block].
  size_t block_offset(int32_t layer, int32_t block, int32_t h, int32_t head) const {
    return ((size_t(layer) * shape_.n_head_kv + h) * n_blocks_ + block) * block_size_ * size_t(head) *
           kv_type_size(type_);
  }
  // Byte offsets of a slot's key column (dimension 0; the next block_size
  // elements on) and of its value row, for head h.
  size_t key_offset(int32_t layer, int32_t block, int32_t slot, int32_t h) const {
    return block_offset(layer, block, h, k_head()) + size_t(slot) * kv_type_size(type_);
  }
  size_t value_offset(int32_t layer, int32_t block, int32_t slot, int32_t h) const {
    return block_offset(layer, block, h, v_head()) + size_t(slot) * v_head() * kv_type_size(type_);
  }
  KvShape shape_;
  int32_t n_blocks_;
  int32_t block_size_;
  KvType type_;
  struct Free {
    void operator()(std::byte* p) const;
  };
  std::unique_ptr<std::byte[], Free> k_, v_;
  std::vector<int32_t> free_;
};

// One sequence's share of the cache.
struct SeqKv {
  std::vector<int32_t> blocks;
  int32_t n_tokens = 0;  // positions [0, n_tokens) hold valid K/V

  // Makes room for positions up to `n` (exclusive). False when the pool ran out
  // (nothing is allocated then).
  bool reserve(KvCache& cache, int32_t n);
  void release(KvCache& cache);
};

}  // namespace tandem

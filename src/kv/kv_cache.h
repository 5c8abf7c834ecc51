// The KV cache: keys and values of every layer, kept in fixed-size blocks of
// `block_size` token slots drawn from one pool. A sequence owns a block table
// (its blocks in position order), so attention always reads K/V through the
// table; how blocks are handed out (contiguously now, shared and paged by the
// serving engine) does not change the kernels.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace tandem {

struct KvShape {
  int32_t n_layer = 0;
  int32_t k_width = 0;  // n_head_kv * head_dim
  int32_t v_width = 0;  // n_head_kv * head_dim_v
};

class KvCache {
 public:
  // Throws kResource when the pool cannot be allocated.
  KvCache(const KvShape& shape, int32_t n_blocks, int32_t block_size = 16);

  const KvShape& shape() const { return shape_; }
  int32_t block_size() const { return block_size_; }
  int32_t n_blocks() const { return n_blocks_; }
  int32_t n_free() const { return static_cast<int32_t>(free_.size()); }
  size_t bytes() const { return (k_.size() + v_.size()) * sizeof(float); }
  static size_t bytes_per_token(const KvShape& s) { return size_t(s.n_layer) * (s.k_width + s.v_width) * sizeof(float); }

  int32_t allocate();  // -1 when the pool is empty
  void release(int32_t block);

  // Row of one token slot.
  float* key(int32_t layer, int32_t block, int32_t slot) { return k_.data() + index(layer, block, slot, shape_.k_width); }
  float* value(int32_t layer, int32_t block, int32_t slot) { return v_.data() + index(layer, block, slot, shape_.v_width); }
  const float* layer_keys(int32_t layer) const { return k_.data() + index(layer, 0, 0, shape_.k_width); }
  const float* layer_values(int32_t layer) const { return v_.data() + index(layer, 0, 0, shape_.v_width); }

 private:
  size_t index(int32_t layer, int32_t block, int32_t slot, int32_t width) const {
    return ((size_t(layer) * n_blocks_ + block) * block_size_ + slot) * width;
  }
  KvShape shape_;
  int32_t n_blocks_;
  int32_t block_size_;
  std::vector<float> k_, v_;
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

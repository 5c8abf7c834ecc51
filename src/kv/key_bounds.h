// Per-block key bounds for sparse attention (Quest, docs/kv-cache.md): for
// each block, layer and KV head, the per-channel minimum and maximum of the
// block's keys as the cache stores them (dequantized, rotated and smoothed
// where the format does so: what attention reads). An upper bound of q.k
// over every key of the block is then sum_c max(q_c * min_c, q_c * max_c).
// They are stored as f16 rounded outward (minima down, maxima up), so the
// bound still holds at half the bytes that every decode step reads.
//
// The bounds are a property of the block, indexed by its id like its K/V:
// a block shared through the prefix cache shares them, a copied block gets a
// copy (KvCache::copy_block) and a block swapped back in has them recomputed
// (KvCache::load_block). They are written when a block's last slot is
// written (the model calls update() after the layer's writes), so only a
// full block's bounds are meaningful; a sequence's partial last block is
// always in its recent window and never ranked.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace tandem {

class KvCache;

class KeyBounds {
 public:
  // Bounds for the layers flagged in `layers` (the full-attention ones; the
  // others stay dense), n_head_kv heads of k_head channels, n_blocks blocks.
  // Throws kResource when they cannot be allocated.
  KeyBounds(const std::vector<bool>& layers, int32_t n_head_kv, int32_t k_head, int32_t n_blocks);

  bool has(int32_t layer) const { return layer >= 0 && layer < int32_t(index_.size()) && index_[layer] >= 0; }
  int32_t k_head() const { return k_head_; }
  // f16 values from one block's bounds to the next block's (min then max, k_head each).
  size_t block_stride() const { return size_t(2) * k_head_; }
  // Layer `layer` (has(layer)), head h: block b's minima at base + b * block_stride(),
  // its maxima k_head values further on.
  const uint16_t* base(int32_t layer, int32_t h) const {
    return data_.data() + (size_t(index_[layer]) * n_head_kv_ + h) * n_blocks_ * block_stride();
  }

  // Recomputes block `block`'s bounds of one layer (or of every layer kept)
  // from the keys `cache` holds there.
  void update(const KvCache& cache, int32_t layer, int32_t block);
  void update_all(const KvCache& cache, int32_t block);
  // Block dst gets block src's bounds.
  void copy(int32_t src, int32_t dst);

  size_t bytes() const { return data_.size() * sizeof(uint16_t); }
  // Bytes of one block's bounds over every layer kept.
  size_t bytes_per_block() const { return bytes_per_block(n_layers_, n_head_kv_, k_head_); }
  // The same for n_layers layers kept (what the KV pool's sizing counts).
  static size_t bytes_per_block(int32_t n_layers, int32_t n_head_kv, int32_t k_head) {
    return size_t(n_layers) * n_head_kv * 2 * k_head * sizeof(uint16_t);
  }

 private:
  std::vector<int32_t> index_;  // per layer: its place among the layers kept, or -1
  int32_t n_layers_ = 0, n_head_kv_ = 0, k_head_ = 0, n_blocks_ = 0;
  std::vector<uint16_t> data_;  // f16 [kept layer][head][block][min | max]
};

}  // namespace tandem

// What attention reads from the KV cache: the element type and one layer's
// view of one sequence's blocks. The types live here, below the cache
// (kv/kv_cache.h), which fills them.
#pragma once

#include <cstddef>
#include <cstdint>

namespace tandem {

enum class KvType : uint8_t { kF16, kF32 };

inline size_t kv_type_size(KvType t) { return t == KvType::kF16 ? 2 : 4; }

// Where one layer's K/V for one sequence live: what attention reads.
//
// Each KV head has its own region of the layer, [head][block][...]: one
// (sequence, KV head) unit of attention reads each block as one contiguous
// run (2 KiB of K for 16 slots of 64 f16), and consecutive blocks as one
// stream, which the hardware prefetcher follows (docs/architecture.md,
// "Invariants", has what the other arrangements cost).
//
// Within a block, K is stored transposed, [head_dim][slot], and V as rows,
// [slot][head_dim]: attention scores a query against the keys in vector
// lanes (dimension d of consecutive slots is one load, each score one FMA
// chain over d), and sums the values with the dimensions in the lanes.
struct KvLayerView {
  const void* keys = nullptr;    // layer base: [head][block][k_head][slot] of `type`
  const void* values = nullptr;  // layer base: [head][block][slot][v_head] of `type`
  KvType type = KvType::kF32;
  int32_t block_size = 0;
  int32_t n_blocks = 0;
  int32_t n_head_kv = 0;
  int32_t k_head = 0, v_head = 0;   // elements of one head's key / value
  const int32_t* blocks = nullptr;  // the sequence's block table

  // Element offset of the start of position pos's block of head h, blocks of
  // block_size * head elements.
  size_t block_index(int32_t pos, int32_t h, int32_t head) const {
    return (size_t(h) * n_blocks + blocks[pos / block_size]) * block_size * head;
  }
  // Dimension 0 of position pos's key for KV head h; dimension d is
  // block_size elements further on per step (T is float for kF32, uint16_t
  // for kF16).
  template <typename T>
  const T* key_column(int32_t pos, int32_t h) const {
    return static_cast<const T*>(keys) + block_index(pos, h, k_head) + pos % block_size;
  }
  // Position pos's value row for KV head h (v_head contiguous elements).
  template <typename T>
  const T* value(int32_t pos, int32_t h) const {
    return static_cast<const T*>(values) + block_index(pos, h, v_head) + size_t(pos % block_size) * v_head;
  }
};

}  // namespace tandem

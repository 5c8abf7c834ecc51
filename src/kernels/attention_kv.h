// What attention reads from the KV cache: the element types and one layer's
// view of one sequence's blocks. The types live here, below the cache
// (kv/kv_cache.h), which fills them.
#pragma once

#include <cstddef>
#include <cstdint>

namespace tandem {

// f32 and f16 store elements as they are; q8_0 and q4_0 store groups of 32
// elements along a head with one f16 scale each, as llama.cpp's cache types
// of those names do (34 and 18 bytes per 32 elements).
enum class KvType : uint8_t { kF16, kF32, kQ8_0, kQ4_0 };

inline constexpr int32_t kKvGroup = 32;  // elements per scale of the quantized types

constexpr bool kv_type_quantized(KvType t) { return t == KvType::kQ8_0 || t == KvType::kQ4_0; }

// Bytes of n elements of a head (n a multiple of kKvGroup for the quantized types).
inline size_t kv_bytes(KvType t, size_t n) {
  switch (t) {
    case KvType::kF32: return n * 4;
    case KvType::kF16: return n * 2;
    case KvType::kQ8_0: return n / kKvGroup * 34;
    case KvType::kQ4_0: return n / kKvGroup * 18;
  }
  return 0;
}

// Where one layer's K/V for one sequence live: what attention reads.
//
// Each KV head has its own region of the layer, [head][block][...]: one
// (sequence, KV head) unit of attention reads each block as one contiguous
// run (2 KiB of K for 16 slots of 64 f16), and consecutive blocks as one
// stream, which the hardware prefetcher follows (docs/architecture.md,
// "Invariants", has what the other arrangements cost).
//
// Within a block, K is stored transposed and V as rows: attention scores a
// query against the keys in vector lanes (dimension d of consecutive slots
// is one load, each score one FMA chain over d), and sums the values with the
// dimensions in the lanes. Quantized types keep four elements together in
// one 32-bit word, the operand of a 4-way integer dot product (vpdpbusd /
// pmaddubsw): four dimensions of a key, so a row of words is W keys x 4
// dimensions; four slots of a value dimension, so a row of words is W
// dimensions (two each for q4_0's nibbles) x 4 slots:
//   K f32/f16: [k_head][slot] elements.
//   K q8_0:    [k_head / 4][slot][4] int8, then [k_head / 32][slot] f16 scales.
//   K q4_0:    [k_head / 8][slot][4] bytes, byte b of word i holding
//              dimension 8i + b in its low nibble and 8i + 4 + b in its high
//              one (value + 8), then the scales as q8_0.
//   V f32/f16: [slot][v_head] elements.
//   V q8_0:    [slot / 4][v_head][4] int8, then [v_head / 32][slot] f16 scales.
//   V q4_0:    [slot / 4][v_head / 32][16][4] bytes: per group of 32
//              dimensions 16 words, byte b of word k holding slot 4i + b's
//              dimension k in its low nibble and k + 16 in its high one
//              (value + 8), then the scales as q8_0. A byte holds one slot,
//              so slots written by different threads never share one.
// The codes and scales are llama.cpp's block_q8_0 / block_q4_0 of the same
// 32 elements along a head, only placed differently.
struct KvLayerView {
  const std::byte* keys = nullptr;    // layer base: [head][block] regions of K
  const std::byte* values = nullptr;  // layer base: [head][block] regions of V
  KvType k_type = KvType::kF32, v_type = KvType::kF32;
  int32_t block_size = 0;
  int32_t n_blocks = 0;
  int32_t n_head_kv = 0;
  int32_t k_head = 0, v_head = 0;   // elements of one head's key / value
  const int32_t* blocks = nullptr;  // the sequence's block table
  // > 0: each KV head reads a table of its own, head h's at blocks + h *
  // head_table_stride (sparse attention's selected blocks, one list per head).
  int32_t head_table_stride = 0;
  const int32_t* table(int32_t h) const { return blocks + size_t(h) * head_table_stride; }

  // Bytes of one head's block of K / V.
  size_t k_region() const { return kv_bytes(k_type, size_t(block_size) * k_head); }
  size_t v_region() const { return kv_bytes(v_type, size_t(block_size) * v_head); }
  const std::byte* k_block(int32_t pos, int32_t h) const {
    return keys + (size_t(h) * n_blocks + table(h)[pos / block_size]) * k_region();
  }
  // Dimension 0 of position pos's key for KV head h; the next row of the
  // block (dimension 1) is block_size elements further on (T: float for
  // f32, uint16_t for f16).
  template <typename T>
  const T* key_column(int32_t pos, int32_t h) const {
    return reinterpret_cast<const T*>(k_block(pos, h)) + pos % block_size;
  }
  // A quantized key's first word (dimensions 0-3, or 0-3 and 4-7 for q4_0);
  // the next row of words is 4 * block_size bytes further on.
  const uint8_t* key_words(int32_t pos, int32_t h) const {
    return reinterpret_cast<const uint8_t*>(k_block(pos, h)) + size_t(pos % block_size) * 4;
  }
  // Scale of group 0 of a quantized key; group g is g * block_size further on.
  const uint16_t* key_scales(int32_t pos, int32_t h) const {
    const size_t value_bytes = k_type == KvType::kQ4_0 ? size_t(k_head) / 2 : size_t(k_head);
    return reinterpret_cast<const uint16_t*>(k_block(pos, h) + value_bytes * block_size) + pos % block_size;
  }
  // Position pos's value row for KV head h (f32 / f16).
  template <typename T>
  const T* value(int32_t pos, int32_t h) const {
    return reinterpret_cast<const T*>(v_block(pos, h) + size_t(pos % block_size) * kv_bytes(v_type, v_head));
  }
  const std::byte* v_block(int32_t pos, int32_t h) const {
    return values + (size_t(h) * n_blocks + table(h)[pos / block_size]) * v_region();
  }
  // Quantized values: the row of words holding pos (pos a multiple of 4),
  // and pos's scale of group 0 (group g is g * block_size further on).
  const uint8_t* value_words(int32_t pos, int32_t h) const {
    const size_t row = v_type == KvType::kQ4_0 ? size_t(v_head) * 2 : size_t(v_head) * 4;
    return reinterpret_cast<const uint8_t*>(v_block(pos, h)) + size_t(pos % block_size / 4) * row;
  }
  const uint16_t* value_scales(int32_t pos, int32_t h) const {
    const size_t value_bytes = v_type == KvType::kQ4_0 ? size_t(v_head) / 2 : size_t(v_head);
    return reinterpret_cast<const uint16_t*>(v_block(pos, h) + value_bytes * block_size) + pos % block_size;
  }
};

}  // namespace tandem

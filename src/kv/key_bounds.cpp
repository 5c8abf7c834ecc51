#include "kv/key_bounds.h"

#include <algorithm>
#include <cstring>
#include <new>

#include "core/error.h"
#include "kv/kv_cache.h"
#include "quant/quant.h"

namespace tandem {
namespace {

// The f16 nearest to x on the side away from the block's keys: the largest
// not above x (down) or the smallest not below it (up). f16 steps by one
// unit of its bit pattern, whose direction depends on the sign.
uint16_t f16_down(float x) {
  uint16_t h = f32_to_f16(x);
  if (f16_to_f32(h) <= x) return h;
  if (h == 0x0000) return 0x8001;  // +0 -> the smallest negative
  return (h & 0x8000) ? uint16_t(h + 1) : uint16_t(h - 1);
}
uint16_t f16_up(float x) {
  uint16_t h = f32_to_f16(x);
  if (f16_to_f32(h) >= x) return h;
  if (h == 0x8000) return 0x0001;  // -0 -> the smallest positive
  return (h & 0x8000) ? uint16_t(h - 1) : uint16_t(h + 1);
}

}  // namespace

KeyBounds::KeyBounds(const std::vector<bool>& layers, int32_t n_head_kv, int32_t k_head, int32_t n_blocks)
    : index_(layers.size(), -1), n_head_kv_(n_head_kv), k_head_(k_head), n_blocks_(n_blocks) {
  for (size_t l = 0; l < layers.size(); ++l)
    if (layers[l]) index_[l] = n_layers_++;
  try {
    data_.assign(size_t(n_layers_) * n_head_kv_ * n_blocks_ * block_stride(), 0);
  } catch (const std::bad_alloc&) {
    fail(ErrorKind::kResource, "cannot allocate {} MiB of key bounds for sparse attention",
         size_t(n_layers_) * n_head_kv_ * n_blocks_ * block_stride() * sizeof(uint16_t) >> 20);
  }
}

void KeyBounds::update(const KvCache& cache, int32_t layer, int32_t block) {
  if (!has(layer)) return;
  const KvShape& s = cache.shape();
  // The whole row of every head, as attention reads it (values come along).
  std::vector<float> k(size_t(s.k_width)), v(size_t(s.v_width));
  std::vector<float> lo(size_t(s.k_width), 0.0f), hi(size_t(s.k_width), 0.0f);
  for (int32_t slot = 0; slot < cache.block_size(); ++slot) {
    cache.read(layer, block, slot, k.data(), v.data());
    for (int32_t i = 0; i < s.k_width; ++i) {
      lo[i] = slot == 0 ? k[i] : std::min(lo[i], k[i]);
      hi[i] = slot == 0 ? k[i] : std::max(hi[i], k[i]);
    }
  }
  for (int32_t h = 0; h < n_head_kv_; ++h) {
    uint16_t* out = data_.data() + ((size_t(index_[layer]) * n_head_kv_ + h) * n_blocks_ + block) * block_stride();
    for (int32_t c = 0; c < k_head_; ++c) {
      out[c] = f16_down(lo[size_t(h) * k_head_ + c]);
      out[k_head_ + c] = f16_up(hi[size_t(h) * k_head_ + c]);
    }
  }
}

void KeyBounds::update_all(const KvCache& cache, int32_t block) {
  for (int32_t l = 0; l < int32_t(index_.size()); ++l) update(cache, l, block);
}

void KeyBounds::copy(int32_t src, int32_t dst) {
  for (int32_t l = 0; l < n_layers_; ++l)
    for (int32_t h = 0; h < n_head_kv_; ++h) {
      uint16_t* b = data_.data() + (size_t(l) * n_head_kv_ + h) * n_blocks_ * block_stride();
      std::memcpy(b + size_t(dst) * block_stride(), b + size_t(src) * block_stride(), block_stride() * sizeof(uint16_t));
    }
}

}  // namespace tandem

#include "kv/kv_cache.h"

#include <cstdlib>
#include <cstring>

#include "core/cpu_features.h"
#include "core/error.h"
#include "core/quant.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace tandem {
namespace {

void to_f16_scalar(const float* x, uint16_t* y, int32_t n) {
  for (int32_t i = 0; i < n; ++i) y[i] = f32_to_f16(x[i]);
}

#if defined(__x86_64__)
// The hardware conversion rounds to nearest even like f32_to_f16, so both
// give the same bits for every non-NaN input; this one is just faster for
// prefill, which writes n_layer * (k_width + v_width) values per token.
__attribute__((target("avx,f16c"))) void to_f16_f16c(const float* x, uint16_t* y, int32_t n) {
  int32_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(y + i), _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
  to_f16_scalar(x + i, y + i, n - i);
}
#endif

void to_f16(const float* x, uint16_t* y, int32_t n) {
#if defined(__x86_64__)
  static const bool f16c = cpu_features().f16c;
  if (f16c) return to_f16_f16c(x, y, n);
#endif
  to_f16_scalar(x, y, n);
}

void store_row(KvType type, const float* x, std::byte* dst, int32_t n) {
  if (type == KvType::kF32)
    std::memcpy(dst, x, size_t(n) * sizeof(float));
  else
    to_f16(x, reinterpret_cast<uint16_t*>(dst), n);
}

// K's column layout: element i of x to dst + i * stride elements.
void store_column(KvType type, const float* x, std::byte* dst, int32_t n, int32_t stride) {
  if (type == KvType::kF32) {
    auto* f = reinterpret_cast<float*>(dst);
    for (int32_t i = 0; i < n; ++i) f[size_t(i) * stride] = x[i];
    return;
  }
  auto* h = reinterpret_cast<uint16_t*>(dst);
  uint16_t tmp[64];
  for (int32_t i0 = 0; i0 < n; i0 += 64) {
    const int32_t m = n - i0 < 64 ? n - i0 : 64;
    to_f16(x + i0, tmp, m);
    for (int32_t i = 0; i < m; ++i) h[size_t(i0 + i) * stride] = tmp[i];
  }
}

void load_column(KvType type, const std::byte* src, float* x, int32_t n, int32_t stride) {
  if (type == KvType::kF32) {
    const auto* f = reinterpret_cast<const float*>(src);
    for (int32_t i = 0; i < n; ++i) x[i] = f[size_t(i) * stride];
    return;
  }
  const auto* h = reinterpret_cast<const uint16_t*>(src);
  for (int32_t i = 0; i < n; ++i) x[i] = f16_to_f32(h[size_t(i) * stride]);
}

void load_row(KvType type, const std::byte* src, float* x, int32_t n) {
  if (type == KvType::kF32) {
    std::memcpy(x, src, size_t(n) * sizeof(float));
    return;
  }
  const auto* h = reinterpret_cast<const uint16_t*>(src);
  for (int32_t i = 0; i < n; ++i) x[i] = f16_to_f32(h[i]);
}

}  // namespace

void KvCache::Free::operator()(std::byte* p) const { std::free(p); }

const char* kv_type_name(KvType t) { return t == KvType::kF16 ? "f16" : "f32"; }

KvType parse_kv_type(std::string_view name) {
  if (name == "f16") return KvType::kF16;
  if (name == "f32") return KvType::kF32;
  fail(ErrorKind::kInvalidArgument, "unknown KV cache type '{}' (expected f16 or f32)", name);
}

KvCache::KvCache(const KvShape& shape, int32_t n_blocks, int32_t block_size, KvType type)
    : shape_(shape), n_blocks_(n_blocks), block_size_(block_size), type_(type) {
  if (n_blocks <= 0 || block_size <= 0)
    fail(ErrorKind::kInvalidArgument, "KV cache needs at least one block (got {} blocks of {})", n_blocks,
         block_size);
  if (shape.n_layer <= 0 || shape.k_width <= 0 || shape.v_width <= 0 || shape.n_head_kv <= 0)
    fail(ErrorKind::kInvalidArgument,
         "KV cache shape needs positive sizes (n_layer {}, k_width {}, v_width {}, n_head_kv {})", shape.n_layer,
         shape.k_width, shape.v_width, shape.n_head_kv);
  if (shape.k_width % shape.n_head_kv != 0 || shape.v_width % shape.n_head_kv != 0)
    fail(ErrorKind::kInvalidArgument, "KV cache widths {} and {} do not split into {} heads", shape.k_width,
         shape.v_width, shape.n_head_kv);
  if (type != KvType::kF16 && type != KvType::kF32)
    fail(ErrorKind::kInvalidArgument, "unknown KV cache type {}", static_cast<int>(type));
  const size_t tokens = size_t(n_blocks) * block_size;
  size_t slots = 0, per = 0, total = 0;
  if (__builtin_mul_overflow(tokens, size_t(shape.n_layer), &slots) ||
      __builtin_mul_overflow(slots, kv_type_size(type), &per) ||
      __builtin_mul_overflow(per, size_t(shape.k_width) + shape.v_width, &total))
    fail(ErrorKind::kResource, "a KV cache of {} tokens x {} layers does not fit in memory", tokens, shape.n_layer);
  // calloc: an unwritten slot reads as zeros, and the OS hands out zeroed
  // pages lazily, so memory is committed as the context fills, not up front.
  k_.reset(static_cast<std::byte*>(std::calloc(per, shape.k_width)));
  v_.reset(static_cast<std::byte*>(std::calloc(per, shape.v_width)));
  if (!k_ || !v_) {
    fail(ErrorKind::kResource, "cannot allocate a {} KV cache of {} tokens ({} MiB)", kv_type_name(type), tokens,
         tokens * bytes_per_token(shape, type) >> 20);
  }
  free_.reserve(n_blocks);
  for (int32_t b = n_blocks - 1; b >= 0; --b) free_.push_back(b);
}

int32_t KvCache::allocate() {
  if (free_.empty()) return -1;
  int32_t b = free_.back();
  free_.pop_back();
  return b;
}

void KvCache::release(int32_t block) { free_.push_back(block); }

void KvCache::write(int32_t layer, int32_t block, int32_t slot, const float* k, const float* v) {
  const int32_t kh = k_head(), vh = v_head();
  for (int32_t h = 0; h < shape_.n_head_kv; ++h) {
    store_column(type_, k + h * kh, k_.get() + key_offset(layer, block, slot, h), kh, block_size_);
    store_row(type_, v + h * vh, v_.get() + value_offset(layer, block, slot, h), vh);
  }
}

void KvCache::read(int32_t layer, int32_t block, int32_t slot, float* k, float* v) const {
  const int32_t kh = k_head(), vh = v_head();
  for (int32_t h = 0; h < shape_.n_head_kv; ++h) {
    load_column(type_, k_.get() + key_offset(layer, block, slot, h), k + h * kh, kh, block_size_);
    load_row(type_, v_.get() + value_offset(layer, block, slot, h), v + h * vh, vh);
  }
}

void KvCache::check_block(int32_t block) const {
  if (block < 0 || block >= n_blocks_)
    fail(ErrorKind::kInvalidArgument, "KV block {} is outside the pool of {}", block, n_blocks_);
}

template <typename F>
void KvCache::for_each_run(int32_t block, F&& f) const {
  check_block(block);
  const size_t esize = kv_type_size(type_);
  const size_t k_run = size_t(block_size_) * k_head() * esize, v_run = size_t(block_size_) * v_head() * esize;
  for (int32_t l = 0; l < shape_.n_layer; ++l)
    for (int32_t h = 0; h < shape_.n_head_kv; ++h) {
      f(k_.get() + block_offset(l, block, h, k_head()), k_run);
      f(v_.get() + block_offset(l, block, h, v_head()), v_run);
    }
}

void KvCache::copy_block(int32_t src, int32_t dst) {
  check_block(dst);
  // A run of block dst lies (dst - src) runs of its kind after src's.
  const ptrdiff_t blocks_apart = ptrdiff_t(dst) - src;
  for_each_run(src, [&](std::byte* run, size_t n) { std::memcpy(run + blocks_apart * ptrdiff_t(n), run, n); });
}

void KvCache::save_block(int32_t block, std::byte* out) const {
  for_each_run(block, [&](const std::byte* run, size_t n) {
    std::memcpy(out, run, n);
    out += n;
  });
}

void KvCache::load_block(int32_t block, const std::byte* in) {
  for_each_run(block, [&](std::byte* run, size_t n) {
    std::memcpy(run, in, n);
    in += n;
  });
}

KvLayerView KvCache::layer_view(int32_t layer, const int32_t* blocks) const {
  KvLayerView view;
  view.keys = k_.get() + key_offset(layer, 0, 0, 0);
  view.values = v_.get() + value_offset(layer, 0, 0, 0);
  view.type = type_;
  view.block_size = block_size_;
  view.n_blocks = n_blocks_;
  view.n_head_kv = shape_.n_head_kv;
  view.k_head = k_head();
  view.v_head = v_head();
  view.blocks = blocks;
  return view;
}

bool SeqKv::reserve(KvCache& cache, int32_t n) {
  const int32_t need = (n + cache.block_size() - 1) / cache.block_size() - static_cast<int32_t>(blocks.size());
  if (need <= 0) return true;
  if (need > cache.n_free()) return false;
  for (int32_t i = 0; i < need; ++i) blocks.push_back(cache.allocate());
  return true;
}

void SeqKv::release(KvCache& cache) {
  for (int32_t b : blocks) cache.release(b);
  blocks.clear();
  n_tokens = 0;
}

}  // namespace tandem

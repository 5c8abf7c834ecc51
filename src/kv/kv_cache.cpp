#include "kv/kv_cache.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <tuple>
#include <vector>
#include <cstring>
#include <utility>

#include "runtime/cpu_features.h"
#include "core/error.h"
#include "quant/ggml_type.h"
#include "quant/quant.h"
#include "quant/quant_blocks.h"

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

// One head's key into its block region, slot `slot` of `bs` (the transposed
// layouts of attention_kv.h).
void store_key(KvType type, const float* x, std::byte* region, int32_t slot, int32_t n, int32_t bs) {
  switch (type) {
    case KvType::kF32: {
      auto* f = reinterpret_cast<float*>(region) + slot;
      for (int32_t i = 0; i < n; ++i) f[size_t(i) * bs] = x[i];
      return;
    }
    case KvType::kF16: {
      auto* h = reinterpret_cast<uint16_t*>(region) + slot;
      uint16_t tmp[64];
      for (int32_t i0 = 0; i0 < n; i0 += 64) {
        const int32_t m = n - i0 < 64 ? n - i0 : 64;
        to_f16(x + i0, tmp, m);
        for (int32_t i = 0; i < m; ++i) h[size_t(i0 + i) * bs] = tmp[i];
      }
      return;
    }
    case KvType::kQ8_0: {
      // llama.cpp's quantizer on the row, then its bytes scattered: four
      // dimensions to a word, [k_head / 4][slot][4].
      thread_local std::vector<BlockQ8_0> q;
      q.resize(size_t(n) / kQK);
      quantize_row(GgmlType::Q8_0, x, q.data(), n);
      auto* vals = reinterpret_cast<int8_t*>(region) + size_t(slot) * 4;
      auto* scales = reinterpret_cast<uint16_t*>(region + size_t(n) * bs) + slot;
      for (size_t g = 0; g < q.size(); ++g) {
        scales[g * bs] = q[g].d;
        for (int32_t j = 0; j < kQK; ++j) {
          const size_t d = g * kQK + j;
          vals[d / 4 * 4 * bs + d % 4] = q[g].qs[j];
        }
      }
      return;
    }
    case KvType::kQ4_0: {
      // Word i of a slot: byte b holds dimension 8i + b (low nibble) and
      // 8i + 4 + b (high nibble).
      thread_local std::vector<BlockQ4_0> q;
      q.resize(size_t(n) / kQK);
      quantize_row(GgmlType::Q4_0, x, q.data(), n);
      auto* vals = reinterpret_cast<uint8_t*>(region) + size_t(slot) * 4;
      auto* scales = reinterpret_cast<uint16_t*>(region + size_t(n) / 2 * bs) + slot;
      auto nib = [](const BlockQ4_0& b, int32_t j) { return j < 16 ? b.qs[j] & 15 : b.qs[j - 16] >> 4; };
      for (size_t g = 0; g < q.size(); ++g) {
        scales[g * bs] = q[g].d;
        for (int32_t j = 0; j < kQK; j += 8)
          for (int32_t b = 0; b < 4; ++b)
            vals[(g * kQK + j) / 8 * 4 * bs + b] = static_cast<uint8_t>(nib(q[g], j + b) | nib(q[g], j + 4 + b) << 4);
      }
      return;
    }
  }
}

void load_key(KvType type, const std::byte* region, int32_t slot, float* x, int32_t n, int32_t bs) {
  switch (type) {
    case KvType::kF32: {
      const auto* f = reinterpret_cast<const float*>(region) + slot;
      for (int32_t i = 0; i < n; ++i) x[i] = f[size_t(i) * bs];
      return;
    }
    case KvType::kF16: {
      const auto* h = reinterpret_cast<const uint16_t*>(region) + slot;
      for (int32_t i = 0; i < n; ++i) x[i] = f16_to_f32(h[size_t(i) * bs]);
      return;
    }
    case KvType::kQ8_0: {
      const auto* vals = reinterpret_cast<const int8_t*>(region) + size_t(slot) * 4;
      const auto* scales = reinterpret_cast<const uint16_t*>(region + size_t(n) * bs) + slot;
      for (int32_t i = 0; i < n; ++i)
        x[i] = f16_to_f32(scales[size_t(i / kQK) * bs]) * vals[size_t(i / 4) * 4 * bs + i % 4];
      return;
    }
    case KvType::kQ4_0: {
      const auto* vals = reinterpret_cast<const uint8_t*>(region) + size_t(slot) * 4;
      const auto* scales = reinterpret_cast<const uint16_t*>(region + size_t(n) / 2 * bs) + slot;
      for (int32_t i = 0; i < n; ++i) {
        const uint8_t b = vals[size_t(i / 8) * 4 * bs + i % 4];
        x[i] = f16_to_f32(scales[size_t(i / kQK) * bs]) * ((i % 8 < 4 ? b & 15 : b >> 4) - 8);
      }
      return;
    }
  }
}

// Quantized V keeps four slots of a dimension together in one 32-bit word
// (attention_kv.h): the byte of (slot, dimension) in a head's block region of
// n dimensions, and for q4_0 the nibble's shift (a q4_0 byte holds
// dimensions d and d + 16 of a group, both of one slot).
size_t value_byte(KvType type, int32_t slot, int32_t d, int32_t n) {
  if (type == KvType::kQ4_0) return size_t(slot / 4) * 2 * n + size_t(d / 32) * 64 + size_t(d % 16) * 4 + slot % 4;
  return size_t(slot / 4) * 4 * n + size_t(d) * 4 + slot % 4;
}
int value_shift(KvType type, int32_t d) { return type == KvType::kQ4_0 && d % 32 >= 16 ? 4 : 0; }
// Where a quantized V region's f16 scales start: after its codes.
size_t value_scales_at(KvType type, int32_t n, int32_t bs) {
  return type == KvType::kQ4_0 ? size_t(n) * bs / 2 : size_t(n) * bs;
}

// A quantized value: llama.cpp's quantizer on the row, then its code bytes
// scattered (a q4_0 block's byte j holds elements j and j + 16, as a q4_0
// value byte here does).
template <typename Block>
void store_value_blocks(KvType type, GgmlType gt, const float* x, std::byte* region, int32_t slot, int32_t n,
                        int32_t bs) {
  thread_local std::vector<Block> q;
  q.resize(size_t(n) / kQK);
  quantize_row(gt, x, q.data(), n);
  auto* vals = reinterpret_cast<uint8_t*>(region);
  auto* scales = reinterpret_cast<uint16_t*>(region + value_scales_at(type, n, bs)) + slot;
  for (size_t g = 0; g < q.size(); ++g) {
    scales[g * bs] = q[g].d;
    for (int32_t j = 0; j < int32_t(sizeof(q[g].qs)); ++j)
      vals[value_byte(type, slot, int32_t(g) * kQK + j, n)] = static_cast<uint8_t>(q[g].qs[j]);
  }
}

// One head's value into its block region, slot `slot` of `bs`: rows of
// elements for f32 / f16, the slot-word layout for the quantized types.
void store_value(KvType type, const float* x, std::byte* region, int32_t slot, int32_t n, int32_t bs) {
  switch (type) {
    case KvType::kF32: std::memcpy(region + size_t(slot) * n * 4, x, size_t(n) * sizeof(float)); return;
    case KvType::kF16: to_f16(x, reinterpret_cast<uint16_t*>(region) + size_t(slot) * n, n); return;
    case KvType::kQ8_0: return store_value_blocks<BlockQ8_0>(type, GgmlType::Q8_0, x, region, slot, n, bs);
    case KvType::kQ4_0: return store_value_blocks<BlockQ4_0>(type, GgmlType::Q4_0, x, region, slot, n, bs);
  }
}

void load_value(KvType type, const std::byte* region, int32_t slot, float* x, int32_t n, int32_t bs) {
  switch (type) {
    case KvType::kF32: std::memcpy(x, region + size_t(slot) * n * 4, size_t(n) * sizeof(float)); return;
    case KvType::kF16: {
      const auto* h = reinterpret_cast<const uint16_t*>(region) + size_t(slot) * n;
      for (int32_t i = 0; i < n; ++i) x[i] = f16_to_f32(h[i]);
      return;
    }
    case KvType::kQ8_0:
    case KvType::kQ4_0: {
      const auto* vals = reinterpret_cast<const uint8_t*>(region);
      const auto* scales = reinterpret_cast<const uint16_t*>(region + value_scales_at(type, n, bs)) + slot;
      for (int32_t i = 0; i < n; ++i) {
        const uint8_t b = vals[value_byte(type, slot, i, n)];
        const int32_t v = type == KvType::kQ4_0 ? (b >> value_shift(type, i) & 15) - 8 : static_cast<int8_t>(b);
        x[i] = f16_to_f32(scales[size_t(i / kQK) * bs]) * static_cast<float>(v);
      }
      return;
    }
  }
}

// Slots [from, to) of one head's quantized V region, codes and scales.
void copy_value_slots(KvType type, const std::byte* src, std::byte* dst, int32_t from, int32_t to, int32_t n,
                      int32_t bs) {
  const auto* vs = reinterpret_cast<const uint8_t*>(src);
  auto* vd = reinterpret_cast<uint8_t*>(dst);
  const auto* ss = reinterpret_cast<const uint16_t*>(src + value_scales_at(type, n, bs));
  auto* sd = reinterpret_cast<uint16_t*>(dst + value_scales_at(type, n, bs));
  for (int32_t s = from; s < to; ++s) {
    for (int32_t d = 0; d < n; ++d) vd[value_byte(type, s, d, n)] = vs[value_byte(type, s, d, n)];
    for (int32_t g = 0; g < n / kQK; ++g) sd[size_t(g) * bs + s] = ss[size_t(g) * bs + s];
  }
}

}  // namespace

void KvCache::Free::operator()(std::byte* p) const { std::free(p); }

const char* kv_type_name(KvType t) {
  switch (t) {
    case KvType::kF16: return "f16";
    case KvType::kF32: return "f32";
    case KvType::kQ8_0: return "q8_0";
    case KvType::kQ4_0: return "q4_0";
  }
  return "?";
}

KvType parse_kv_type(std::string_view name) {
  for (KvType t : {KvType::kF16, KvType::kF32, KvType::kQ8_0, KvType::kQ4_0})
    if (name == kv_type_name(t)) return t;
  fail(ErrorKind::kInvalidArgument, "unknown KV cache type '{}' (expected f16, f32, q8_0 or q4_0)", name);
}

const char* kv_rotation_name(KvRotation r) {
  return r == KvRotation::kAuto ? "auto" : r == KvRotation::kOff ? "off" : "all";
}

KvRotation parse_kv_rotation(std::string_view name) {
  for (KvRotation r : {KvRotation::kAuto, KvRotation::kOff, KvRotation::kAll})
    if (name == kv_rotation_name(r)) return r;
  fail(ErrorKind::kInvalidArgument, "unknown KV rotation '{}' (expected auto, off or all)", name);
}

KvFormat kv_format(const KvCacheTypes& t) {
  // 4-bit elements lose the most to outlier dimensions (QuaRot; llama.cpp
  // rotates its quantized caches); docs/kv-cache.md has what rotating each
  // part measured.
  auto rotate = [&](KvType x) {
    if (t.rotation == KvRotation::kAuto) return x == KvType::kQ4_0;
    return t.rotation == KvRotation::kAll && kv_type_quantized(x);
  };
  // Smoothing takes three quarters of q4_0 keys' loss on Gemma 3, and half
  // of what q8_0's costs over the f32 floor (docs/kv-cache.md, "Smoothing").
  return KvFormat{t.k, t.v, rotate(t.k), rotate(t.v), t.smooth_keys && kv_type_quantized(t.k)};
}

std::string kv_format_name(const KvFormat& f) {
  if (f.k == f.v) return kv_type_name(f.k);
  return std::string("k ") + kv_type_name(f.k) + " / v " + kv_type_name(f.v);
}

void hadamard_rotate(float* x, int32_t n) {
  const int32_t p = n & -n;  // largest power of two dividing n
  const float norm = 1.0f / std::sqrt(static_cast<float>(p));
  for (int32_t b = 0; b < n; b += p) {
    float* y = x + b;
    for (int32_t len = 1; len < p; len *= 2)
      for (int32_t i = 0; i < p; i += 2 * len)
        for (int32_t j = i; j < i + len; ++j) {
          const float a = y[j], c = y[j + len];
          y[j] = a + c;
          y[j + len] = a - c;
        }
    for (int32_t i = 0; i < p; ++i) y[i] *= norm;
  }
}

KvPaging kv_paging(int32_t n_layer) {
  KvPaging p;
  p.layers_per_page = n_layer;
  p.group.assign(size_t(std::max(0, n_layer)), 0);
  p.slot.resize(p.group.size());
  for (int32_t l = 0; l < n_layer; ++l) p.slot[l] = l;
  return p;
}

KvPaging kv_paging(const std::vector<bool>& layer_windowed, int32_t window) {
  const int32_t n_layer = static_cast<int32_t>(layer_windowed.size());
  const int32_t n_full = static_cast<int32_t>(std::count(layer_windowed.begin(), layer_windowed.end(), false));
  // Without both kinds (or without a window) one group is all there is.
  if (window <= 0 || n_full == 0 || n_full == n_layer) return kv_paging(n_layer);
  KvPaging p;
  p.layers_per_page = n_full;
  p.window = window;
  p.group.resize(size_t(n_layer));
  p.slot.resize(size_t(n_layer));
  int32_t full = 0, windowed = 0;
  for (int32_t l = 0; l < n_layer; ++l) {
    if (!layer_windowed[l]) {
      p.group[l] = 0;
      p.slot[l] = full++;
    } else {
      p.group[l] = 1 + windowed / n_full;
      p.slot[l] = windowed % n_full;
      ++windowed;
    }
  }
  p.n_groups = 1 + (windowed + n_full - 1) / n_full;
  return p;
}

KvCache::KvCache(const KvShape& shape, int32_t n_blocks, int32_t block_size, const KvFormat& format, KvPaging paging)
    : shape_(shape), n_blocks_(n_blocks), block_size_(block_size), format_(format), paging_(std::move(paging)) {
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
  for (auto [type, head, what] : {std::tuple{format.k, k_head(), "K"}, {format.v, v_head(), "V"}}) {
    if (type != KvType::kF16 && type != KvType::kF32 && !kv_type_quantized(type))
      fail(ErrorKind::kInvalidArgument, "unknown KV cache type {}", static_cast<int>(type));
    if (!kv_type_quantized(type)) continue;
    if (head % kKvGroup != 0)
      fail(ErrorKind::kInvalidArgument,
           "KV cache type {} for {} needs heads of a multiple of {} elements; this model's heads have {} elements (use f16)",
           kv_type_name(type), what, kKvGroup, head);
    if (block_size % 16 != 0)
      fail(ErrorKind::kInvalidArgument, "KV cache type {} needs blocks of a multiple of 16 slots, not {}",
           kv_type_name(type), block_size);
  }
  // Every layer's K and V for every slot, an upper bound of what the pages
  // hold, checked before anything is sized by the shape (the default page
  // table has an entry per layer): an impossible shape fails here at once.
  const size_t tokens = size_t(n_blocks) * block_size;
  size_t per_token = 0, bound = 0;
  if (__builtin_add_overflow(kv_bytes(format.k, shape.k_width), kv_bytes(format.v, shape.v_width), &per_token) ||
      __builtin_mul_overflow(per_token, size_t(shape.n_layer), &bound) ||
      __builtin_mul_overflow(bound, tokens, &bound))
    fail(ErrorKind::kResource, "a KV cache of {} tokens x {} layers does not fit in memory", tokens, shape.n_layer);
  if (paging_.layers_per_page == 0) paging_ = kv_paging(shape.n_layer);
  bool covered = paging_.layers_per_page > 0 && paging_.n_groups >= 1 &&
                 paging_.group.size() == size_t(shape.n_layer) && paging_.slot.size() == size_t(shape.n_layer);
  for (int32_t l = 0; covered && l < shape.n_layer; ++l)
    covered = paging_.group[l] >= 0 && paging_.group[l] < paging_.n_groups && paging_.slot[l] >= 0 &&
              paging_.slot[l] < paging_.layers_per_page;
  if (!covered)
    fail(ErrorKind::kInvalidArgument, "KV cache paging does not place each of the {} layers on a page",
         shape.n_layer);
  const size_t lp = size_t(paging_.layers_per_page);
  size_t k_total = 0, v_total = 0;
  if (__builtin_mul_overflow(tokens, lp * kv_bytes(format.k, shape.k_width), &k_total) ||
      __builtin_mul_overflow(tokens, lp * kv_bytes(format.v, shape.v_width), &v_total))
    fail(ErrorKind::kResource, "a KV cache of {} tokens x {} layers does not fit in memory", tokens, shape.n_layer);
  // calloc: an unwritten slot reads as zeros, and the OS hands out zeroed
  // pages lazily, so memory is committed as the context fills, not up front.
  k_.reset(static_cast<std::byte*>(std::calloc(k_total, 1)));
  v_.reset(static_cast<std::byte*>(std::calloc(v_total, 1)));
  if (!k_ || !v_) {
    fail(ErrorKind::kResource, "cannot allocate a {} KV cache of {} tokens ({} MiB)", kv_format_name(format), tokens,
         (k_total + v_total) >> 20);
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

namespace {

// A head of n elements as stored: itself, or H times it in a per-thread
// buffer (valid until the next call).
const float* as_stored(const float* x, int32_t n, bool rotate) {
  if (!rotate) return x;
  thread_local std::vector<float> tmp;
  tmp.assign(x, x + n);
  hadamard_rotate(tmp.data(), n);
  return tmp.data();
}

}  // namespace

void KvCache::write(int32_t layer, int32_t block, int32_t slot, const float* k, const float* v) {
  write_key(layer, block, slot, k);
  const int32_t vh = v_head();
  for (int32_t h = 0; h < shape_.n_head_kv; ++h)
    store_value(format_.v, as_stored(v + h * vh, vh, format_.rotate_v),
                v_.get() + v_offset(paging_.slot[layer], block, h), slot, vh, block_size_);
}

void KvCache::read(int32_t layer, int32_t block, int32_t slot, float* k, float* v) const {
  const int32_t kh = k_head(), vh = v_head();
  for (int32_t h = 0; h < shape_.n_head_kv; ++h) {
    const int32_t j = paging_.slot[layer];
    load_key(format_.k, k_.get() + k_offset(j, block, h), slot, k + h * kh, kh, block_size_);
    load_value(format_.v, v_.get() + v_offset(j, block, h), slot, v + h * vh, vh, block_size_);
  }
}

void KvCache::read_key(int32_t layer, int32_t block, int32_t slot, float* k) const {
  check_block(block);
  const int32_t kh = k_head();
  for (int32_t h = 0; h < shape_.n_head_kv; ++h) {
    load_key(format_.k, k_.get() + k_offset(paging_.slot[layer], block, h), slot, k + h * kh, kh, block_size_);
    if (format_.rotate_k) hadamard_rotate(k + h * kh, kh);  // H is its own inverse
  }
  if (!smoothing_.offset.empty()) {
    const size_t at = size_t(layer) * shape_.k_width;
    const float *mu = smoothing_.offset.data() + at, *inv = inv_scale_.data() + at;
    for (int32_t i = 0; i < shape_.k_width; ++i) k[i] = k[i] * inv[i] + mu[i];
  }
}

void KvCache::write_key(int32_t layer, int32_t block, int32_t slot, const float* k) {
  check_block(block);
  const int32_t kh = k_head();
  if (!smoothing_.offset.empty()) {
    thread_local std::vector<float> smoothed;
    const size_t at = size_t(layer) * shape_.k_width;
    const float *mu = smoothing_.offset.data() + at, *s = smoothing_.scale.data() + at;
    smoothed.resize(size_t(shape_.k_width));
    for (int32_t i = 0; i < shape_.k_width; ++i) smoothed[i] = (k[i] - mu[i]) * s[i];
    k = smoothed.data();
  }
  for (int32_t h = 0; h < shape_.n_head_kv; ++h)
    store_key(format_.k, as_stored(k + h * kh, kh, format_.rotate_k),
              k_.get() + k_offset(paging_.slot[layer], block, h), slot, kh, block_size_);
}

void KvCache::set_key_smoothing(KeySmoothing smoothing) {
  const size_t want = size_t(shape_.n_layer) * shape_.k_width;
  const bool none = smoothing.offset.empty() && smoothing.scale.empty();
  if (!none && (smoothing.offset.size() != want || smoothing.scale.size() != want))
    fail(ErrorKind::kInvalidArgument, "key smoothing of {} offsets and {} scales for a cache of {} layers x {}",
         smoothing.offset.size(), smoothing.scale.size(), shape_.n_layer, shape_.k_width);
  for (float s : smoothing.scale)
    if (!(s > 0.0f) || !std::isfinite(s)) fail(ErrorKind::kInvalidArgument, "key smoothing scale {}", s);
  inv_scale_.resize(smoothing.scale.size());
  for (size_t i = 0; i < inv_scale_.size(); ++i) inv_scale_[i] = 1.0f / smoothing.scale[i];
  smoothing_ = std::move(smoothing);
}

void KvCache::rotate_queries(int32_t layer, float* q, int32_t n_head, int32_t head_dim) const {
  if (!inv_scale_.empty()) {
    const int32_t group = n_head / shape_.n_head_kv;
    const float* inv = inv_scale_.data() + size_t(layer) * shape_.k_width;
    for (int32_t h = 0; h < n_head; ++h) {
      const float* head = inv + (h / group) * head_dim;
      for (int32_t i = 0; i < head_dim; ++i) q[size_t(h) * head_dim + i] *= head[i];
    }
  }
  if (!format_.rotate_k) return;
  for (int32_t h = 0; h < n_head; ++h) hadamard_rotate(q + size_t(h) * head_dim, head_dim);
}

void KvCache::unrotate_outputs(float* out, int32_t n_head, int32_t head_dim_v) const {
  if (!format_.rotate_v) return;
  for (int32_t h = 0; h < n_head; ++h) hadamard_rotate(out + size_t(h) * head_dim_v, head_dim_v);  // H = H^-1
}

void KvCache::check_block(int32_t block) const {
  if (block < 0 || block >= n_blocks_)
    fail(ErrorKind::kInvalidArgument, "KV block {} is outside the pool of {}", block, n_blocks_);
}

template <typename F>
void KvCache::for_each_run(int32_t block, F&& f) const {
  check_block(block);
  for (int32_t j = 0; j < paging_.layers_per_page; ++j)
    for (int32_t h = 0; h < shape_.n_head_kv; ++h) {
      f(k_.get() + k_offset(j, block, h), k_region());
      f(v_.get() + v_offset(j, block, h), v_region());
    }
}

void KvCache::copy_block(int32_t src, int32_t dst) {
  check_block(dst);
  // A run of block dst lies (dst - src) runs of its kind after src's.
  const ptrdiff_t blocks_apart = ptrdiff_t(dst) - src;
  for_each_run(src, [&](std::byte* run, size_t n) { std::memcpy(run + blocks_apart * ptrdiff_t(n), run, n); });
  if (bounds_) bounds_->copy(src, dst);
}

void KvCache::copy_slots(int32_t src, int32_t dst, int32_t from, int32_t to) {
  check_block(src);
  check_block(dst);
  if (from < 0 || to > block_size_ || from >= to) return;
  // K: rows of block_size elements (transposed), each row's slots apart; a
  // quantized K's rows hold 4-byte words, its scale rows (f16) follow its
  // value rows. V: one row per slot, or slot words (quantized).
  const int32_t kh = k_head(), vh = v_head();
  struct Rows {
    int32_t n;
    size_t elem;
  };
  std::vector<Rows> k_rows;
  switch (format_.k) {
    case KvType::kF32: k_rows = {{kh, 4}}; break;
    case KvType::kF16: k_rows = {{kh, 2}}; break;
    case KvType::kQ8_0: k_rows = {{kh / 4, 4}, {kh / kKvGroup, 2}}; break;
    case KvType::kQ4_0: k_rows = {{kh / 8, 4}, {kh / kKvGroup, 2}}; break;
  }
  const size_t v_row = kv_bytes(format_.v, vh);
  for (int32_t j = 0; j < paging_.layers_per_page; ++j)
    for (int32_t h = 0; h < shape_.n_head_kv; ++h) {
      const std::byte* ks = k_.get() + k_offset(j, src, h);
      std::byte* kd = k_.get() + k_offset(j, dst, h);
      size_t at = 0;
      for (const Rows& r : k_rows)
        for (int32_t i = 0; i < r.n; ++i, at += r.elem * block_size_)
          std::memcpy(kd + at + from * r.elem, ks + at + from * r.elem, size_t(to - from) * r.elem);
      const std::byte* vs = v_.get() + v_offset(j, src, h);
      std::byte* vd = v_.get() + v_offset(j, dst, h);
      if (kv_type_quantized(format_.v))
        copy_value_slots(format_.v, vs, vd, from, to, vh, block_size_);
      else
        std::memcpy(vd + from * v_row, vs + from * v_row, size_t(to - from) * v_row);
    }
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
  // A partial block's bounds are recomputed again when it fills.
  if (bounds_) bounds_->update_all(*this, block);
}

void KvCache::keep_key_bounds(const std::vector<bool>& layers) {
  if (int32_t(layers.size()) != shape_.n_layer)
    fail(ErrorKind::kInvalidArgument, "key bounds for {} layers in a cache of {}", layers.size(), shape_.n_layer);
  bounds_ = std::make_unique<KeyBounds>(layers, shape_.n_head_kv, k_head(), n_blocks_);
}

KvLayerView KvCache::layer_view(int32_t layer, const int32_t* blocks) const {
  KvLayerView view;
  view.keys = k_.get() + k_offset(paging_.slot[layer], 0, 0);
  view.values = v_.get() + v_offset(paging_.slot[layer], 0, 0);
  view.k_type = format_.k;
  view.v_type = format_.v;
  view.block_size = block_size_;
  view.n_blocks = n_blocks_;
  view.n_head_kv = shape_.n_head_kv;
  view.k_head = k_head();
  view.v_head = v_head();
  view.blocks = blocks;
  return view;
}

bool SeqKv::reserve(KvCache& cache, int32_t n) {
  const int32_t groups = cache.paging().n_groups;
  windowed.resize(size_t(groups - 1));
  const int32_t need = (n + cache.block_size() - 1) / cache.block_size() - static_cast<int32_t>(blocks.size());
  if (need <= 0) return true;
  if (int64_t(need) * groups > cache.n_free()) return false;
  for (int32_t i = 0; i < need; ++i) {
    blocks.push_back(cache.allocate());
    for (auto& t : windowed) t.push_back(cache.allocate());
  }
  return true;
}

void SeqKv::release(KvCache& cache) {
  for (int32_t b : blocks) cache.release(b);
  for (auto& t : windowed)
    for (int32_t b : t)
      if (b >= 0) cache.release(b);
  blocks.clear();
  windowed.clear();
  n_tokens = 0;
}

}  // namespace tandem

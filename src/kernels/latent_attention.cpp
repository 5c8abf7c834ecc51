#include "kernels/latent_attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/error.h"
#include "quant/quant.h"
#include "runtime/cpu_features.h"
#include "runtime/thread_pool.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace tandem {
namespace {

// Positions per block: the block's rows (32 x 576 f32, 72 KiB) stay in L2
// while every head of a task scores and sums them.
constexpr int32_t kBlock = 32;

void check_view(const LatentShape& s, const KvLayerView& kv) {
  if (kv.n_head_kv != 1 || kv.k_head != s.rope || kv.v_head != s.latent)
    fail(ErrorKind::kInvalidArgument,
         "latent attention: the cache holds {} heads of {} / {} values, the shape wants one of {} / {}",
         kv.n_head_kv, kv.k_head, kv.v_head, s.rope, s.latent);
}

// Sums in 16 independent lanes, added in a fixed order at the end: the
// compiler vectorizes the lanes, and the result does not depend on it. Built
// for AVX-512 and a baseline; the CPU picks one once, so a process always
// runs the same one. (Not target_clones: its ifunc resolver runs before a
// sanitizer's runtime is up, and ThreadSanitizer builds crash at load.)
#define TD_DOT_BODY                                                   \
  float acc[16] = {};                                                 \
  int32_t i = 0;                                                      \
  for (; i + 16 <= n; i += 16)                                        \
    for (int32_t j = 0; j < 16; ++j) acc[j] += a[i + j] * b[i + j];   \
  for (; i < n; ++i) acc[i % 16] += a[i] * b[i];                      \
  for (int32_t w = 8; w > 0; w /= 2)                                  \
    for (int32_t j = 0; j < w; ++j) acc[j] += acc[j + w];             \
  return acc[0];
#define TD_AXPY_BODY \
  for (int32_t i = 0; i < n; ++i) acc[i] += w * x[i];

float dot_base(const float* a, const float* b, int32_t n) { TD_DOT_BODY }
void axpy_base(float* acc, float w, const float* x, int32_t n) { TD_AXPY_BODY }
#if defined(__x86_64__)
__attribute__((target("avx512f"))) float dot_avx512(const float* a, const float* b, int32_t n) { TD_DOT_BODY }
__attribute__((target("avx512f"))) void axpy_avx512(float* acc, float w, const float* x, int32_t n) { TD_AXPY_BODY }
#endif
#undef TD_DOT_BODY
#undef TD_AXPY_BODY

bool use_avx512() {
#if defined(__x86_64__)
  static const bool yes = cpu_features().avx512f;
  return yes;
#else
  return false;
#endif
}

float dot(const float* a, const float* b, int32_t n) {
#if defined(__x86_64__)
  if (use_avx512()) return dot_avx512(a, b, n);
#endif
  return dot_base(a, b, n);
}

// acc += w * x, n elements.
void axpy(float* acc, float w, const float* x, int32_t n) {
#if defined(__x86_64__)
  if (use_avx512()) return axpy_avx512(acc, w, x, n);
#endif
  axpy_base(acc, w, x, n);
}

#if defined(__x86_64__)
// The hardware conversion is exact (every f16 is an f32), as f16_to_f32 is.
__attribute__((target("avx,f16c"))) int32_t f16_row_f16c(const uint16_t* h, float* x, int32_t n) {
  int32_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(x + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h + i))));
  return i;
}
#endif

void f16_row(const uint16_t* h, float* x, int32_t n) {
  int32_t i = 0;
#if defined(__x86_64__)
  static const bool f16c = cpu_features().f16c;
  if (f16c) i = f16_row_f16c(h, x, n);
#endif
  for (; i < n; ++i) x[i] = f16_to_f32(h[i]);
}

}  // namespace

void latent_read(const KvLayerView& kv, int32_t pos, float* latent, float* rope) {
  const int32_t bs = kv.block_size, slot = pos % bs;
  const int32_t L = kv.v_head, R = kv.k_head;
  switch (kv.v_type) {
    case KvType::kF32: std::copy_n(kv.value<float>(pos, 0), L, latent); break;
    case KvType::kF16: f16_row(kv.value<uint16_t>(pos, 0), latent, L); break;
    case KvType::kQ8_0: {
      const uint8_t* w = kv.value_words(pos, 0);
      const uint16_t* sc = kv.value_scales(pos, 0);
      for (int32_t i = 0; i < L; ++i)
        latent[i] = f16_to_f32(sc[size_t(i / kKvGroup) * bs]) * static_cast<int8_t>(w[size_t(i) * 4 + slot % 4]);
      break;
    }
    case KvType::kQ4_0: {
      const uint8_t* w = kv.value_words(pos, 0);
      const uint16_t* sc = kv.value_scales(pos, 0);
      for (int32_t i = 0; i < L; ++i) {
        const uint8_t b = w[size_t(i / 32) * 64 + size_t(i % 16) * 4 + slot % 4];
        const int32_t v = ((i % 32 >= 16 ? b >> 4 : b) & 15) - 8;
        latent[i] = f16_to_f32(sc[size_t(i / kKvGroup) * bs]) * static_cast<float>(v);
      }
      break;
    }
  }
  switch (kv.k_type) {
    case KvType::kF32: {
      const float* k = kv.key_column<float>(pos, 0);
      for (int32_t i = 0; i < R; ++i) rope[i] = k[size_t(i) * bs];
      break;
    }
    case KvType::kF16: {
      const uint16_t* k = kv.key_column<uint16_t>(pos, 0);
      for (int32_t i = 0; i < R; ++i) rope[i] = f16_to_f32(k[size_t(i) * bs]);
      break;
    }
    case KvType::kQ8_0: {
      const uint8_t* w = kv.key_words(pos, 0);
      const uint16_t* sc = kv.key_scales(pos, 0);
      for (int32_t i = 0; i < R; ++i)
        rope[i] = f16_to_f32(sc[size_t(i / kKvGroup) * bs]) * static_cast<int8_t>(w[size_t(i / 4) * 4 * bs + i % 4]);
      break;
    }
    case KvType::kQ4_0: {
      const uint8_t* w = kv.key_words(pos, 0);
      const uint16_t* sc = kv.key_scales(pos, 0);
      for (int32_t i = 0; i < R; ++i) {
        const uint8_t b = w[size_t(i / 8) * 4 * bs + i % 4];
        const int32_t v = ((i % 8 < 4 ? b : b >> 4) & 15) - 8;
        rope[i] = f16_to_f32(sc[size_t(i / kKvGroup) * bs]) * static_cast<float>(v);
      }
      break;
    }
  }
}

void latent_attention(const LatentShape& s, const KvLayerView& kv, const float* q, int64_t q_stride, int32_t pos0,
                      int32_t n, float* out, int64_t out_stride, ThreadPool& pool) {
  if (n <= 0) return;
  check_view(s, kv);
  const int32_t L = s.latent, W = s.latent + s.rope, H = s.n_head;
  // One query row is one task, all its heads together, so that a block of
  // rows is read once for all of them; a single row (decode) is split into
  // head groups to use every thread. Heads never share arithmetic, so the
  // grouping does not change any result.
  const int32_t groups = n == 1 ? std::min<int32_t>(H, std::max(1, pool.size())) : 1;
  const int32_t per = (H + groups - 1) / groups;
  pool.parallel_for(int64_t{n} * groups, 1, [&](int64_t t0, int64_t t1) {
    std::vector<float> rows(size_t(kBlock) * W), scores(kBlock), m, l, acc;
    for (int64_t t = t0; t < t1; ++t) {
      const int32_t r = static_cast<int32_t>(t / groups), g = static_cast<int32_t>(t % groups);
      const int32_t h0 = g * per, h1 = std::min(H, h0 + per);
      if (h0 >= h1) continue;
      const int32_t nh = h1 - h0, last = pos0 + r;
      m.assign(size_t(nh), -std::numeric_limits<float>::infinity());
      l.assign(size_t(nh), 0.0f);
      acc.assign(size_t(nh) * L, 0.0f);
      const float* qr = q + r * q_stride;
      for (int32_t b0 = 0; b0 <= last; b0 += kBlock) {
        const int32_t cnt = std::min(kBlock, last + 1 - b0);
        for (int32_t j = 0; j < cnt; ++j) latent_read(kv, b0 + j, rows.data() + size_t(j) * W, rows.data() + size_t(j) * W + L);
        for (int32_t hh = 0; hh < nh; ++hh) {
          const float* qh = qr + size_t(h0 + hh) * W;
          float bm = -std::numeric_limits<float>::infinity();
          for (int32_t j = 0; j < cnt; ++j) {
            scores[j] = dot(qh, rows.data() + size_t(j) * W, W);
            bm = std::max(bm, scores[j]);
          }
          float* a = acc.data() + size_t(hh) * L;
          const float nm = std::max(m[hh], bm);
          if (m[hh] != nm && l[hh] > 0) {
            const float f = std::exp(m[hh] - nm);
            l[hh] *= f;
            for (int32_t i = 0; i < L; ++i) a[i] *= f;
          }
          m[hh] = nm;
          for (int32_t j = 0; j < cnt; ++j) {
            const float w = std::exp(scores[j] - nm);
            l[hh] += w;
            axpy(a, w, rows.data() + size_t(j) * W, L);
          }
        }
      }
      for (int32_t hh = 0; hh < nh; ++hh) {
        float* o = out + r * out_stride + size_t(h0 + hh) * L;
        const float inv = 1.0f / l[hh];
        for (int32_t i = 0; i < L; ++i) o[i] = acc[size_t(hh) * L + i] * inv;
      }
    }
  });
}

void latent_attention_ref(const LatentShape& s, const KvLayerView& kv, const float* q, int64_t q_stride, int32_t pos0,
                          int32_t n, float* out, int64_t out_stride) {
  check_view(s, kv);
  const int32_t L = s.latent, R = s.rope, W = L + R;
  for (int32_t r = 0; r < n; ++r) {
    const int32_t P = pos0 + r + 1;
    std::vector<float> lat(size_t(P) * L), rope(size_t(P) * R);
    for (int32_t p = 0; p < P; ++p) latent_read(kv, p, lat.data() + size_t(p) * L, rope.data() + size_t(p) * R);
    for (int32_t h = 0; h < s.n_head; ++h) {
      const float* qh = q + r * q_stride + size_t(h) * W;
      std::vector<double> sc(static_cast<size_t>(P), 0.0);
      double mx = -std::numeric_limits<double>::infinity();
      for (int32_t p = 0; p < P; ++p) {
        double d = 0;
        for (int32_t i = 0; i < L; ++i) d += double(qh[i]) * lat[size_t(p) * L + i];
        for (int32_t i = 0; i < R; ++i) d += double(qh[L + i]) * rope[size_t(p) * R + i];
        sc[size_t(p)] = d;
        mx = std::max(mx, d);
      }
      double sum = 0;
      for (double& x : sc) sum += (x = std::exp(x - mx));
      for (int32_t i = 0; i < L; ++i) {
        double o = 0;
        for (int32_t p = 0; p < P; ++p) o += sc[size_t(p)] * lat[size_t(p) * L + i];
        out[r * out_stride + size_t(h) * L + i] = static_cast<float>(o / sum);
      }
    }
  }
}

}  // namespace tandem

#include "kernels/attention.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/thread_pool.h"

namespace tandem {
namespace {

float dot(const float* a, const float* b, int32_t n) {
  float s = 0.0f;
  for (int32_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

void attend_head(const AttnShape& s, const KvLayerView& kv, const float* q, int32_t kv_head, int32_t first,
                 int32_t pos, float* out, float* scores) {
  const int32_t hd = s.head_dim, hdv = s.head_dim_v;
  float max_score = -INFINITY;
  for (int32_t p = first; p <= pos; ++p) {
    const float sc = dot(q, kv.key(p) + kv_head * hd, hd);
    scores[p - first] = sc;
    max_score = std::max(max_score, sc);
  }
  double sum = 0.0;
  for (int32_t p = first; p <= pos; ++p) {
    const float e = std::exp(scores[p - first] - max_score);
    scores[p - first] = e;
    sum += e;
  }
  const float inv = static_cast<float>(1.0 / sum);
  std::fill(out, out + hdv, 0.0f);
  for (int32_t p = first; p <= pos; ++p) {
    const float w = scores[p - first] * inv;
    const float* v = kv.value(p) + kv_head * hdv;
    for (int32_t d = 0; d < hdv; ++d) out[d] += w * v[d];
  }
}

}  // namespace

void attention_prefill(const AttnShape& s, const KvLayerView& kv, const float* q, int64_t q_stride, int32_t pos0,
                       int32_t n, float* out, int64_t out_stride, ThreadPool& pool) {
  // Split over (query, head) pairs: later queries see more keys, so a plain
  // split over queries would leave the first thread idle.
  const int64_t items = int64_t{n} * s.n_head;
  const int32_t group = s.n_head / s.n_head_kv;
  pool.run([&](int t, int nt) {
    std::vector<float> scores(pos0 + n);
    for (int64_t it = t; it < items; it += nt) {
      const int32_t i = static_cast<int32_t>(it / s.n_head), h = static_cast<int32_t>(it % s.n_head);
      const int32_t pos = pos0 + i;
      const int32_t first = s.window > 0 ? std::max(0, pos - s.window + 1) : 0;
      attend_head(s, kv, q + i * q_stride + h * s.head_dim, h / group, first, pos,
                  out + i * out_stride + h * s.head_dim_v, scores.data());
    }
  });
}

void attention_decode(const AttnShape& s, const KvLayerView* views, const int32_t* positions, int32_t n_seqs,
                      const float* q, int64_t q_stride, float* out, int64_t out_stride, ThreadPool& pool) {
  const int64_t items = int64_t{n_seqs} * s.n_head;
  const int32_t group = s.n_head / s.n_head_kv;
  int32_t max_pos = 0;
  for (int32_t b = 0; b < n_seqs; ++b) max_pos = std::max(max_pos, positions[b]);
  pool.run([&](int t, int nt) {
    std::vector<float> scores(max_pos + 1);
    for (int64_t it = t; it < items; it += nt) {
      const int32_t b = static_cast<int32_t>(it / s.n_head), h = static_cast<int32_t>(it % s.n_head);
      const int32_t pos = positions[b];
      const int32_t first = s.window > 0 ? std::max(0, pos - s.window + 1) : 0;
      attend_head(s, views[b], q + b * q_stride + h * s.head_dim, h / group, first, pos,
                  out + b * out_stride + h * s.head_dim_v, scores.data());
    }
  });
}

}  // namespace tandem

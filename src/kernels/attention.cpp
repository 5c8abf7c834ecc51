// The attention drivers: which (rows x chunk) kernel calls to make, on which
// thread, and the in-order fold of their partials. See attention.h for why
// every schedule here yields the same bits.
#include "kernels/attention.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <memory>
#include <vector>

#include "core/error.h"
#include "core/thread_pool.h"
#include "kernels/attention_impl.h"

namespace tandem {
namespace {

using attn_detail::ChunkFn;
using attn_detail::ChunkJob;
using attn_detail::QuantizedQuery;

// Query rows per prefill work item: enough to reuse each chunk of K/V many
// times from cache, few enough that the item's scratch stays in L2.
constexpr int32_t kTileRows = 64;

ChunkFn chunk_fn_for(KernelLevel level) {
  if (!cpu_supports_level(level))
    fail(ErrorKind::kInvalidArgument, "attention: this CPU cannot run kernel level {}", kernel_level_name(level));
  ChunkFn f = nullptr;
  if (level >= KernelLevel::kAvx512Vnni) f = attn_detail::avx512_vnni_chunk_fn();
  if (!f && level >= KernelLevel::kAvx512) f = attn_detail::avx512_chunk_fn();
  if (!f && level >= KernelLevel::kAvx2) f = attn_detail::avx2_chunk_fn();
  if (!f) f = attn_detail::ref_chunk_fn();
  return f;
}

// The kernels address head g's rows through the view: its heads must be the
// shape's.
void check_view(const AttnShape& s, const KvLayerView& kv) {
  if (kv.n_head_kv != s.n_head_kv || kv.k_head != s.head_dim || kv.v_head != s.head_dim_v)
    fail(ErrorKind::kInvalidArgument,
         "attention: the KV cache holds {} heads of {} / {} elements, the attention wants {} of {} / {}", kv.n_head_kv,
         kv.k_head, kv.v_head, s.n_head_kv, s.head_dim, s.head_dim_v);
}

int32_t first_pos(const AttnShape& s, int32_t pos) { return s.window > 0 ? std::max(0, pos - s.window + 1) : 0; }

// Folds one chunk's partial (m, l, acc) into a row's running state (M, L, A),
// chunks arriving in position order. Out of line so that every caller runs
// this exact code, whatever the optimizer would do with an inlined copy.
[[gnu::noinline]] void fold(float& M, float& L, float* A, float m, float l, const float* acc, int32_t hdv,
                            bool first) {
  if (first) {
    M = m;
    L = l;
    std::copy_n(acc, hdv, A);
    return;
  }
  const float mn = std::max(M, m);
  const float a = std::exp(M - mn), b = std::exp(m - mn);
  L = L * a + l * b;
  for (int32_t d = 0; d < hdv; ++d) A[d] = A[d] * a + acc[d] * b;
  M = mn;
}

[[gnu::noinline]] void finish(float L, const float* A, float* out, int32_t hdv) {
  for (int32_t d = 0; d < hdv; ++d) out[d] = A[d] / L;
}

// Query rows quantized for the integer Q.K of quantized keys: the storage
// and the views the kernels read, rows[r] from the r-th row given.
struct QuantizedRows {
  std::vector<int8_t> values;
  std::vector<float> scales;
  std::vector<int32_t> sums;
  std::vector<QuantizedQuery> rows;

  const QuantizedQuery* quantize(const float* const* q, int32_t n, int32_t hd) {
    const size_t groups = size_t(hd) / kKvGroup;
    values.resize(std::max(values.size(), size_t(n) * hd));
    scales.resize(std::max(scales.size(), n * groups));
    sums.resize(std::max(sums.size(), n * groups));
    rows.resize(std::max(rows.size(), size_t(n)));
    for (int32_t r = 0; r < n; ++r) {
      int8_t* v = values.data() + size_t(r) * hd;
      float* d = scales.data() + r * groups;
      int32_t* sum = sums.data() + r * groups;
      attn_detail::quantize_query(q[r], hd, v, d, sum);
      rows[r] = {v, d, sum};
    }
    return rows.data();
  }
};

struct Scratch {
  std::vector<float> scores, m, l, acc;  // one kernel call
  std::vector<float> M, L, A;            // running state per row
  std::vector<const float*> q, cq;
  QuantizedRows qq;                       // q quantized, for quantized keys
  std::vector<QuantizedQuery> cqq;
  std::vector<float*> out;
  std::vector<int32_t> lo, hi, clo, chi, row_of;
  std::vector<uint8_t> started;

  void fit(int32_t rows, int32_t hdv) {
    const size_t r = static_cast<size_t>(rows);
    if (scores.size() < r * kAttnChunk) scores.resize(r * kAttnChunk);
    for (auto* v : {&m, &l, &M, &L})
      if (v->size() < r) v->resize(r);
    for (auto* v : {&acc, &A})
      if (v->size() < r * hdv) v->resize(r * hdv);
    q.resize(r);
    cq.resize(r);
    cqq.resize(r);
    out.resize(r);
    for (auto* v : {&lo, &hi, &clo, &chi, &row_of}) v->resize(r);
    started.resize(r);
  }

  // Rows q[0..n) quantized when kv's keys are (nullptr otherwise): once per
  // row and call, not per chunk.
  const QuantizedQuery* quantized(const KvLayerView& kv, int32_t n, int32_t hd) {
    return kv_type_quantized(kv.k_type) ? qq.quantize(q.data(), n, hd) : nullptr;
  }
};

Scratch& scratch() {
  thread_local Scratch s;
  return s;
}

// Decode split along the KV length: (unit, chunk) items and their partials.
struct DecodeSplit {
  struct Item {
    int64_t unit;
    int32_t chunk;
  };
  std::vector<Item> items;
  std::vector<int64_t> unit_first;
  std::vector<float> part_m, part_l, part_acc;
  std::vector<const float*> q_rows;  // every unit's query rows, for QuantizedRows
  QuantizedRows qq;
  // Chunks of each unit still running; whoever finishes the last one folds.
  std::unique_ptr<std::atomic<int32_t>[]> pending;
  int64_t pending_size = 0;
};

DecodeSplit& decode_split() {
  thread_local DecodeSplit d;
  return d;
}

}  // namespace

namespace attn_detail {

void quantize_query(const float* x, int32_t head_dim, int8_t* q, float* d, int32_t* sum) {
  for (int32_t g = 0; g < head_dim / kKvGroup; ++g) {
    const float* xg = x + g * kKvGroup;
    float amax = 0.0f;
    for (int32_t i = 0; i < kKvGroup; ++i) amax = std::max(amax, std::abs(xg[i]));
    const float dg = amax / 127.0f, id = dg != 0.0f ? 1.0f / dg : 0.0f;
    int32_t s = 0;
    for (int32_t i = 0; i < kKvGroup; ++i) {
      // Adding and taking away 1.5 * 2^23 rounds |x| < 2^22 to an integer,
      // ties to even, in two instructions (nearbyint is a libm call on
      // baseline x86-64). The clamp only guards the group's maximum:
      // amax * (1 / (amax / 127)) may round to 128.
      constexpr float kRound = 12582912.0f;
      const float r = (xg[i] * id + kRound) - kRound;
      const int32_t v = std::clamp(static_cast<int32_t>(r), -127, 127);
      q[g * kKvGroup + i] = static_cast<int8_t>(v);
      s += v;
    }
    d[g] = dg;
    sum[g] = s;
  }
}

}  // namespace attn_detail

namespace {

// Rows sc.q[0..n) of KV head g, row r seeing positions [sc.lo[r], sc.hi[r]),
// rows in position order: every chunk in turn, each folded into the rows
// that reach it, then the outputs to sc.out. qq: the rows quantized, for
// quantized keys (Scratch::quantized).
void attend_rows(ChunkFn fn, const AttnShape& s, const KvLayerView& kv, int32_t g, int32_t n,
                 const QuantizedQuery* qq, Scratch& sc) {
  const int32_t hdv = s.head_dim_v;
  int32_t p_lo = sc.lo[0], p_hi = sc.hi[0];
  for (int32_t r = 0; r < n; ++r) {
    p_lo = std::min(p_lo, sc.lo[r]);
    p_hi = std::max(p_hi, sc.hi[r]);
    sc.started[r] = 0;
  }
  ChunkJob job;
  job.kv = &kv;
  job.kv_head = g;
  job.head_dim = s.head_dim;
  job.head_dim_v = hdv;
  job.q = sc.cq.data();
  if (qq) job.qq = sc.cqq.data();
  job.lo = sc.clo.data();
  job.hi = sc.chi.data();
  job.scores = sc.scores.data();
  job.m = sc.m.data();
  job.l = sc.l.data();
  job.acc = sc.acc.data();
  for (int32_t c = p_lo / kAttnChunk; c <= (p_hi - 1) / kAttnChunk; ++c) {
    const int32_t cs = c * kAttnChunk, ce = cs + kAttnChunk;
    int32_t k = 0;
    for (int32_t r = 0; r < n; ++r) {
      const int32_t a = std::max(sc.lo[r], cs), b = std::min(sc.hi[r], ce);
      if (a >= b) continue;
      sc.cq[k] = sc.q[r];
      if (qq) sc.cqq[k] = qq[r];
      sc.clo[k] = a;
      sc.chi[k] = b;
      sc.row_of[k] = r;
      ++k;
    }
    if (k == 0) continue;
    job.c0 = cs;
    job.n_rows = k;
    job.next_hi = std::min(p_hi, ce + kAttnChunk);
    fn(job);
    job.warm = true;
    for (int32_t j = 0; j < k; ++j) {
      const int32_t r = sc.row_of[j];
      fold(sc.M[r], sc.L[r], sc.A.data() + size_t(r) * hdv, sc.m[j], sc.l[j], sc.acc.data() + size_t(j) * hdv, hdv,
           !sc.started[r]);
      sc.started[r] = 1;
    }
  }
  for (int32_t r = 0; r < n; ++r) finish(sc.L[r], sc.A.data() + size_t(r) * hdv, sc.out[r], hdv);
}

}  // namespace

void attention_prefill_at(KernelLevel level, const AttnShape& s, const KvLayerView& kv, const float* q,
                          int64_t q_stride, int32_t pos0, int32_t n, float* out, int64_t out_stride, ThreadPool& pool) {
  if (n <= 0) return;
  check_view(s, kv);
  const ChunkFn fn = chunk_fn_for(level);
  const int32_t group = s.n_head / s.n_head_kv;
  const int32_t tq = std::max(1, kTileRows / group);  // positions per tile
  const int32_t n_tiles = (n + tq - 1) / tq;
  const int64_t items = int64_t{n_tiles} * s.n_head_kv;
  std::atomic<int64_t> next{0};
  pool.run([&](int, int) {
    Scratch& sc = scratch();
    sc.fit(tq * group, s.head_dim_v);
    for (int64_t it; (it = next.fetch_add(1, std::memory_order_relaxed)) < items;) {
      // Latest tiles first: without a window they see the most keys.
      const int32_t tile = n_tiles - 1 - static_cast<int32_t>(it / s.n_head_kv);
      const int32_t g = static_cast<int32_t>(it % s.n_head_kv);
      const int32_t i0 = tile * tq, i1 = std::min(n, i0 + tq);
      int32_t r = 0;
      for (int32_t i = i0; i < i1; ++i)
        for (int32_t j = 0; j < group; ++j, ++r) {
          const int32_t h = g * group + j, pos = pos0 + i;
          sc.q[r] = q + i * q_stride + int64_t{h} * s.head_dim;
          sc.out[r] = out + i * out_stride + int64_t{h} * s.head_dim_v;
          sc.lo[r] = first_pos(s, pos);
          sc.hi[r] = pos + 1;
        }
      attend_rows(fn, s, kv, g, r, sc.quantized(kv, r, s.head_dim), sc);
    }
  });
}

void attention_decode_at(KernelLevel level, const AttnShape& s, const KvLayerView* views, const int32_t* positions,
                         int32_t n_seqs, const float* q, int64_t q_stride, float* out, int64_t out_stride,
                         ThreadPool& pool) {
  if (n_seqs <= 0) return;
  for (int32_t b = 0; b < n_seqs; ++b) check_view(s, views[b]);
  const ChunkFn fn = chunk_fn_for(level);
  const int32_t group = s.n_head / s.n_head_kv, hdv = s.head_dim_v;
  const int64_t units = int64_t{n_seqs} * s.n_head_kv;  // (sequence, KV head)
  auto unit_rows = [&](int64_t u, Scratch& sc) {
    const int32_t b = static_cast<int32_t>(u / s.n_head_kv), g = static_cast<int32_t>(u % s.n_head_kv);
    for (int32_t j = 0; j < group; ++j) {
      const int32_t h = g * group + j;
      sc.q[j] = q + b * q_stride + int64_t{h} * s.head_dim;
      sc.out[j] = out + b * out_stride + int64_t{h} * hdv;
      sc.lo[j] = first_pos(s, positions[b]);
      sc.hi[j] = positions[b] + 1;
    }
    return g;
  };

  int64_t n_chunks = 0;
  for (int32_t b = 0; b < n_seqs; ++b)
    n_chunks += (positions[b] / kAttnChunk - first_pos(s, positions[b]) / kAttnChunk + 1) * s.n_head_kv;
  const int64_t threads = pool.size();
  if (threads == 1 || units >= 2 * threads || n_chunks < 2 * threads) {
    // Enough heads to keep every thread busy, or too few chunks for a split
    // to pay for its synchronization: a head per work item, its chunks in
    // order, as in prefill.
    std::atomic<int64_t> next{0};
    auto work = [&](int, int) {
      Scratch& sc = scratch();
      sc.fit(group, hdv);
      for (int64_t u; (u = next.fetch_add(1, std::memory_order_relaxed)) < units;) {
        const int32_t g = unit_rows(u, sc);
        const KvLayerView& kv = views[u / s.n_head_kv];
        attend_rows(fn, s, kv, g, group, sc.quantized(kv, group, s.head_dim), sc);
      }
    };
    if (units == 1)
      work(0, 1);
    else
      pool.run(work);
    return;
  }

  // Long contexts, few heads: split along the KV length. Each (unit, chunk)
  // item leaves its partial; the thread that completes a unit's last chunk
  // folds the unit's partials in chunk order, exactly as attend_rows would.
  // The buffers are the caller's, named through a reference: a thread_local
  // named inside the lambda would be each worker's own.
  DecodeSplit& ds = decode_split();
  auto& items = ds.items;
  auto& unit_first = ds.unit_first;
  auto& part_m = ds.part_m;
  auto& part_l = ds.part_l;
  auto& part_acc = ds.part_acc;
  items.clear();
  unit_first.assign(units + 1, 0);
  for (int64_t u = 0; u < units; ++u) {
    const int32_t pos = positions[u / s.n_head_kv];
    unit_first[u] = static_cast<int64_t>(items.size());
    for (int32_t c = first_pos(s, pos) / kAttnChunk; c <= pos / kAttnChunk; ++c) items.push_back({u, c});
  }
  unit_first[units] = static_cast<int64_t>(items.size());
  const size_t n_items = items.size();
  part_m.resize(n_items * group);
  part_l.resize(n_items * group);
  part_acc.resize(n_items * group * hdv);

  if (ds.pending_size < units) {
    ds.pending.reset(new std::atomic<int32_t>[units]);
    ds.pending_size = units;
  }
  for (int64_t u = 0; u < units; ++u)
    ds.pending[u].store(static_cast<int32_t>(unit_first[u + 1] - unit_first[u]), std::memory_order_relaxed);
  std::atomic<int32_t>* pending = ds.pending.get();

  // Every unit's rows quantized once here, not once per chunk item: row
  // u * group + j is query head g * group + j of unit u's sequence, so the
  // rows run through the batch in order.
  const QuantizedQuery* qq_all = nullptr;
  if (std::any_of(views, views + n_seqs, [](const KvLayerView& v) { return kv_type_quantized(v.k_type); })) {
    std::vector<const float*>& rows = ds.q_rows;
    rows.resize(size_t(units) * group);
    for (size_t i = 0; i < rows.size(); ++i)
      rows[i] = q + int64_t(i / s.n_head) * q_stride + int64_t(i % s.n_head) * s.head_dim;
    qq_all = ds.qq.quantize(rows.data(), static_cast<int32_t>(rows.size()), s.head_dim);
  }

  std::atomic<int64_t> next{0};
  pool.run([&](int, int) {
    Scratch& sc = scratch();
    sc.fit(group, hdv);
    for (int64_t it; (it = next.fetch_add(1, std::memory_order_relaxed)) < static_cast<int64_t>(n_items);) {
      const DecodeSplit::Item& item = items[it];
      const int32_t g = unit_rows(item.unit, sc);
      const int32_t cs = item.chunk * kAttnChunk;
      for (int32_t j = 0; j < group; ++j) {
        sc.cq[j] = sc.q[j];
        sc.clo[j] = std::max(sc.lo[j], cs);
        sc.chi[j] = std::min(sc.hi[j], cs + kAttnChunk);
      }
      ChunkJob job;
      job.kv = &views[item.unit / s.n_head_kv];
      job.kv_head = g;
      job.head_dim = s.head_dim;
      job.head_dim_v = hdv;
      job.c0 = cs;
      job.n_rows = group;
      job.q = sc.cq.data();
      if (qq_all && kv_type_quantized(job.kv->k_type)) job.qq = qq_all + item.unit * group;
      job.lo = sc.clo.data();
      job.hi = sc.chi.data();
      job.scores = sc.scores.data();
      job.m = part_m.data() + it * group;
      job.l = part_l.data() + it * group;
      job.acc = part_acc.data() + it * group * hdv;
      fn(job);
      // acq_rel: the folding thread must see every other chunk's partial.
      if (pending[item.unit].fetch_sub(1, std::memory_order_acq_rel) != 1) continue;
      const int64_t u = item.unit;
      for (int32_t j = 0; j < group; ++j) {
        float M = 0, L = 0;
        float* A = sc.A.data() + size_t(j) * hdv;
        for (int64_t pi = unit_first[u]; pi < unit_first[u + 1]; ++pi)
          fold(M, L, A, part_m[pi * group + j], part_l[pi * group + j], part_acc.data() + (pi * group + j) * hdv,
               hdv, pi == unit_first[u]);
        finish(L, A, sc.out[j], hdv);
      }
    }
  });
}

void attention_prefill(const AttnShape& s, const KvLayerView& kv, const float* q, int64_t q_stride, int32_t pos0,
                       int32_t n, float* out, int64_t out_stride, ThreadPool& pool) {
  attention_prefill_at(active_kernel_level(), s, kv, q, q_stride, pos0, n, out, out_stride, pool);
}

void attention_decode(const AttnShape& s, const KvLayerView* views, const int32_t* positions, int32_t n_seqs,
                      const float* q, int64_t q_stride, float* out, int64_t out_stride, ThreadPool& pool) {
  attention_decode_at(active_kernel_level(), s, views, positions, n_seqs, q, q_stride, out, out_stride, pool);
}

}  // namespace tandem

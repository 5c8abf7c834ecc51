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
#include "runtime/thread_pool.h"
#include "kernels/attention_impl.h"
#include "kernels/kernel_builds.h"

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
  return level_fns(level).attention_chunk;
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

// A sink logit joins a row's folded state (M, L, A) as one more term of the
// denominator with nothing in the numerator (ggml's order: the larger of the
// two maxima kept, the other side scaled down).
[[gnu::noinline]] void add_sink(float& M, float& L, float* A, float sink, int32_t hdv) {
  if (sink > M) {
    const float ms = std::exp(M - sink);
    for (int32_t d = 0; d < hdv; ++d) A[d] *= ms;
    L = L * ms + 1.0f;
    M = sink;
  } else {
    L += std::exp(sink - M);
  }
}

[[gnu::noinline]] void finish(float L, const float* A, float* out, int32_t hdv) {
  for (int32_t d = 0; d < hdv; ++d) out[d] = A[d] / L;
}

// A row's attention on n positions of one chunk, added to mass: their exps
// (exp(score - m), the chunk's kernel output) rescaled to the row's final
// (M, L). Every schedule adds a row's chunks in position order, the rows in
// order, so the sums do not depend on the schedule either.
[[gnu::noinline]] void add_mass(const float* e, float m, float M, float L, int32_t n, float* mass) {
  const float f = std::exp(m - M) / L;
  for (int32_t i = 0; i < n; ++i) mass[i] += e[i] * f;
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
  std::vector<float> exps, cm;            // attention mass: each row's exps and chunk maxima
  std::vector<const float*> q, cq;
  QuantizedRows qq;                       // q quantized, for quantized keys
  std::vector<QuantizedQuery> cqq;
  std::vector<float*> out;
  std::vector<int32_t> lo, hi, clo, chi, row_of;
  std::vector<float> sink;  // each row's head's sink logit (AttnShape::sinks set)
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
    sink.resize(r);
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
  std::vector<float> part_exps;  // attention mass: each item's exps, [item][row][kAttnChunk]
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

// Attention mass gathered per work item (or unit), each into its own span,
// then added to the caller's in item order: the same sums whichever thread
// ran which item.
struct MassParts {
  std::vector<float> values;
  std::vector<size_t> offset;   // [items + 1]
  std::vector<int32_t> base;    // position of each span's first element
  std::vector<float*> dest;     // the caller's array for each item (position 0)

  void clear() {
    values.clear();
    offset.assign(1, 0);
    base.clear();
    dest.clear();
  }
  void add(float* to, int32_t lo, int32_t hi) {
    dest.push_back(to);
    base.push_back(lo);
    offset.push_back(offset.back() + size_t(to ? hi - lo : 0));
  }
  void zero() { values.assign(offset.back(), 0.0f); }
  float* part(size_t i) { return dest[i] ? values.data() + offset[i] : nullptr; }
  void flush() {
    for (size_t i = 0; i < dest.size(); ++i)
      if (dest[i])
        for (size_t j = 0; j < offset[i + 1] - offset[i]; ++j) dest[i][base[i] + j] += values[offset[i] + j];
  }
};

MassParts& mass_parts() {
  thread_local MassParts m;
  return m;
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
// mass: if given, each position's attention summed over the rows is added
// to mass[pos - mass_base] (add_mass has the order).
void attend_rows(ChunkFn fn, const AttnShape& s, const KvLayerView& kv, int32_t g, int32_t n,
                 const QuantizedQuery* qq, Scratch& sc, float* mass = nullptr, int32_t mass_base = 0) {
  const int32_t hdv = s.head_dim_v;
  int32_t p_lo = sc.lo[0], p_hi = sc.hi[0];
  for (int32_t r = 0; r < n; ++r) {
    p_lo = std::min(p_lo, sc.lo[r]);
    p_hi = std::max(p_hi, sc.hi[r]);
    sc.started[r] = 0;
  }
  // With mass wanted, each row keeps its exps over the chunks, [c_lo * C, p_hi).
  const int32_t c_lo = p_lo / kAttnChunk, n_ch = (p_hi - 1) / kAttnChunk - c_lo + 1;
  const size_t span = size_t(n_ch) * kAttnChunk;
  if (mass) {
    if (sc.exps.size() < size_t(n) * span) sc.exps.resize(size_t(n) * span);
    if (sc.cm.size() < size_t(n) * n_ch) sc.cm.resize(size_t(n) * n_ch);
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
      if (mass) {
        std::copy(sc.scores.data() + size_t(j) * kAttnChunk + (sc.clo[j] - cs),
                  sc.scores.data() + size_t(j) * kAttnChunk + (sc.chi[j] - cs),
                  sc.exps.data() + size_t(r) * span + (sc.clo[j] - c_lo * kAttnChunk));
        sc.cm[size_t(r) * n_ch + (c - c_lo)] = sc.m[j];
      }
    }
  }
  if (s.sinks)
    for (int32_t r = 0; r < n; ++r) add_sink(sc.M[r], sc.L[r], sc.A.data() + size_t(r) * hdv, sc.sink[r], hdv);
  for (int32_t r = 0; r < n; ++r) finish(sc.L[r], sc.A.data() + size_t(r) * hdv, sc.out[r], hdv);
  if (!mass) return;
  for (int32_t r = 0; r < n; ++r)
    for (int32_t c = sc.lo[r] / kAttnChunk; c <= (sc.hi[r] - 1) / kAttnChunk; ++c) {
      const int32_t a = std::max(sc.lo[r], c * kAttnChunk), b = std::min(sc.hi[r], (c + 1) * kAttnChunk);
      add_mass(sc.exps.data() + size_t(r) * span + (a - c_lo * kAttnChunk), sc.cm[size_t(r) * n_ch + (c - c_lo)],
               sc.M[r], sc.L[r], b - a, mass + (a - mass_base));
    }
}

}  // namespace

void attention_prefill_at(KernelLevel level, const AttnShape& s, const KvLayerView& kv, const float* q,
                          int64_t q_stride, int32_t pos0, int32_t n, float* out, int64_t out_stride, ThreadPool& pool,
                          float* mass) {
  if (n <= 0) return;
  check_view(s, kv);
  const ChunkFn fn = chunk_fn_for(level);
  const int32_t group = s.n_head / s.n_head_kv;
  const int32_t tq = std::max(1, kTileRows / group);  // positions per tile
  const int32_t n_tiles = (n + tq - 1) / tq;
  const int64_t items = int64_t{n_tiles} * s.n_head_kv;
  auto tile_of = [&](int64_t it) { return n_tiles - 1 - static_cast<int32_t>(it / s.n_head_kv); };
  MassParts& mp = mass_parts();
  if (mass) {
    mp.clear();
    for (int64_t it = 0; it < items; ++it) {
      const int32_t i0 = tile_of(it) * tq, i1 = std::min(n, i0 + tq);
      mp.add(mass, first_pos(s, pos0 + i0), pos0 + i1);
    }
    mp.zero();
  }
  std::atomic<int64_t> next{0};
  pool.run([&](int, int) {
    Scratch& sc = scratch();
    sc.fit(tq * group, s.head_dim_v);
    for (int64_t it; (it = next.fetch_add(1, std::memory_order_relaxed)) < items;) {
      // Latest tiles first: without a window they see the most keys.
      const int32_t tile = tile_of(it);
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
          if (s.sinks) sc.sink[r] = s.sinks[h];
        }
      attend_rows(fn, s, kv, g, r, sc.quantized(kv, r, s.head_dim), sc, mass ? mp.part(size_t(it)) : nullptr,
                  mass ? mp.base[size_t(it)] : 0);
    }
  });
  if (mass) mp.flush();
}

void attention_decode_at(KernelLevel level, const AttnShape& s, const KvLayerView* views, const int32_t* positions,
                         int32_t n_seqs, const float* q, int64_t q_stride, float* out, int64_t out_stride,
                         ThreadPool& pool, float* const* mass) {
  if (n_seqs <= 0) return;
  for (int32_t b = 0; b < n_seqs; ++b) check_view(s, views[b]);
  const ChunkFn fn = chunk_fn_for(level);
  const int32_t group = s.n_head / s.n_head_kv, hdv = s.head_dim_v;
  const int64_t units = int64_t{n_seqs} * s.n_head_kv;  // (sequence, KV head)
  MassParts& mp = mass_parts();
  if (mass) {
    mp.clear();
    for (int64_t u = 0; u < units; ++u) {
      const int32_t b = static_cast<int32_t>(u / s.n_head_kv);
      mp.add(mass[b], first_pos(s, positions[b]), positions[b] + 1);
    }
    mp.zero();
  }
  auto unit_rows = [&](int64_t u, Scratch& sc) {
    const int32_t b = static_cast<int32_t>(u / s.n_head_kv), g = static_cast<int32_t>(u % s.n_head_kv);
    for (int32_t j = 0; j < group; ++j) {
      const int32_t h = g * group + j;
      sc.q[j] = q + b * q_stride + int64_t{h} * s.head_dim;
      sc.out[j] = out + b * out_stride + int64_t{h} * hdv;
      sc.lo[j] = first_pos(s, positions[b]);
      sc.hi[j] = positions[b] + 1;
      if (s.sinks) sc.sink[j] = s.sinks[h];
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
        float* um = mass ? mp.part(size_t(u)) : nullptr;
        attend_rows(fn, s, kv, g, group, sc.quantized(kv, group, s.head_dim), sc, um, um ? mp.base[size_t(u)] : 0);
      }
    };
    if (units == 1)
      work(0, 1);
    else
      pool.run(work);
    if (mass) mp.flush();
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
  if (mass) ds.part_exps.resize(n_items * group * kAttnChunk);

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
      float* um = mass ? mp.part(size_t(item.unit)) : nullptr;
      if (um)
        for (int32_t j = 0; j < group; ++j)
          std::copy(sc.scores.data() + size_t(j) * kAttnChunk + (sc.clo[j] - cs),
                    sc.scores.data() + size_t(j) * kAttnChunk + (sc.chi[j] - cs),
                    ds.part_exps.data() + (it * group + j) * kAttnChunk + (sc.clo[j] - cs));
      // acq_rel: the folding thread must see every other chunk's partial.
      if (pending[item.unit].fetch_sub(1, std::memory_order_acq_rel) != 1) continue;
      const int64_t u = item.unit;
      for (int32_t j = 0; j < group; ++j) {
        float M = 0, L = 0;
        float* A = sc.A.data() + size_t(j) * hdv;
        for (int64_t pi = unit_first[u]; pi < unit_first[u + 1]; ++pi)
          fold(M, L, A, part_m[pi * group + j], part_l[pi * group + j], part_acc.data() + (pi * group + j) * hdv,
               hdv, pi == unit_first[u]);
        if (s.sinks) add_sink(M, L, A, sc.sink[j], hdv);
        finish(L, A, sc.out[j], hdv);
        if (!um) continue;
        for (int64_t pi = unit_first[u]; pi < unit_first[u + 1]; ++pi) {
          const int32_t c0 = items[pi].chunk * kAttnChunk;
          const int32_t a = std::max(sc.lo[j], c0), b = std::min(sc.hi[j], c0 + kAttnChunk);
          add_mass(ds.part_exps.data() + (pi * group + j) * kAttnChunk + (a - c0), part_m[pi * group + j], M, L, b - a,
                   um + (a - mp.base[size_t(u)]));
        }
      }
    }
  });
  if (mass) mp.flush();
}

void attention_prefill(const AttnShape& s, const KvLayerView& kv, const float* q, int64_t q_stride, int32_t pos0,
                       int32_t n, float* out, int64_t out_stride, ThreadPool& pool, float* mass) {
  attention_prefill_at(active_kernel_level(), s, kv, q, q_stride, pos0, n, out, out_stride, pool, mass);
}

void attention_decode(const AttnShape& s, const KvLayerView* views, const int32_t* positions, int32_t n_seqs,
                      const float* q, int64_t q_stride, float* out, int64_t out_stride, ThreadPool& pool,
                      float* const* mass) {
  attention_decode_at(active_kernel_level(), s, views, positions, n_seqs, q, q_stride, out, out_stride, pool, mass);
}

}  // namespace tandem

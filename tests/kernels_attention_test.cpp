// Fused attention: every kernel level this CPU has against a naive softmax
// in double, and the schedule invariants the model relies on -- prefill of a
// chunk, decode of one query, decode of a batch, and any thread count give
// the same bits for the same query.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "test_support.h"
#include "quant/quant.h"
#include "runtime/thread_pool.h"
#include "kernels/attention.h"
#include "kernels/attention_impl.h"
#include "kv/kv_cache.h"

namespace tandem {
namespace {

constexpr int32_t kLayer = 1;  // of 2, so the layer offset is exercised

// Some sequences in one paged cache, with random K/V at every position and a
// random query for every position; block tables are shuffled, so positions
// that are neighbours live in unrelated blocks.
struct World {
  AttnShape s;
  std::unique_ptr<KvCache> kv;
  std::vector<std::vector<int32_t>> blocks;  // per sequence
  std::vector<int32_t> len;                  // positions per sequence
  std::vector<std::vector<float>> q;         // per sequence: [len][n_head * head_dim]
  std::vector<float> sinks;                  // per head, where s.sinks points at them
  int64_t qw() const { return int64_t{s.n_head} * s.head_dim; }
  int64_t ow() const { return int64_t{s.n_head} * s.head_dim_v; }
  KvLayerView view(int32_t seq) const { return kv->layer_view(kLayer, blocks[seq].data()); }
};

// score_scale: typical |q.k|; large values make the softmax nearly one-hot,
// so most exps underflow. shared > 0: every key also has one common part,
// N(0, shared^2) per element, and elements of unequal sizes (x 0.25 to 4);
// `smooth` stores them through a KeySmoothing that takes the common part off
// and scales each element as model/key_smoothing.h does.
World make_world(const AttnShape& s, KvFormat format, std::vector<int32_t> lens, int32_t block_size, float score_scale,
                 uint32_t seed, float shared = 0, bool smooth = false) {
  World w;
  w.s = s;
  w.len = lens;
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  int32_t n_blocks = 0;
  for (int32_t n : lens) n_blocks += (n + block_size - 1) / block_size;
  const KvShape shape{2, s.n_head_kv * s.head_dim, s.n_head_kv * s.head_dim_v, s.n_head_kv};
  w.kv = std::make_unique<KvCache>(shape, n_blocks, block_size, format);
  std::vector<float> common(size_t(shape.n_layer) * shape.k_width, 0.0f), size(common.size(), 1.0f);
  if (shared > 0) {
    std::mt19937 crng(seed + 1);
    std::uniform_real_distribution<float> ud(-2.0f, 2.0f);
    for (float& x : common) x = nd(crng) * shared;
    for (float& x : size) x = std::exp2(ud(crng));
    if (smooth) {
      std::vector<float> inv(size.size());
      // Against queries of equal sizes, (E q^2 / E k^2)^(1/4) (key_smoothing.h).
      for (size_t i = 0; i < size.size(); ++i) inv[i] = 1.0f / std::sqrt(size[i]);
      w.kv->set_key_smoothing(KeySmoothing{common, inv});
    }
  }
  std::vector<int32_t> ids(n_blocks);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  size_t next = 0;
  std::vector<float> k(shape.k_width), v(shape.v_width);
  for (int32_t n : lens) {
    std::vector<int32_t> table(ids.begin() + next, ids.begin() + next + (n + block_size - 1) / block_size);
    next += table.size();
    for (int32_t p = 0; p < n; ++p) {
      for (size_t i = 0; i < k.size(); ++i) {
        const size_t at = size_t(kLayer) * shape.k_width + i;
        k[i] = nd(rng) * size[at] + common[at];
      }
      for (float& x : v) x = nd(rng);
      w.kv->write(kLayer, table[p / block_size], p % block_size, k.data(), v.data());
    }
    std::vector<float> q(size_t(n) * w.qw());
    const float qs = score_scale / std::sqrt(static_cast<float>(s.head_dim));
    for (float& x : q) x = nd(rng) * qs;
    w.q.push_back(std::move(q));
    w.blocks.push_back(std::move(table));
  }
  return w;
}

// Naive softmax in double over the K/V as stored (f16 values read back
// exactly), for query (seq, pos, head). Against quantized keys the query is
// the kernels' int8 one (attn_detail::quantize_query), as llama.cpp's q8_0
// activations: what it loses is the format's, not a kernel's error. Against
// quantized values the weights are quantized as the kernels define it
// (attention_chunk.h, quantize_weights): per chunk of kAttnChunk positions
// p = exp(score - the chunk's max), per group of 32 dimensions and run of
// kWeightRun positions p times the values' scale to int8 with the run's
// max / 127 as scale. The kernels compute the same in float, so a product
// that lies within kTieBand of a rounding tie may round the other way: one
// step of that weight is allowed per such term (`slack`, per dimension).
struct Reference {
  std::vector<double> out, slack;
};
constexpr double kTieBand = 0.01;

// Query (seq, pos, head) as the kernels score it: quantized against
// quantized keys.
std::vector<double> query_as_scored(const World& w, int32_t seq, int32_t pos, int32_t h) {
  const AttnShape& s = w.s;
  const float* q = w.q[seq].data() + pos * w.qw() + int64_t{h} * s.head_dim;
  std::vector<double> qv(q, q + s.head_dim);
  if (kv_type_quantized(w.kv->format().k)) {
    std::vector<int8_t> qi(s.head_dim);
    std::vector<float> qd(s.head_dim / kKvGroup);
    std::vector<int32_t> qs(qd.size());
    attn_detail::quantize_query(q, s.head_dim, qi.data(), qd.data(), qs.data());
    for (int32_t i = 0; i < s.head_dim; ++i) qv[i] = double(qd[i / kKvGroup]) * qi[i];
  }
  return qv;
}

Reference reference(const World& w, int32_t seq, int32_t pos, int32_t h) {
  const AttnShape& s = w.s;
  const int32_t g = h / (s.n_head / s.n_head_kv), bs = w.kv->block_size(), hdv = s.head_dim_v;
  const int32_t first = s.window > 0 ? std::max(0, pos - s.window + 1) : 0;
  const std::vector<double> qv = query_as_scored(w, seq, pos, h);
  std::vector<float> k(w.kv->shape().k_width), v(w.kv->shape().v_width);
  std::vector<double> scores;
  std::vector<std::vector<double>> vals, vscale;  // per position: the values, and per group their scale
  const KvLayerView view = w.view(seq);
  const bool vq = kv_type_quantized(w.kv->format().v);
  for (int32_t p = first; p <= pos; ++p) {
    w.kv->read(kLayer, w.blocks[seq][p / bs], p % bs, k.data(), v.data());
    double d = 0;
    for (int32_t i = 0; i < s.head_dim; ++i) d += qv[i] * k[g * s.head_dim + i];
    scores.push_back(d);
    vals.emplace_back(v.begin() + g * hdv, v.begin() + (g + 1) * hdv);
    std::vector<double> sc(hdv / kKvGroup, 1.0);
    if (vq)
      for (size_t i = 0; i < sc.size(); ++i) sc[i] = f16_to_f32(view.value_scales(p, g)[i * bs]);
    vscale.push_back(std::move(sc));
  }
  const double mx = *std::max_element(scores.begin(), scores.end());
  Reference ref{std::vector<double>(hdv, 0.0), std::vector<double>(hdv, 0.0)};
  double sum = 0;
  for (int32_t c0 = first / kAttnChunk * kAttnChunk; c0 <= pos; c0 += kAttnChunk) {
    const int32_t a = std::max(first, c0), b = std::min(pos + 1, c0 + kAttnChunk);  // the chunk's positions
    double m = -INFINITY;
    for (int32_t p = a; p < b; ++p) m = std::max(m, scores[p - first]);
    const double to_row = std::exp(m - mx);  // the chunk's partial in the row's scale
    std::vector<double> wt(b - a);
    for (int32_t p = a; p < b; ++p) sum += to_row * (wt[p - a] = std::exp(scores[p - first] - m));
    if (!vq) {
      for (int32_t p = a; p < b; ++p)
        for (int32_t d = 0; d < hdv; ++d) ref.out[d] += to_row * wt[p - a] * vals[p - first][d];
      continue;
    }
    for (int32_t gr = 0; gr < hdv / kKvGroup; ++gr)
      for (int32_t r0 = a / attn_detail::kWeightRun * attn_detail::kWeightRun; r0 < b; r0 += attn_detail::kWeightRun) {
        const int32_t ra = std::max(a, r0), rb = std::min(b, r0 + attn_detail::kWeightRun);
        double big = 0;
        for (int32_t p = ra; p < rb; ++p) big = std::max(big, std::abs(wt[p - a] * vscale[p - first][gr]));
        if (big < attn_detail::kMinRunWeight) continue;
        const double step = big / 127;
        for (int32_t p = ra; p < rb; ++p) {
          const double x = wt[p - a] * vscale[p - first][gr] / step;
          const double tie = std::abs(x - std::floor(x) - 0.5);
          const double qx = std::nearbyint(x) * step;
          for (int32_t d = gr * kKvGroup; d < (gr + 1) * kKvGroup; ++d) {
            const double code = vscale[p - first][gr] != 0 ? vals[p - first][d] / vscale[p - first][gr] : 0;
            ref.out[d] += to_row * qx * code;
            if (tie < kTieBand) ref.slack[d] += to_row * step * std::abs(code);
          }
        }
      }
  }
  if (s.sinks) sum += std::exp(double(s.sinks[h]) - mx);  // in the denominator only
  for (int32_t d = 0; d < hdv; ++d) {
    ref.out[d] /= sum;
    ref.slack[d] /= sum;
  }
  return ref;
}

// Worst |out - ref| beyond the reference's slack over all heads of rows
// [p0, p1) of a sequence. Values are N(0,1), so this is also the error
// relative to the values' scale.
double worst_error(const World& w, int32_t seq, int32_t p0, int32_t p1, const std::vector<float>& out) {
  // Under the sanitizers the kernels still write every row; the double
  // reference (most of the time there) checks every 13th row and the last.
  const int32_t stride = test::quick() ? 13 : 1;
  double worst = 0;
  for (int32_t p = p0; p < p1; p = (p + stride < p1 || p == p1 - 1) ? p + stride : p1 - 1)
    for (int32_t h = 0; h < w.s.n_head; ++h) {
      const Reference ref = reference(w, seq, p, h);
      const float* o = out.data() + (p - p0) * w.ow() + int64_t{h} * w.s.head_dim_v;
      for (int32_t d = 0; d < w.s.head_dim_v; ++d)
        worst = std::max(worst, std::abs(o[d] - ref.out[d]) - ref.slack[d]);
    }
  return worst;
}

std::vector<float> run_prefill(KernelLevel level, const World& w, int32_t seq, int32_t p0, int32_t p1,
                               ThreadPool& pool) {
  std::vector<float> out(size_t(p1 - p0) * w.ow(), NAN);
  attention_prefill_at(level, w.s, w.view(seq), w.q[seq].data() + p0 * w.qw(), w.qw(), p0, p1 - p0, out.data(),
                       w.ow(), pool);
  return out;
}

// One decode call for a batch: query b is (seqs[b], pos[b]).
std::vector<float> run_decode(KernelLevel level, const World& w, const std::vector<int32_t>& seqs,
                              const std::vector<int32_t>& pos, ThreadPool& pool) {
  const size_t B = seqs.size();
  std::vector<KvLayerView> views;
  std::vector<float> q(B * w.qw()), out(B * w.ow(), NAN);
  for (size_t b = 0; b < B; ++b) {
    views.push_back(w.view(seqs[b]));
    std::copy_n(w.q[seqs[b]].data() + pos[b] * w.qw(), w.qw(), q.data() + b * w.qw());
  }
  attention_decode_at(level, w.s, views.data(), pos.data(), static_cast<int32_t>(B), q.data(), w.qw(), out.data(),
                      w.ow(), pool);
  return out;
}

// The levels with distinct attention kernels (AVX2-VNNI shares AVX2's).
std::vector<KernelLevel> levels() {
  std::vector<KernelLevel> v;
  for (KernelLevel l : {KernelLevel::kScalar, KernelLevel::kAvx2, KernelLevel::kAvx512, KernelLevel::kAvx512Vnni})
    if (cpu_supports_level(l)) v.push_back(l);
  return v;
}

bool same_bits(const float* a, const float* b, size_t n) { return std::memcmp(a, b, n * sizeof(float)) == 0; }

World make_world(const AttnShape& s, KvType type, std::vector<int32_t> lens, int32_t block_size, float score_scale,
                 uint32_t seed) {
  return make_world(s, kv_format(type, type), std::move(lens), block_size, score_scale, seed);
}

struct Case {
  AttnShape s;
  KvType kt, vt;
  int32_t len;         // context length
  int32_t p0;          // prefill [p0, len)
  int32_t block_size;
  float score_scale;
};

// Head dims 64/128/256 and odd ones (72: a half vector for AVX-512; 20: a
// partial vector for every width), GQA groups 1/4/8, sliding windows, ranges
// that cross chunk boundaries (multiples of 128) with prefill starting
// mid-chunk, and block sizes that are and are not a multiple of the vector
// width (the kernels read key vectors from the cache only in the first case).
const Case kCases[] = {
    {{4, 4, 64, 64, 0}, KvType::kF32, KvType::kF32, 300, 37, 16, 4.0f},
    {{8, 2, 128, 128, 0}, KvType::kF16, KvType::kF16, 290, 101, 16, 4.0f},
    {{4, 1, 256, 256, 0}, KvType::kF16, KvType::kF16, 270, 0, 16, 4.0f},
    {{8, 1, 256, 256, 100}, KvType::kF16, KvType::kF16, 280, 120, 5, 4.0f},
    {{8, 1, 72, 56, 0}, KvType::kF32, KvType::kF32, 200, 50, 7, 30.0f},
    {{3, 3, 20, 36, 60}, KvType::kF16, KvType::kF16, 260, 1, 3, 30.0f},
    {{16, 2, 64, 64, 200}, KvType::kF32, KvType::kF32, 390, 250, 16, 4.0f},
    // 8-slot blocks: AVX2 reads its 8-key vectors from the cache, AVX-512
    // gathers its 16-key ones.
    {{8, 2, 64, 64, 0}, KvType::kF16, KvType::kF16, 330, 90, 8, 4.0f},
    // Quantized K and V, each with every other type: heads of one to eight
    // groups of 32 (96: three), windows, 32- and 48-slot blocks.
    {{8, 2, 64, 64, 0}, KvType::kQ8_0, KvType::kQ8_0, 300, 37, 16, 4.0f},
    {{4, 1, 256, 256, 100}, KvType::kQ4_0, KvType::kQ4_0, 280, 120, 16, 4.0f},
    {{6, 3, 96, 32, 0}, KvType::kQ4_0, KvType::kQ8_0, 290, 101, 32, 30.0f},
    {{8, 1, 64, 128, 60}, KvType::kQ8_0, KvType::kF16, 260, 1, 16, 4.0f},
    {{4, 4, 32, 64, 0}, KvType::kF16, KvType::kQ4_0, 200, 50, 48, 4.0f},
    {{8, 8, 32, 32, 0}, KvType::kF32, KvType::kQ8_0, 150, 20, 16, 4.0f},
    {{4, 2, 64, 64, 0}, KvType::kQ4_0, KvType::kF32, 170, 60, 16, 30.0f},
};

// The kernels find head g's rows through the view, so a cache split into
// other heads than the attention's would be read out of place: refused.
TEST(KernelsAttention, CacheWithOtherHeadsIsRefused) {
  const AttnShape s{4, 2, 8, 8, 0};
  KvCache kv(KvShape{1, 16, 16, 1}, 1, 16);  // one head of 16, not two of 8
  const int32_t blocks[] = {0};
  const KvLayerView view = kv.layer_view(0, blocks);
  std::vector<float> q(4 * 8, 0.5f), out(4 * 8);
  const int32_t pos = 0;
  ThreadPool pool(2);
  for (int which = 0; which < 2; ++which) {
    try {
      if (which == 0)
        attention_decode(s, &view, &pos, 1, q.data(), 32, out.data(), 32, pool);
      else
        attention_prefill(s, view, q.data(), 32, 0, 1, out.data(), 32, pool);
      FAIL() << (which == 0 ? "decode" : "prefill") << " read a cache of other heads";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find("1 heads of 16"), std::string::npos) << e.what();
    }
  }
}

TEST(KernelsAttention, EveryLevelMatchesDoubleReference) {
  ThreadPool pool(2);
  for (KernelLevel level : levels())
    for (const Case& c : kCases) {
      SCOPED_TRACE(testing::Message() << kernel_level_name(level) << " heads " << c.s.n_head << "/" << c.s.n_head_kv
                                      << " dims " << c.s.head_dim << "/" << c.s.head_dim_v << " window "
                                      << c.s.window << " k " << kv_type_name(c.kt) << " v " << kv_type_name(c.vt));
      const World w = make_world(c.s, kv_format(c.kt, c.vt), {c.len}, c.block_size, c.score_scale, 7);
      const std::vector<float> pre = run_prefill(level, w, 0, c.p0, c.len, pool);
      // Float rounding of a score is relative to |q.k| and grows with the
      // dot's length, and exp turns it into a relative error of the weights:
      // observed errors sit 3-10x below this bound. A real bug (a lost chunk,
      // a wrong row) is O(0.1).
      const double tol = 3e-6 * c.score_scale * std::sqrt(c.s.head_dim / 16.0);
      EXPECT_LT(worst_error(w, 0, c.p0, c.len, pre), tol);
      for (int32_t pos : {0, 1, 127, 128, c.len - 1}) {
        const std::vector<float> dec = run_decode(level, w, {0}, {pos}, pool);
        EXPECT_LT(worst_error(w, 0, pos, pos + 1, dec), tol) << "decode at " << pos;
      }
    }
}

// The same query gives the same bits from a prefill chunk (whole, or split
// at any point), from a single-query decode, and from a batched decode.
TEST(KernelsAttention, PrefillAndDecodeAreBitIdentical) {
  ThreadPool pool(2);
  for (KernelLevel level : levels())
    for (const Case& c : kCases) {
      SCOPED_TRACE(testing::Message() << kernel_level_name(level) << " heads " << c.s.n_head << "/" << c.s.n_head_kv
                                      << " dims " << c.s.head_dim << " window " << c.s.window << " k "
                                      << kv_type_name(c.kt) << " v " << kv_type_name(c.vt));
      const World w = make_world(c.s, kv_format(c.kt, c.vt), {c.len, 150}, c.block_size, c.score_scale, 11);
      const std::vector<float> whole = run_prefill(level, w, 0, c.p0, c.len, pool);
      const int32_t mid = (c.p0 + c.len) / 2 + 1;
      std::vector<float> split = run_prefill(level, w, 0, c.p0, mid, pool);
      const std::vector<float> rest = run_prefill(level, w, 0, mid, c.len, pool);
      split.insert(split.end(), rest.begin(), rest.end());
      EXPECT_TRUE(same_bits(whole.data(), split.data(), whole.size()));

      for (int32_t pos = c.p0; pos < c.len; ++pos) {
        const std::vector<float> one = run_decode(level, w, {0}, {pos}, pool);
        ASSERT_TRUE(same_bits(one.data(), whole.data() + (pos - c.p0) * w.ow(), w.ow())) << "position " << pos;
      }
      // A batch mixing both sequences at different lengths.
      const std::vector<int32_t> pos = {c.len - 1, 149, c.p0, 3};
      const std::vector<float> batch = run_decode(level, w, {0, 1, 0, 1}, pos, pool);
      for (size_t b = 0; b < pos.size(); ++b) {
        const int32_t seq = static_cast<int32_t>(b % 2);
        const std::vector<float> one = run_decode(level, w, {seq}, {pos[b]}, pool);
        EXPECT_TRUE(same_bits(one.data(), batch.data() + b * w.ow(), w.ow())) << "batch row " << b;
      }
    }
}

// Attention sinks (gpt-oss): head h's softmax gains e^sinks[h] in its
// denominator. Every level against the double reference, with sinks far
// above, near and below the rows' scores; prefill (whole or split), single
// and batched decode, on one thread and on two (where decode splits a head
// along the KV length), give the same bits; a null span gives the bits of
// attention without sinks.
TEST(KernelsAttention, SinksJoinTheDenominatorOnly) {
  const Case cases[] = {
      {{8, 2, 64, 64, 0}, KvType::kF32, KvType::kF32, 300, 37, 16, 4.0f},
      {{6, 3, 20, 36, 60}, KvType::kF16, KvType::kF16, 260, 1, 3, 4.0f},
      {{4, 1, 64, 56, 0}, KvType::kQ8_0, KvType::kF16, 290, 101, 16, 4.0f},
  };
  std::vector<std::vector<float>> one_thread;
  for (int threads : {1, 2}) {
    ThreadPool pool(threads);
    size_t run = 0;
    for (KernelLevel level : levels())
      for (const Case& c : cases) {
        SCOPED_TRACE(testing::Message() << kernel_level_name(level) << " threads " << threads << " heads "
                                        << c.s.n_head << "/" << c.s.n_head_kv << " dims " << c.s.head_dim
                                        << " window " << c.s.window << " k " << kv_type_name(c.kt));
        World w = make_world(c.s, kv_format(c.kt, c.vt), {c.len, 150}, c.block_size, c.score_scale, 13);
        const std::vector<float> plain = run_prefill(level, w, 0, c.p0, c.len, pool);
        std::mt19937 rng(5);
        std::normal_distribution<float> nd(0.0f, 2.0f);
        for (int32_t h = 0; h < c.s.n_head; ++h) w.sinks.push_back(h % 3 == 0 ? 9.0f + h : nd(rng));
        w.s.sinks = w.sinks.data();
        const std::vector<float> whole = run_prefill(level, w, 0, c.p0, c.len, pool);
        const double tol = 3e-6 * c.score_scale * std::sqrt(c.s.head_dim / 16.0);
        // Against the reference once; on two threads, the same bits as on one.
        if (threads == 1) {
          EXPECT_LT(worst_error(w, 0, c.p0, c.len, whole), tol);
          one_thread.push_back(whole);
        } else {
          EXPECT_TRUE(same_bits(whole.data(), one_thread[run].data(), whole.size()));
        }
        ++run;
        EXPECT_FALSE(same_bits(whole.data(), plain.data(), whole.size()));
        const int32_t mid = (c.p0 + c.len) / 2 + 1;
        std::vector<float> split = run_prefill(level, w, 0, c.p0, mid, pool);
        const std::vector<float> rest = run_prefill(level, w, 0, mid, c.len, pool);
        split.insert(split.end(), rest.begin(), rest.end());
        EXPECT_TRUE(same_bits(whole.data(), split.data(), whole.size()));
        for (int32_t pos = c.p0; pos < c.len; pos += 7) {
          const std::vector<float> one = run_decode(level, w, {0}, {pos}, pool);
          ASSERT_TRUE(same_bits(one.data(), whole.data() + (pos - c.p0) * w.ow(), w.ow())) << "position " << pos;
        }
        const std::vector<int32_t> pos = {c.len - 1, 149, c.p0, 3};
        const std::vector<float> batch = run_decode(level, w, {0, 1, 0, 1}, pos, pool);
        for (size_t b = 0; b < pos.size(); ++b) {
          const std::vector<float> one = run_decode(level, w, {static_cast<int32_t>(b % 2)}, {pos[b]}, pool);
          EXPECT_TRUE(same_bits(one.data(), batch.data() + b * w.ow(), w.ow())) << "batch row " << b;
        }
        w.s.sinks = nullptr;
        const std::vector<float> again = run_prefill(level, w, 0, c.p0, c.len, pool);
        EXPECT_TRUE(same_bits(again.data(), plain.data(), plain.size()));
      }
  }
}

// Thread counts change which thread runs which tile or chunk, and whether
// decode splits a head along the KV length (it does when there are fewer
// heads than 2 x threads); none may change a bit.
TEST(KernelsAttention, ThreadCountDoesNotChangeResults) {
  const AttnShape shapes[] = {{4, 1, 256, 256, 0}, {4, 2, 64, 64, 300}, {8, 8, 32, 32, 0}};
  for (KernelLevel level : levels())
    for (const AttnShape& s : shapes)
      for (KvType t : {KvType::kF16, KvType::kQ8_0, KvType::kQ4_0}) {
      SCOPED_TRACE(testing::Message() << kernel_level_name(level) << " heads " << s.n_head << "/" << s.n_head_kv
                                      << " " << kv_type_name(t));
      const World w = make_world(s, t, {700, 300}, 16, 4.0f, 5);
      std::vector<float> pre[3], dec[3];
      // Under the sanitizers: one thread against three.
      for (int t = 1; t <= 3; t += test::quick() ? 2 : 1) {
        ThreadPool pool(t);
        pre[t - 1] = run_prefill(level, w, 0, 90, 700, pool);
        dec[t - 1] = run_decode(level, w, {0, 1, 0}, {699, 299, 200}, pool);
      }
      for (int t = test::quick() ? 2 : 1; t < 3; ++t) {
        EXPECT_TRUE(same_bits(pre[0].data(), pre[t].data(), pre[0].size())) << t + 1 << " threads, prefill";
        EXPECT_TRUE(same_bits(dec[0].data(), dec[t].data(), dec[0].size())) << t + 1 << " threads, decode";
      }
      EXPECT_TRUE(same_bits(dec[0].data(), pre[0].data() + (699 - 90) * w.ow(), w.ow()));
    }
}

// Every position's keys of a sequence as the cache returns them, [pos][k_width].
std::vector<float> keys_of(const World& w, int32_t seq) {
  const int32_t bs = w.kv->block_size(), kw = w.kv->shape().k_width;
  std::vector<float> keys(size_t(w.len[seq]) * kw), v(w.kv->shape().v_width);
  for (int32_t p = 0; p < w.len[seq]; ++p)
    w.kv->read(kLayer, w.blocks[seq][p / bs], p % bs, keys.data() + size_t(p) * kw, v.data());
  return keys;
}

// Attention weights of query (seq, pos, head) over positions [first, pos] in
// double; keys: keys_of(w, seq).
std::vector<double> reference_weights(const World& w, const std::vector<float>& keys, int32_t seq, int32_t pos,
                                      int32_t h) {
  const AttnShape& s = w.s;
  const int32_t g = h / (s.n_head / s.n_head_kv), kw = w.kv->shape().k_width;
  const int32_t first = s.window > 0 ? std::max(0, pos - s.window + 1) : 0;
  const std::vector<double> qv = query_as_scored(w, seq, pos, h);
  std::vector<double> wt;
  for (int32_t p = first; p <= pos; ++p) {
    const float* k = keys.data() + size_t(p) * kw + size_t(g) * s.head_dim;
    double d = 0;
    for (int32_t i = 0; i < s.head_dim; ++i) d += qv[i] * k[i];
    wt.push_back(d);
  }
  const double mx = *std::max_element(wt.begin(), wt.end());
  double sum = 0;
  for (double& x : wt) sum += (x = std::exp(x - mx));
  for (double& x : wt) x /= sum;
  return wt;
}

// The attention mass (each position's weight summed over query rows and
// heads) from prefill and from batched decode, against the double weights;
// it changes no output bit, and no thread count changes its bits.
TEST(KernelsAttention, MassMatchesReferenceWeights) {
  for (const Case& c : kCases) {
    const World w = make_world(c.s, kv_format(c.kt, c.vt), {c.len, 150}, c.block_size, c.score_scale, 13);
    const std::vector<float> keys[2] = {keys_of(w, 0), keys_of(w, 1)};
    // The weights summed over heads: of the prefill rows [p0, len) of
    // sequence 0, and of each decode query (two of sequence 0, one of 1).
    auto summed = [&](int32_t seq, int32_t p0, int32_t p1) {
      std::vector<double> sum(c.len, 0.0);
      for (int32_t p = p0; p < p1; ++p)
        for (int32_t h = 0; h < c.s.n_head; ++h) {
          const std::vector<double> wt = reference_weights(w, keys[seq], seq, p, h);
          const int32_t first = p + 1 - static_cast<int32_t>(wt.size());
          for (size_t i = 0; i < wt.size(); ++i) sum[first + i] += wt[i];
        }
      return sum;
    };
    const std::vector<double> want = summed(0, c.p0, c.len);
    const std::vector<int32_t> seqs = {0, 1, 0}, pos = {c.len - 1, 149, c.p0};
    std::vector<std::vector<double>> want_d;
    for (size_t b = 0; b < 3; ++b) want_d.push_back(summed(seqs[b], pos[b], pos[b] + 1));

    for (KernelLevel level : levels()) {
      SCOPED_TRACE(testing::Message() << kernel_level_name(level) << " heads " << c.s.n_head << "/" << c.s.n_head_kv
                                      << " dims " << c.s.head_dim << " window " << c.s.window << " k "
                                      << kv_type_name(c.kt) << " v " << kv_type_name(c.vt));
      // Prefill at 1 thread and at 3, against the output without the mass.
      std::vector<float> mass[2], out[2];
      for (int i = 0; i < 2; ++i) {
        ThreadPool pool(i == 0 ? 1 : 3);
        mass[i].assign(c.len, 0.0f);
        out[i].assign(size_t(c.len - c.p0) * w.ow(), NAN);
        attention_prefill_at(level, w.s, w.view(0), w.q[0].data() + c.p0 * w.qw(), w.qw(), c.p0, c.len - c.p0,
                             out[i].data(), w.ow(), pool, mass[i].data());
        if (i == 1) {
          const std::vector<float> plain = run_prefill(level, w, 0, c.p0, c.len, pool);
          EXPECT_TRUE(same_bits(plain.data(), out[i].data(), plain.size())) << "the mass changed the output";
        }
      }
      const double tol = 3e-7 * c.s.n_head * (c.len - c.p0);
      double worst = 0;
      for (int32_t i = 0; i < c.len; ++i) worst = std::max(worst, std::abs(mass[0][i] - want[i]));
      EXPECT_LT(worst, tol);
      EXPECT_TRUE(same_bits(mass[0].data(), mass[1].data(), c.len)) << "threads changed the prefill mass";

      // Decode, one batch: at 1 thread a head per item, at 3 split along
      // the KV length.
      std::vector<float> dm[2];
      for (int i = 0; i < 2; ++i) {
        ThreadPool tp(i == 0 ? 1 : 3);
        dm[i].assign(size_t(3) * c.len, 0.0f);
        std::vector<KvLayerView> views;
        std::vector<float> q(3 * w.qw()), o(3 * w.ow());
        float* dest[3];
        for (size_t b = 0; b < 3; ++b) {
          views.push_back(w.view(seqs[b]));
          std::copy_n(w.q[seqs[b]].data() + pos[b] * w.qw(), w.qw(), q.data() + b * w.qw());
          dest[b] = dm[i].data() + b * c.len;
        }
        attention_decode_at(level, w.s, views.data(), pos.data(), 3, q.data(), w.qw(), o.data(), w.ow(), tp, dest);
        const std::vector<float> plain_d = run_decode(level, w, seqs, pos, tp);
        EXPECT_TRUE(same_bits(plain_d.data(), o.data(), o.size())) << "the mass changed the decode output";
      }
      EXPECT_TRUE(same_bits(dm[0].data(), dm[1].data(), dm[0].size())) << "threads changed the decode mass";
      for (size_t b = 0; b < 3; ++b) {
        double total = 0, worst_d = 0;
        for (int32_t i = 0; i < c.len; ++i) {
          total += dm[0][b * c.len + i];
          worst_d = std::max(worst_d, std::abs(dm[0][b * c.len + i] - want_d[b][i]));
        }
        EXPECT_LT(worst_d, 1e-6 * c.s.n_head) << "decode row " << b;
        EXPECT_NEAR(total, c.s.n_head, 1e-4 * c.s.n_head) << "decode row " << b;
      }
    }
  }
}

// A part every key shares moves all of a query's scores by the same amount,
// and a key element scaled up meets a query element scaled down: storing
// keys smoothed (the cache's KeySmoothing) leaves attention as it was, and a
// 4-bit cache then spends its codes on what differs between keys.
TEST(KernelsAttention, SmoothedKeysGiveTheSameAttention) {
  ThreadPool pool(2);
  const AttnShape s{4, 2, 64, 64, 0};
  const World exact = make_world(s, kv_format(KvType::kF32, KvType::kF32), {200}, 16, 4.0f, 5, 3.0f, false);
  const std::vector<float> want = run_prefill(active_kernel_level(), exact, 0, 0, 200, pool);
  auto error = [&](const std::vector<float>& got) {
    double worst = 0;
    for (size_t i = 0; i < got.size(); ++i) worst = std::max(worst, double(std::abs(got[i] - want[i])));
    return worst;
  };
  for (KernelLevel level : levels()) {
    SCOPED_TRACE(kernel_level_name(level));
    World f32 = make_world(s, kv_format(KvType::kF32, KvType::kF32), {200}, 16, 4.0f, 5, 3.0f, true);
    for (int32_t p = 0; p < 200; ++p) f32.kv->rotate_queries(kLayer, f32.q[0].data() + p * f32.qw(), s.n_head, s.head_dim);
    const std::vector<float> smoothed = run_prefill(level, f32, 0, 0, 200, pool);
    EXPECT_LT(error(smoothed), 1e-4);
    EXPECT_TRUE(same_bits(smoothed.data() + 150 * f32.ow(), run_decode(level, f32, {0}, {150}, pool).data(), f32.ow()));
    // The queries go into the keys' space, as the model sends them.
    auto q4_rms = [&](bool smooth) {
      World w = make_world(s, kv_format(KvType::kQ4_0, KvType::kF32), {200}, 16, 4.0f, 5, 3.0f, smooth);
      for (int32_t p = 0; p < 200; ++p) w.kv->rotate_queries(kLayer, w.q[0].data() + p * w.qw(), s.n_head, s.head_dim);
      const std::vector<float> got = run_prefill(level, w, 0, 0, 200, pool);
      double sum = 0;
      for (size_t i = 0; i < got.size(); ++i) sum += double(got[i] - want[i]) * (got[i] - want[i]);
      return std::sqrt(sum / got.size());
    };
    const double plain = q4_rms(false), less = q4_rms(true);
    EXPECT_LT(less, 0.5 * plain) << plain << " " << less;
  }
}

// f16 and f32 storage of the same K/V differ only by the f16 rounding of the
// inputs: with N(0,1) values that is a relative 2^-11 at most per element.
TEST(KernelsAttention, F16CacheStaysCloseToF32) {
  ThreadPool pool(2);
  const AttnShape s{4, 1, 128, 128, 0};
  const World a = make_world(s, KvType::kF32, {260}, 16, 4.0f, 3);
  const World b = make_world(s, KvType::kF16, {260}, 16, 4.0f, 3);
  const std::vector<float> x = run_prefill(active_kernel_level(), a, 0, 0, 260, pool);
  const std::vector<float> y = run_prefill(active_kernel_level(), b, 0, 0, 260, pool);
  double worst = 0;
  for (size_t i = 0; i < x.size(); ++i) worst = std::max(worst, double(std::abs(x[i] - y[i])));
  EXPECT_GT(worst, 0.0);  // the storage type really changed
  EXPECT_LT(worst, 1e-2);
}

}  // namespace
}  // namespace tandem

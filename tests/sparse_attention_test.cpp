// Sparse attention (Quest): the key bounds kept beside the cache for every
// cache type, through copies and swaps; the bound scores and the block
// selection against scalar references; attention over the selected blocks
// against a double reference; and on a real model, a budget that holds the
// whole context gives dense attention's bits, speculation does not change
// sparse output, and bad budgets are refused with the reason.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/error.h"
#include "engine/kv_pool_sizing.h"
#include "engine/llm_engine.h"
#include "kernels/attention.h"
#include "kernels/sparse_select.h"
#include "kv/key_bounds.h"
#include "kv/kv_cache.h"
#include "model/model.h"
#include "quant/quant.h"
#include "runtime/thread_pool.h"
#include "test_support.h"
#include "tokenizer/tokenizer.h"

namespace tandem {
namespace {

// Writes random keys into every slot of `block` (all layers), values too.
void fill_block(KvCache& kv, int32_t block, std::mt19937& rng) {
  std::normal_distribution<float> nd;
  std::vector<float> k(kv.shape().k_width), v(kv.shape().v_width);
  for (int32_t l = 0; l < kv.shape().n_layer; ++l)
    for (int32_t s = 0; s < kv.block_size(); ++s) {
      for (size_t i = 0; i < k.size(); ++i) k[i] = nd(rng) * (1 + float(i % 7));  // channels of unequal scale
      for (float& x : v) x = nd(rng);
      kv.write(l, block, s, k.data(), v.data());
    }
}

// Bounds are the per-channel min and max of the keys as the cache reads them
// back, for every type (rotated q4_0 and smoothed keys included), as f16
// rounded outward (below the min, above the max, by at most f16's rounding
// step), and follow their block through copy_block and a save / load.
TEST(KeyBounds, AreTheStoredKeysMinAndMaxForEveryType) {
  const int32_t n_head_kv = 3, head = 64, n_layer = 3, n_blocks = 6;
  const KvShape shape{n_layer, n_head_kv * head, n_head_kv * 32, n_head_kv};
  for (KvType t : {KvType::kF32, KvType::kF16, KvType::kQ8_0, KvType::kQ4_0}) {
    SCOPED_TRACE(kv_type_name(t));
    KvCacheTypes types{t, t};
    KvCache kv(shape, n_blocks, 16, kv_format(types));
    if (kv_type_quantized(t)) {
      KeySmoothing sm;
      sm.offset.assign(size_t(n_layer) * shape.k_width, 0.25f);
      sm.scale.assign(size_t(n_layer) * shape.k_width, 1.5f);
      kv.set_key_smoothing(sm);
    }
    kv.keep_key_bounds({true, false, true});
    std::mt19937 rng(7);
    for (int32_t b = 0; b < 3; ++b) {
      fill_block(kv, b, rng);
      for (int32_t l = 0; l < n_layer; ++l) kv.key_bounds()->update(kv, l, b);
    }
    const KeyBounds& kb = *kv.key_bounds();
    EXPECT_FALSE(kb.has(1));
    auto check = [&](int32_t block, int32_t from) {
      std::vector<float> k(shape.k_width), v(shape.v_width), lo(shape.k_width, INFINITY), hi(shape.k_width, -INFINITY);
      for (int32_t l : {0, 2}) {
        std::fill(lo.begin(), lo.end(), INFINITY);
        std::fill(hi.begin(), hi.end(), -INFINITY);
        for (int32_t s = 0; s < 16; ++s) {
          kv.read(l, from, s, k.data(), v.data());
          for (int32_t i = 0; i < shape.k_width; ++i) {
            lo[i] = std::min(lo[i], k[i]);
            hi[i] = std::max(hi[i], k[i]);
          }
        }
        for (int32_t h = 0; h < n_head_kv; ++h) {
          const uint16_t* got = kb.base(l, h) + size_t(block) * kb.block_stride();
          for (int32_t c = 0; c < head; ++c) {
            const float want_lo = lo[h * head + c], want_hi = hi[h * head + c];
            const float got_lo = f16_to_f32(got[c]), got_hi = f16_to_f32(got[head + c]);
            // f16's step is 2^-10 of the value (2^-24 below 2^-14).
            auto step = [](float x) { return std::max(std::fabs(x) * 0x1p-10f, 0x1p-24f); };
            ASSERT_LE(got_lo, want_lo) << "layer " << l << " head " << h << " channel " << c;
            ASSERT_GT(got_lo, want_lo - step(want_lo)) << "layer " << l << " head " << h << " channel " << c;
            ASSERT_GE(got_hi, want_hi) << "layer " << l << " head " << h << " channel " << c;
            ASSERT_LT(got_hi, want_hi + step(want_hi)) << "layer " << l << " head " << h << " channel " << c;
          }
        }
      }
    };
    for (int32_t b = 0; b < 3; ++b) check(b, b);
    kv.copy_block(1, 4);
    check(4, 1);
    std::vector<std::byte> saved(kv.block_bytes());
    kv.save_block(2, saved.data());
    fill_block(kv, 2, rng);  // overwritten (bounds now stale) ...
    kv.load_block(5, saved.data());  // ... and swapped back in elsewhere
    check(5, 5);
  }
}

// The vector kernel's scores against the reference, on odd sizes, and the
// bound holds: no key of a block scores above it.
TEST(SparseSelect, BoundScoresMatchTheReference) {
  std::mt19937 rng(3);
  std::normal_distribution<float> nd;
  for (int32_t dim : {8, 24, 40, 64, 72, 100, 128}) {
    for (int32_t n_q : {1, 2, 3, 5, 8, 12}) {
      const int32_t n_blocks = 37;
      std::vector<uint16_t> bounds(size_t(n_blocks) * 2 * dim);
      std::vector<float> keys(size_t(n_blocks) * 16 * dim);
      for (int32_t b = 0; b < n_blocks; ++b)
        for (int32_t c = 0; c < dim; ++c) {
          float lo = INFINITY, hi = -INFINITY;
          for (int32_t s = 0; s < 16; ++s) {
            const float x = nd(rng);
            keys[(size_t(b) * 16 + s) * dim + c] = x;
            lo = std::min(lo, x);
            hi = std::max(hi, x);
          }
          // Bounds that hold as f16: one step outward of the nearest.
          uint16_t l16 = f32_to_f16(lo), h16 = f32_to_f16(hi);
          if (f16_to_f32(l16) > lo) l16 = uint16_t(lo > 0 ? l16 - 1 : l16 + 1);
          if (f16_to_f32(h16) < hi) h16 = uint16_t(hi > 0 ? h16 + 1 : h16 - 1);
          bounds[size_t(b) * 2 * dim + c] = l16;
          bounds[size_t(b) * 2 * dim + dim + c] = h16;
        }
      const int64_t q_stride = dim + 5;
      std::vector<float> q(size_t(n_q) * q_stride);
      for (float& x : q) x = nd(rng);
      std::vector<int32_t> blocks(23);
      for (int32_t& b : blocks) b = int32_t(rng() % n_blocks);
      std::vector<float> want(blocks.size()), got(blocks.size());
      block_bound_scores_ref(q.data(), n_q, q_stride, dim, bounds.data(), 2 * dim, blocks.data(),
                             int32_t(blocks.size()), want.data());
      for (KernelLevel level : kAllKernelLevels) {
        if (!cpu_supports_level(level)) continue;
        block_bound_scores(level, q.data(), n_q, q_stride, dim, bounds.data(), 2 * dim, blocks.data(),
                           int32_t(blocks.size()), got.data());
        for (size_t i = 0; i < want.size(); ++i)
          EXPECT_NEAR(got[i], want[i], 1e-4f * (1 + std::fabs(want[i]))) << "dim " << dim << " n_q " << n_q;
      }
      for (size_t i = 0; i < blocks.size(); ++i)
        for (int32_t g = 0; g < n_q; ++g)
          for (int32_t s = 0; s < 16; ++s) {
            double dot = 0;
            for (int32_t c = 0; c < dim; ++c) dot += double(q[g * q_stride + c]) * keys[(size_t(blocks[i]) * 16 + s) * dim + c];
            EXPECT_LE(dot, want[i] + 1e-4 * (1 + std::fabs(want[i])));
          }
    }
  }
}

// The table: the sinks, the window and the highest-scoring blocks between
// (ties to the earlier), in position order, against a sort of all scores.
TEST(SparseSelect, TableIsSinksTopBlocksAndWindow) {
  std::mt19937 rng(5);
  std::normal_distribution<float> nd;
  const int32_t dim = 40, bs = 16;
  const SparseAttention o{160, 32, 48};  // 10 blocks: 2 sinks, 3 window, 5 chosen
  for (int32_t pos : {159, 160, 175, 300, 1001}) {
    const int32_t held = pos / bs + 1;
    EXPECT_EQ(sparse_table_blocks(o, pos, bs), held > 10 ? 10 : 0);
    if (held <= 10) continue;
    std::vector<int32_t> seq_table(held);
    std::iota(seq_table.begin(), seq_table.end(), 0);
    std::shuffle(seq_table.begin(), seq_table.end(), rng);
    std::vector<uint16_t> bounds(size_t(held) * 2 * dim);
    for (int32_t b = 0; b < held; ++b)
      for (int32_t c = 0; c < dim; ++c) {
        // Quantized to a coarse grid so that some scores tie (integers: exact in f16).
        const float a = std::round(nd(rng)), d = std::round(std::fabs(nd(rng)));
        bounds[size_t(b) * 2 * dim + c] = f32_to_f16(a);
        bounds[size_t(b) * 2 * dim + dim + c] = f32_to_f16(a + d);
      }
    std::vector<float> q(dim);
    for (float& x : q) x = std::round(nd(rng));
    std::vector<float> scores(held);
    std::vector<int32_t> index(held), table(10);
    select_blocks(KernelLevel::kScalar, o, pos, bs, seq_table.data(), q.data(), 1, dim, dim, bounds.data(), 2 * dim,
                  scores.data(), index.data(), table.data());
    // Reference: every candidate's score, sorted.
    const int32_t first = 2, last = pos / bs - 3 + 1;
    std::vector<std::pair<float, int32_t>> all;
    for (int32_t j = first; j < last; ++j) {
      const uint16_t* lo = bounds.data() + size_t(seq_table[j]) * 2 * dim;
      float s = 0;
      for (int32_t c = 0; c < dim; ++c)
        s += std::max(q[c] * f16_to_f32(lo[c]), q[c] * f16_to_f32(lo[dim + c]));
      all.push_back({-s, j});
    }
    std::sort(all.begin(), all.end());
    std::vector<int32_t> chosen;
    for (int32_t i = 0; i < 5; ++i) chosen.push_back(all[i].second);
    std::sort(chosen.begin(), chosen.end());
    std::vector<int32_t> want = {seq_table[0], seq_table[1]};
    for (int32_t j : chosen) want.push_back(seq_table[j]);
    for (int32_t j = last; j <= pos / bs; ++j) want.push_back(seq_table[j]);
    EXPECT_EQ(table, want) << "pos " << pos;
  }
}

// Keys beyond f16's range leave infinite bounds, and an infinite bound times
// a zero query channel is not a number: such a block ranks highest (it could
// weigh anything) and the selection stays well-formed at every level.
TEST(SparseSelect, InfiniteBoundsRankHighest) {
  const int32_t dim = 16, bs = 16, pos = 20 * bs;
  const SparseAttention o{96, 16, 64};  // 1 sink, 4 window, 1 chosen
  std::vector<int32_t> seq_table(pos / bs + 1);
  std::iota(seq_table.begin(), seq_table.end(), 0);
  std::vector<uint16_t> bounds(seq_table.size() * 2 * dim, f32_to_f16(0.5f));
  bounds[size_t(7) * 2 * dim + 3] = 0xfc00;  // block 7, channel 3: [-inf, +inf]
  bounds[size_t(7) * 2 * dim + dim + 3] = 0x7c00;
  std::vector<float> q(dim, 1.0f);
  q[3] = 0.0f;
  for (KernelLevel level : kAllKernelLevels) {
    if (!cpu_supports_level(level)) continue;
    std::vector<float> scores(seq_table.size());
    std::vector<int32_t> index(seq_table.size()), table(6);
    select_blocks(level, o, pos, bs, seq_table.data(), q.data(), 1, dim, dim, bounds.data(), 2 * dim,
                  scores.data(), index.data(), table.data());
    EXPECT_EQ(table, (std::vector<int32_t>{0, 7, 17, 18, 19, 20})) << kernel_level_name(level);
  }
}

// Attention over per-head tables (each KV head its own selected blocks) is
// attention over exactly those keys: against a double reference.
TEST(SparseSelect, AttentionReadsEachHeadsSelectedBlocks) {
  const int32_t n_head = 6, n_head_kv = 3, dim = 24, bs = 16, n_blocks = 20, pos = 19 * bs + 5;
  const KvShape shape{1, n_head_kv * dim, n_head_kv * dim, n_head_kv};
  KvCache kv(shape, n_blocks, bs, KvType::kF32);
  std::mt19937 rng(11);
  std::normal_distribution<float> nd;
  std::vector<float> k(shape.k_width), v(shape.v_width);
  for (int32_t p = 0; p <= pos; ++p) {
    for (float& x : k) x = nd(rng);
    for (float& x : v) x = nd(rng);
    kv.write(0, p / bs, p % bs, k.data(), v.data());
  }
  std::vector<float> q(size_t(n_head) * dim);
  for (float& x : q) x = nd(rng) * 0.3f;
  // Head h reads blocks 0, then h + 2, h + 5, then 18 and 19 (the last partial).
  const int32_t n_table = 5;
  std::vector<int32_t> tables;
  for (int32_t h = 0; h < n_head_kv; ++h)
    for (int32_t b : {0, h + 2, h + 5, 18, 19}) tables.push_back(b);
  std::vector<int32_t> dense(n_blocks);
  std::iota(dense.begin(), dense.end(), 0);
  KvLayerView view = kv.layer_view(0, tables.data());
  view.head_table_stride = n_table;
  const int32_t vpos = (n_table - 1) * bs + pos % bs;
  const AttnShape s{n_head, n_head_kv, dim, dim, 0};
  ThreadPool pool(2);
  std::vector<float> out(size_t(n_head) * dim);
  attention_decode(s, &view, &vpos, 1, q.data(), n_head * dim, out.data(), n_head * dim, pool);
  for (int32_t hq = 0; hq < n_head; ++hq) {
    const int32_t h = hq / (n_head / n_head_kv);
    std::vector<int32_t> positions;
    for (int32_t i = 0; i < n_table; ++i)
      for (int32_t sl = 0; sl < bs; ++sl) {
        const int32_t p = tables[h * n_table + i] * bs + sl;
        if (p <= pos) positions.push_back(p);
      }
    std::vector<double> sc;
    double mx = -1e300;
    for (int32_t p : positions) {
      kv.read(0, p / bs, p % bs, k.data(), v.data());
      double d = 0;
      for (int32_t c = 0; c < dim; ++c) d += double(q[hq * dim + c]) * k[h * dim + c];
      sc.push_back(d);
      mx = std::max(mx, d);
    }
    std::vector<double> o(dim, 0.0);
    double sum = 0;
    for (size_t i = 0; i < positions.size(); ++i) {
      const double w = std::exp(sc[i] - mx);
      sum += w;
      kv.read(0, positions[i] / bs, positions[i] % bs, k.data(), v.data());
      for (int32_t c = 0; c < dim; ++c) o[c] += w * v[h * dim + c];
    }
    for (int32_t c = 0; c < dim; ++c) EXPECT_NEAR(out[hq * dim + c], o[c] / sum, 1e-4) << "head " << hq;
  }
}

TEST(SparseAttentionOptions, BadBudgetsAreRefusedWithTheReason) {
  auto why = [](SparseAttention s) {
    try {
      check_sparse_attention(s, 16);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_EQ(why({0, 16, 64}), "");
  EXPECT_EQ(why({80, 16, 64}), "");
  EXPECT_NE(why({1000, 16, 64}).find("not a positive multiple of the block size 16"), std::string::npos);
  EXPECT_NE(why({64, 16, 64}).find("below its sinks (16) plus its recent window (64)"), std::string::npos);
  EXPECT_NE(why({-16, 16, 64}).find("negative"), std::string::npos);
}

// On stories260K (a 512-token context, blocks of 16).
class SparseEngine : public ::testing::Test {
 protected:
  static std::unique_ptr<Model> load(int32_t budget) {
    RuntimeOptions o;
    o.sparse_attention.budget = budget;
    return Model::load(test::shared_path("models/gguf/stories260K.gguf"), o);
  }
  struct Out {
    std::vector<int32_t> tokens;
    std::vector<float> logprobs;
    int32_t drafted = 0;
  };
  static Out run(Model& m, SpecMode spec, int32_t request_budget = -1, EngineConfig* cfg_out = nullptr,
                 MetricsSnapshot* metrics = nullptr) {
    EngineConfig c;
    c.threads = 2;
    c.max_context = 512;
    c.spec.mode = spec;
    c.spec.max_draft = 6;
    if (cfg_out) c = *cfg_out;
    Engine e(m, c);
    RequestParams p;
    p.sampling.temperature = 0;
    p.max_tokens = 300;
    p.stop_at_eog = false;
    p.logprobs = 0;
    p.sparse_attention = request_budget;
    Out out;
    e.submit(m.tokenizer().encode("Lily and Tom went to the park. They saw a big dog.", true, true), p,
             [&](const RequestEvent& ev) {
               out.tokens.insert(out.tokens.end(), ev.tokens.begin(), ev.tokens.end());
               for (const TokenLogprob& lp : ev.logprobs) out.logprobs.push_back(lp.logprob);
               if (ev.finished) out.drafted = ev.timings.drafted;
             });
    while (e.step()) e.check_invariants();
    if (metrics) *metrics = e.metrics();
    return out;
  }
};

TEST_F(SparseEngine, BudgetOverTheContextIsDenseBitForBit) {
  auto dense = load(0);
  auto sparse = load(512);
  const Out a = run(*dense, SpecMode::kOff), b = run(*sparse, SpecMode::kOff);
  ASSERT_EQ(a.tokens.size(), 300u);
  EXPECT_EQ(a.tokens, b.tokens);
  ASSERT_EQ(a.logprobs.size(), b.logprobs.size());
  EXPECT_EQ(std::memcmp(a.logprobs.data(), b.logprobs.data(), a.logprobs.size() * sizeof(float)), 0);
}

TEST_F(SparseEngine, SpeculationDoesNotChangeSparseOutput) {
  auto m = load(96);  // sinks 16 + window 64 + one chosen block
  MetricsSnapshot ms;
  const Out plain = run(*m, SpecMode::kOff, -1, nullptr, &ms);
  EXPECT_GT(ms.sparse_blocks_held, ms.sparse_blocks_read);  // it did select
  EXPECT_GT(ms.sparse_blocks_read, 0u);
  const Out spec = run(*m, SpecMode::kNgram);
  EXPECT_GT(spec.drafted, 0);
  EXPECT_EQ(plain.tokens, spec.tokens);
  EXPECT_EQ(std::memcmp(plain.logprobs.data(), spec.logprobs.data(), plain.logprobs.size() * sizeof(float)), 0);
  // A request may ask for dense attention, which is the dense model's output.
  auto dense = load(0);
  const Out d = run(*dense, SpecMode::kOff);
  EXPECT_EQ(run(*m, SpecMode::kOff, 0).tokens, d.tokens);
  EXPECT_NE(plain.logprobs, d.logprobs);  // the budget did change what was read
}

// A pool sized in bytes (--kv-memory) buys K/V and key bounds together: the
// plan, bounds included, fits the bytes given with no room for one more
// block, the cache built from it allocates exactly what the plan counts, and
// the engine with sparse attention holds that many blocks.
TEST_F(SparseEngine, PoolSizedInBytesCountsTheKeyBounds) {
  auto m = load(96);
  const int32_t n_layer = m->config().n_layer;
  KvPoolAsk a;
  a.format = kv_format(a.kv_cache);
  a.max_context = 512;
  a.kv_bytes = int64_t(KvCache::bytes_per_token(m->kv_shape(), a.format)) * 2000 + 12345;
  const KvPlan dense = size_kv_pool(*m, a);
  a.key_bounds.assign(n_layer, true);
  const KvPlan sparse = size_kv_pool(*m, a);
  EXPECT_LE(kv_pool_bytes(dense), uint64_t(a.kv_bytes));
  EXPECT_LE(kv_pool_bytes(sparse), uint64_t(a.kv_bytes));
  KvPlan more = sparse;
  more.n_blocks += 1;
  EXPECT_GT(kv_pool_bytes(more), uint64_t(a.kv_bytes));
  EXPECT_LT(sparse.n_blocks, dense.n_blocks);  // the bounds took the place of blocks

  KvCache kv(sparse.shape, sparse.n_blocks, sparse.block_size, sparse.format, sparse.paging);
  kv.keep_key_bounds(sparse.key_bounds);
  EXPECT_EQ(kv.bytes() + kv.key_bounds()->bytes(), kv_pool_bytes(sparse));
  EXPECT_EQ(kv.key_bounds()->bytes_per_block(),
            size_t(n_layer) * m->kv_shape().n_head_kv * 2 * (m->kv_shape().k_width / m->kv_shape().n_head_kv) * 2);

  EngineConfig c;
  c.threads = 1;
  c.max_context = 512;
  c.kv_bytes = a.kv_bytes;
  Engine e(*m, c);
  EXPECT_EQ(e.metrics().kv_blocks_total, sparse.n_blocks);
  auto dense_model = load(0);
  Engine d(*dense_model, c);
  EXPECT_EQ(d.metrics().kv_blocks_total, dense.n_blocks);
}

TEST_F(SparseEngine, BadCombinationsAreRefused) {
  auto m = load(96);
  EngineConfig c;
  c.threads = 1;
  c.max_context = 512;
  c.kv_cache.window = 128;
  try {
    Engine e(*m, c);
    FAIL() << "a streaming window was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot be combined with a streaming window"), std::string::npos);
  }
  auto bad = load(100);
  try {
    Engine e(*bad, EngineConfig{});
    FAIL() << "a budget of 100 was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("multiple of the block size"), std::string::npos);
  }
  // A request cannot turn it on where the engine has it off, nor ask for a bad budget.
  auto dense = load(0);
  Engine e(*dense, EngineConfig{});
  RequestParams p;
  p.sparse_attention = 96;
  EXPECT_THROW(e.submit({1, 2, 3}, p, [](const RequestEvent&) {}), Error);
  Engine es(*m, EngineConfig{});
  p.sparse_attention = 40;
  EXPECT_THROW(es.submit({1, 2, 3}, p, [](const RequestEvent&) {}), Error);
}

}  // namespace
}  // namespace tandem

// Latent attention (kernels/latent_attention.h) against its double-precision
// reference on random caches of odd sizes, in every cache type; and the
// invariants the model relies on: a query gives the same bits in a prefill
// chunk, alone (decode), and on any thread count.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "core/error.h"
#include "kernels/latent_attention.h"
#include "kv/kv_cache.h"
#include "runtime/thread_pool.h"

namespace tandem {
namespace {

constexpr int32_t kLayer = 1;  // of 2

struct LatentWorld {
  LatentShape s;
  std::unique_ptr<KvCache> kv;
  std::vector<int32_t> blocks;
  int32_t len = 0;
  std::vector<float> q;  // [len][n_head * (latent + rope)]
  int64_t qw() const { return int64_t{s.n_head} * (s.latent + s.rope); }
  int64_t ow() const { return int64_t{s.n_head} * s.latent; }
  KvLayerView view() const { return kv->layer_view(kLayer, blocks.data()); }
};

LatentWorld make_world(const LatentShape& s, KvType type, int32_t len, int32_t block_size, float q_scale,
                       uint32_t seed) {
  LatentWorld w;
  w.s = s;
  w.len = len;
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const int32_t n_blocks = (len + block_size - 1) / block_size;
  w.kv = std::make_unique<KvCache>(KvShape{2, s.rope, s.latent, 1}, n_blocks, block_size,
                                   KvFormat{type, type, false, false, false});
  w.blocks.resize(size_t(n_blocks));
  std::iota(w.blocks.begin(), w.blocks.end(), 0);
  std::shuffle(w.blocks.begin(), w.blocks.end(), rng);  // neighbours in unrelated blocks
  std::vector<float> k(size_t(s.rope)), v(size_t(s.latent));
  for (int32_t p = 0; p < len; ++p)
    for (int32_t l = 0; l < 2; ++l) {
      for (float& x : k) x = nd(rng);
      for (float& x : v) x = nd(rng);
      w.kv->write(l, w.blocks[size_t(p / block_size)], p % block_size, k.data(), v.data());
    }
  w.q.resize(size_t(len * w.qw()));
  const float scale = q_scale / std::sqrt(static_cast<float>(s.latent + s.rope));
  for (float& x : w.q) x = nd(rng) * scale;
  return w;
}

double max_rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double worst = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    worst = std::max(worst, std::abs(double(a[i]) - b[i]));
    scale = std::max(scale, std::abs(double(b[i])));
  }
  return worst / scale;
}

TEST(LatentAttention, MatchesReferenceInEveryCacheType) {
  // Odd sizes: a latent and rope of whole 32-groups (the quantized types'
  // need) but not powers of two, lengths crossing block and 32-position
  // boundaries at odd places.
  const LatentShape s{5, 96, 32};
  ThreadPool pool(3);
  for (KvType t : {KvType::kF32, KvType::kF16, KvType::kQ8_0, KvType::kQ4_0})
    for (float q_scale : {1.0f, 8.0f}) {
      const LatentWorld w = make_world(s, t, 77, 16, q_scale, 11 + static_cast<uint32_t>(t));
      std::vector<float> got(size_t(w.len * w.ow())), want(got.size());
      latent_attention(s, w.view(), w.q.data(), w.qw(), 0, w.len, got.data(), w.ow(), pool);
      latent_attention_ref(s, w.view(), w.q.data(), w.qw(), 0, w.len, want.data(), w.ow());
      // Both read the same stored elements; only the f32 summation differs.
      EXPECT_LE(max_rel_diff(got, want), 2e-5) << kv_type_name(t) << " q scale " << q_scale;
    }
}

TEST(LatentAttention, ReadsWhatTheCacheStores) {
  const LatentShape s{1, 64, 32};
  const LatentWorld w = make_world(s, KvType::kF32, 40, 16, 1.0f, 5);
  std::vector<float> lat(64), rope(32), k(32), v(64);
  for (int32_t p : {0, 15, 16, 39}) {
    latent_read(w.view(), p, lat.data(), rope.data());
    w.kv->read(kLayer, w.blocks[size_t(p / 16)], p % 16, k.data(), v.data());
    EXPECT_EQ(lat, v) << p;
    EXPECT_EQ(rope, k) << p;
  }
}

TEST(LatentAttention, SameBitsInPrefillDecodeAndAnyThreadCount) {
  const LatentShape s{3, 64, 32};
  const LatentWorld w = make_world(s, KvType::kF16, 70, 16, 4.0f, 9);
  ThreadPool one(1), three(3);
  std::vector<float> all(size_t(w.len * w.ow()));
  latent_attention(s, w.view(), w.q.data(), w.qw(), 0, w.len, all.data(), w.ow(), one);
  // Chunks of 13 rows on three threads, then every row alone (decode).
  std::vector<float> chunked(all.size()), single(all.size());
  for (int32_t p0 = 0; p0 < w.len; p0 += 13) {
    const int32_t n = std::min(13, w.len - p0);
    latent_attention(s, w.view(), w.q.data() + p0 * w.qw(), w.qw(), p0, n, chunked.data() + p0 * w.ow(), w.ow(),
                     three);
  }
  for (int32_t p = 0; p < w.len; ++p)
    latent_attention(s, w.view(), w.q.data() + p * w.qw(), w.qw(), p, 1, single.data() + p * w.ow(), w.ow(), three);
  EXPECT_EQ(chunked, all);
  EXPECT_EQ(single, all);
}

TEST(LatentAttention, RefusesACacheOfAnotherShape) {
  const LatentWorld w = make_world(LatentShape{2, 64, 32}, KvType::kF32, 4, 16, 1.0f, 1);
  ThreadPool pool(1);
  std::vector<float> out(2 * 96);
  EXPECT_THROW(latent_attention(LatentShape{2, 96, 32}, w.view(), w.q.data(), w.qw(), 0, 1, out.data(), 96, pool),
               Error);
}

}  // namespace
}  // namespace tandem

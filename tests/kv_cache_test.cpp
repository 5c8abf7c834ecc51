// The KV cache: element types (f16 rounding, f32 exactness), slot layout as
// attention sees it through views, block pool bookkeeping, and bad input.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <set>
#include <vector>

#include "core/error.h"
#include "quant/ggml_type.h"
#include "quant/quant.h"
#include "kv/kv_cache.h"

namespace tandem {
namespace {

constexpr int kK = 43, kV = 27;  // the SIMD f16 conversion leaves a scalar tail
const KvShape kShape{3, kK, kV, 1};

TEST(KvCache, F32StoresExactly) {
  KvCache kv(kShape, 4, 5, KvType::kF32);
  std::mt19937 rng(1);
  std::normal_distribution<float> nd;
  std::vector<float> k(kK), v(kV), k2(kK), v2(kV);
  for (float& x : k) x = nd(rng);
  for (float& x : v) x = nd(rng);
  kv.write(2, 3, 4, k.data(), v.data());
  kv.read(2, 3, 4, k2.data(), v2.data());
  EXPECT_EQ(std::memcmp(k.data(), k2.data(), sizeof(float) * k.size()), 0);
  EXPECT_EQ(std::memcmp(v.data(), v2.data(), sizeof(float) * v.size()), 0);
}

// Every row is rounded to nearest even exactly as f32_to_f16, including the
// SIMD conversion's vector part and its scalar tail.
TEST(KvCache, F16RoundsToNearestEven) {
  KvCache kv(kShape, 2, 16, KvType::kF16);
  std::vector<float> k(kK), v(kV);
  const float specials[] = {0.0f, -0.0f, 1.0f, 65504.0f, 65519.99f, 65520.0f, -70000.0f, 5.96e-8f, 2.98e-8f,
                            1e-5f, 0.1f, 1.0f + 1.0f / 4096, 1.0f + 3.0f / 4096,
                            std::numeric_limits<float>::infinity()};
  std::mt19937 rng(2);
  std::uniform_real_distribution<float> ud(-3, 3);
  for (int trial = 0; trial < 20; ++trial) {
    for (size_t i = 0; i < k.size(); ++i)
      k[i] = trial == 0 && i < std::size(specials) ? specials[i] : std::ldexp(ud(rng), int(ud(rng) * 6));
    for (float& x : v) x = ud(rng) * 1e-4f;
    kv.write(1, 1, trial % 16, k.data(), v.data());
    std::vector<float> k2(kK), v2(kV);
    kv.read(1, 1, trial % 16, k2.data(), v2.data());
    for (size_t i = 0; i < k.size(); ++i) {
      const float want = f16_to_f32(f32_to_f16(k[i]));
      EXPECT_EQ(std::memcmp(&k2[i], &want, sizeof(float)), 0) << "k[" << i << "] = " << k[i];
    }
    for (size_t i = 0; i < v.size(); ++i) EXPECT_EQ(v2[i], f16_to_f32(f32_to_f16(v[i]))) << "v[" << i << "]";
  }
}

TEST(KvCache, BytesFollowTheType) {
  const KvCache a(kShape, 4, 16, KvType::kF32), b(kShape, 4, 16, KvType::kF16);
  EXPECT_EQ(a.bytes(), size_t(4 * 16) * 3 * (kK + kV) * 4);
  EXPECT_EQ(b.bytes() * 2, a.bytes());
  EXPECT_EQ(KvCache::bytes_per_token(kShape, KvFormat{}), size_t(3) * (kK + kV) * 2);
  EXPECT_EQ(KvCache(kShape, 1).format().k, KvType::kF16);  // the default
  EXPECT_EQ(KvCache(kShape, 1).format().v, KvType::kF16);
  // 32 elements: 64 bytes in f16, 34 in q8_0, 18 in q4_0 (llama.cpp's blocks).
  const KvShape wide{2, 2 * 64, 2 * 32, 2};
  const size_t f16 = KvCache::bytes_per_token(wide, KvFormat{});
  EXPECT_EQ(f16, size_t(2) * (128 + 64) * 2);
  EXPECT_EQ(KvCache::bytes_per_token(wide, kv_format(KvType::kQ8_0, KvType::kQ8_0)) * 64, f16 * 34);
  EXPECT_EQ(KvCache::bytes_per_token(wide, kv_format(KvType::kQ4_0, KvType::kQ4_0)) * 64, f16 * 18);
  EXPECT_EQ(KvCache::bytes_per_token(wide, kv_format(KvType::kQ8_0, KvType::kF16)),
            size_t(2) * (128 * 34 / 32 + 64 * 2));
  EXPECT_EQ(KvCache(wide, 3, 16, kv_format(KvType::kQ4_0, KvType::kQ8_0)).bytes(),
            3 * 16 * KvCache::bytes_per_token(wide, kv_format(KvType::kQ4_0, KvType::kQ8_0)));
}

// A view addresses position p of a sequence through its block table:
// block blocks[p / block_size], slot p % block_size, this layer only; head
// h's row holds elements [h * width / n_head_kv, (h + 1) * width / n_head_kv)
// of the token's row, and read() gives the row back whole.
TEST(KvCache, ViewAddressesRowsThroughTheBlockTable) {
  const KvShape three_heads{3, 3 * 13, 3 * 9, 3};
  for (const KvShape& shape : {kShape, three_heads})
    for (KvType type : {KvType::kF16, KvType::kF32}) {
      KvCache kv(shape, 6, 4, type);
      const int K = shape.k_width, V = shape.v_width, kh = K / shape.n_head_kv, vh = V / shape.n_head_kv;
      const std::vector<int32_t> table = {5, 0, 3};
      // Integers below 2048: exact in f16.
      auto kval = [](int layer, int p, int i) { return float(layer * 512 + p * 40 + i); };
      std::vector<float> k(K), v(V);
      for (int32_t layer = 0; layer < 3; ++layer)
        for (int32_t p = 0; p < 12; ++p) {
          for (int i = 0; i < K; ++i) k[i] = kval(layer, p, i);
          for (int i = 0; i < V; ++i) v[i] = -kval(layer, p, i);
          kv.write(layer, table[p / 4], p % 4, k.data(), v.data());
        }
      const KvLayerView view = kv.layer_view(1, table.data());
      EXPECT_EQ(view.k_type, type);
      EXPECT_EQ(view.v_type, type);
      EXPECT_EQ(view.n_head_kv, shape.n_head_kv);
      for (int32_t p = 0; p < 12; ++p) {
        for (int32_t h = 0; h < shape.n_head_kv; ++h)
          for (int i : {0, 4, kh - 1}) {
            const float want_k = kval(1, p, h * kh + i), want_v = -kval(1, p, h * vh + i % vh);
            if (type == KvType::kF16) {
              EXPECT_EQ(f16_to_f32(view.key_column<uint16_t>(p, h)[size_t(i) * view.block_size]), want_k);
              EXPECT_EQ(f16_to_f32(view.value<uint16_t>(p, h)[i % vh]), want_v);
            } else {
              EXPECT_EQ(view.key_column<float>(p, h)[size_t(i) * view.block_size], want_k);
              EXPECT_EQ(view.value<float>(p, h)[i % vh], want_v);
            }
          }
        kv.read(1, table[p / 4], p % 4, k.data(), v.data());
        for (int i = 0; i < K; ++i) ASSERT_EQ(k[i], kval(1, p, i)) << "p=" << p << " i=" << i;
        for (int i = 0; i < V; ++i) ASSERT_EQ(v[i], -kval(1, p, i)) << "p=" << p << " i=" << i;
      }
    }
}

TEST(KvCache, UnwrittenSlotsReadAsZero) {
  KvCache kv(kShape, 2, 4);
  std::vector<float> k(kK, 1.0f), v(kV, 1.0f);
  kv.read(2, 1, 3, k.data(), v.data());
  for (float x : k) EXPECT_EQ(x, 0.0f);
  for (float x : v) EXPECT_EQ(x, 0.0f);
}

TEST(KvCache, BlocksAreHandedOutAndReturned) {
  KvCache kv(kShape, 3, 4);
  SeqKv a, b;
  EXPECT_TRUE(a.reserve(kv, 5));  // two blocks
  EXPECT_EQ(a.blocks.size(), 2u);
  EXPECT_EQ(kv.n_free(), 1);
  EXPECT_FALSE(b.reserve(kv, 8));  // needs two: nothing taken
  EXPECT_TRUE(b.blocks.empty());
  EXPECT_EQ(kv.n_free(), 1);
  EXPECT_TRUE(a.reserve(kv, 8));  // still two
  EXPECT_EQ(kv.n_free(), 1);
  a.release(kv);
  EXPECT_EQ(kv.n_free(), 3);
  EXPECT_TRUE(b.reserve(kv, 12));
  EXPECT_EQ(kv.n_free(), 0);
  EXPECT_EQ(kv.allocate(), -1);
}

// Blocks copied, and saved and loaded again, come back bit for bit, at every
// layer and head; the other blocks are untouched.
TEST(KvCache, BlockCopiesAndSwapsAreExact) {
  for (KvType type : {KvType::kF16, KvType::kF32, KvType::kQ8_0, KvType::kQ4_0}) {
    const KvShape shape{3, 2 * 64, 2 * 32, 2};
    KvCache c(shape, 5, 16, type);
    std::mt19937 rng(7);
    std::normal_distribution<float> nd;
    std::vector<float> k(shape.k_width), v(shape.v_width);
    for (int32_t l = 0; l < 3; ++l)
      for (int32_t b = 0; b < 5; ++b)
        for (int32_t slot = 0; slot < 16; ++slot) {
          for (float& x : k) x = nd(rng);
          for (float& x : v) x = nd(rng);
          c.write(l, b, slot, k.data(), v.data());
        }
    auto slots = [&](int32_t b) {
      std::vector<float> all;
      for (int32_t l = 0; l < 3; ++l)
        for (int32_t slot = 0; slot < 16; ++slot) {
          c.read(l, b, slot, k.data(), v.data());
          all.insert(all.end(), k.begin(), k.end());
          all.insert(all.end(), v.begin(), v.end());
        }
      return all;
    };
    const auto b1 = slots(1), b2 = slots(2), b3 = slots(3), b4 = slots(4);
    // Slots [5, 11) of block 1 over block 2's: words of 4 (and 8) slots
    // split at both ends, the rest of block 2 untouched.
    c.copy_slots(1, 2, 5, 11);
    const size_t per_slot = size_t(shape.k_width + shape.v_width);
    const auto mixed = slots(2);
    for (size_t i = 0; i < mixed.size(); ++i) {
      const int32_t slot = static_cast<int32_t>(i / per_slot % 16);
      ASSERT_EQ(mixed[i], slot >= 5 && slot < 11 ? b1[i] : b2[i]) << kv_type_name(type) << " slot " << slot;
    }
    c.copy_block(1, 2);
    EXPECT_EQ(slots(2), b1);
    std::vector<std::byte> saved(c.block_bytes());
    EXPECT_EQ(c.block_bytes(), KvCache::bytes_per_token(shape, kv_format(type, type)) * 16);
    c.save_block(3, saved.data());
    c.copy_block(4, 3);  // overwrite, then restore
    EXPECT_EQ(slots(3), b4);
    c.load_block(3, saved.data());
    EXPECT_EQ(slots(3), b3);
    EXPECT_EQ(slots(1), b1);
    EXPECT_EQ(slots(4), b4);
    EXPECT_THROW(c.copy_block(0, 5), Error);
    EXPECT_THROW(c.save_block(-1, saved.data()), Error);
  }
}

// Gemma 3's pattern: five sliding-window layers, then one global one.
std::vector<bool> gemma_windows(int32_t n_layer) {
  std::vector<bool> w(static_cast<size_t>(n_layer), false);
  for (int32_t l = 0; l < n_layer; ++l) w[size_t(l)] = l % 6 < 5;
  return w;
}

TEST(KvCache, PagingGroupsWindowedLayersAsManyAsTheGlobalOnes) {
  // 270M: 18 layers, 3 global: pages of 3 layers, 5 windowed groups.
  const KvPaging p = kv_paging(gemma_windows(18), 512);
  EXPECT_EQ(p.layers_per_page, 3);
  EXPECT_EQ(p.n_groups, 6);
  EXPECT_EQ(p.window, 512);
  for (int32_t l = 0; l < 18; ++l) EXPECT_EQ(p.group[l] == 0, l % 6 == 5) << l;
  // Each (group, slot) holds one layer.
  std::set<std::pair<int32_t, int32_t>> places;
  for (int32_t l = 0; l < 18; ++l) EXPECT_TRUE(places.insert({p.group[l], p.slot[l]}).second) << l;
  // 1B: 26 layers, 4 global, 22 windowed: six groups of 4, the last one half used.
  const KvPaging q = kv_paging(gemma_windows(26), 512);
  EXPECT_EQ(q.layers_per_page, 4);
  EXPECT_EQ(q.n_groups, 7);
  // Without a window, or without both kinds, one group of every layer.
  EXPECT_EQ(kv_paging(gemma_windows(18), 0).n_groups, 1);
  EXPECT_EQ(kv_paging(std::vector<bool>(4, true), 512).n_groups, 1);
  EXPECT_EQ(kv_paging(std::vector<bool>(4, false), 512).layers_per_page, 4);
}

// A paged cache: each layer reads and writes its own group's pages, a page
// holds its group's layers only, and page copies and swaps carry all of them.
TEST(KvCache, PagedLayersLiveOnTheirGroupsPages) {
  const KvShape shape{6, 2 * 32, 2 * 32, 2};
  const KvPaging paging = kv_paging(gemma_windows(6), 8);  // layers 0-4 windowed, 5 global
  ASSERT_EQ(paging.layers_per_page, 1);
  ASSERT_EQ(paging.n_groups, 6);
  KvCache c(shape, 12, 16, kv_format(KvType::kF16, KvType::kF16), paging);
  EXPECT_EQ(c.block_bytes(), KvCache::bytes_per_token(shape, KvFormat{}) / 6 * 16);
  EXPECT_EQ(c.bytes(), c.block_bytes() * 12);
  SeqKv s;
  ASSERT_TRUE(s.reserve(c, 20));  // two blocks in each of six groups
  ASSERT_EQ(s.windowed.size(), 5u);
  EXPECT_EQ(c.n_free(), 0);
  std::vector<float> k(64), v(64), rk(64), rv(64);
  for (int32_t l = 0; l < 6; ++l) {
    std::fill(k.begin(), k.end(), float(l + 1));
    std::fill(v.begin(), v.end(), float(-l - 1));
    c.write(l, s.table(c.group(l))[1], 3, k.data(), v.data());
  }
  for (int32_t l = 0; l < 6; ++l) {
    c.read(l, s.table(c.group(l))[1], 3, rk.data(), rv.data());
    EXPECT_EQ(rk[0], float(l + 1)) << l;
    EXPECT_EQ(rv[63], float(-l - 1)) << l;
    const KvLayerView view = c.layer_view(l, s.table(c.group(l)));
    EXPECT_EQ(f16_to_f32(*view.value<uint16_t>(16 + 3, 1)), float(-l - 1)) << l;
  }
  // Layer 2's page copied into layer 3's second page: layer 3 reads layer 2's values there.
  c.copy_block(s.table(c.group(2))[1], s.table(c.group(3))[0]);
  c.read(3, s.table(c.group(3))[0], 3, rk.data(), rv.data());
  EXPECT_EQ(rk[5], 3.0f);
  std::vector<std::byte> saved(c.block_bytes());
  c.save_block(s.table(c.group(5))[1], saved.data());
  c.load_block(s.table(c.group(0))[0], saved.data());
  c.read(0, s.table(c.group(0))[0], 3, rk.data(), rv.data());
  EXPECT_EQ(rk[0], 6.0f);
  s.release(c);
  EXPECT_EQ(c.n_free(), 12);
  KvPaging broken = paging;
  broken.slot[2] = 1;  // outside a page of one layer
  EXPECT_THROW(KvCache(shape, 4, 16, KvFormat{}, broken), Error);
}

TEST(KvCache, TypeNamesParse) {
  EXPECT_EQ(parse_kv_type("f16"), KvType::kF16);
  EXPECT_EQ(parse_kv_type("f32"), KvType::kF32);
  EXPECT_STREQ(kv_type_name(KvType::kF16), "f16");
  EXPECT_STREQ(kv_type_name(KvType::kF32), "f32");
  EXPECT_EQ(parse_kv_type("q8_0"), KvType::kQ8_0);
  EXPECT_EQ(parse_kv_type("q4_0"), KvType::kQ4_0);
  for (const char* bad : {"q4_1", "Q8_0", "", "bf16"}) {
    try {
      parse_kv_type(bad);
      FAIL() << "accepted '" << bad << "'";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find(std::string("'") + bad + "'"), std::string::npos) << e.what();
    }
  }
}

TEST(KvCache, BadSizesAreRejected) {
  EXPECT_THROW(KvCache(kShape, 0, 16), Error);
  EXPECT_THROW(KvCache(kShape, 4, 0), Error);
  EXPECT_THROW(KvCache(KvShape{0, kK, kV, 1}, 4, 16), Error);
  EXPECT_THROW(KvCache(KvShape{2, -1, kV, 1}, 4, 16), Error);
  EXPECT_THROW(KvCache(KvShape{2, kK, kV, 0}, 4, 16), Error);   // no heads
  EXPECT_THROW(KvCache(KvShape{2, 40, 30, 4}, 4, 16), Error);   // 30 does not split into 4 heads
  try {
    KvCache(KvShape{1 << 30, 1 << 30, 1 << 30, 1}, 1 << 30, 1 << 30);
    FAIL() << "an impossible cache was allocated";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kResource);
  }
}



// The quantized types store what llama.cpp's reference quantizers make of
// the row (q4_0 keys of the Hadamard-rotated row), whatever the transposed
// layout; a rotated query against the stored key gives the original dot
// product up to the quantization error, and exactly for a lossless type.
TEST(KvCache, QuantizedSlotsHoldLlamaCppBlocks) {
  const KvShape shape{2, 2 * 96, 2 * 64, 2};  // 96: a head of three 32-blocks of Hadamard
  std::mt19937 rng(3);
  std::normal_distribution<float> nd;
  for (KvType kt : {KvType::kQ8_0, KvType::kQ4_0})
    for (KvType vt : {KvType::kQ8_0, KvType::kQ4_0, KvType::kF16}) {
      const KvFormat f = kv_format(kt, vt);
      EXPECT_EQ(f.rotate_k, kt == KvType::kQ4_0);
      EXPECT_EQ(f.rotate_v, vt == KvType::kQ4_0);
      EXPECT_TRUE(f.smooth_k);
      KvCache c(shape, 3, 16, f);
      std::vector<float> k(shape.k_width), v(shape.v_width), k2(k.size()), v2(v.size());
      for (int32_t slot : {0, 7, 15}) {
        for (float& x : k) x = nd(rng);
        for (float& x : v) x = nd(rng);
        k[5] = 40.0f;  // an outlier dimension
        c.write(1, 2, slot, k.data(), v.data());
        c.read(1, 2, slot, k2.data(), v2.data());
        for (int32_t h = 0; h < 2; ++h) {
          auto want = [](KvType t, bool rotate, const float* x, int32_t n) {
            std::vector<float> r(x, x + n), out(n);
            if (rotate) hadamard_rotate(r.data(), n);
            if (t == KvType::kF16) {
              for (int32_t i = 0; i < n; ++i) out[i] = f16_to_f32(f32_to_f16(r[i]));
              return out;
            }
            const GgmlType g = t == KvType::kQ8_0 ? GgmlType::Q8_0 : GgmlType::Q4_0;
            std::vector<std::byte> q(kv_bytes(t, n));
            quantize_row(g, r.data(), q.data(), n);
            dequantize_row(g, q.data(), out.data(), n);
            return out;
          };
          const auto wk = want(kt, f.rotate_k, k.data() + h * 96, 96);
          const auto wv = want(vt, f.rotate_v, v.data() + h * 64, 64);
          for (int32_t i = 0; i < 96; ++i) ASSERT_EQ(k2[h * 96 + i], wk[i]) << kv_format_name(f) << " k " << i;
          for (int32_t i = 0; i < 64; ++i) ASSERT_EQ(v2[h * 64 + i], wv[i]) << kv_format_name(f) << " v " << i;
        }
        // Dot products survive the rotation: q.k against Hq.(stored Hk).
        std::vector<float> q(shape.k_width);
        for (float& x : q) x = nd(rng);
        std::vector<float> hq = q;
        c.rotate_queries(1, hq.data(), 2, 96);
        for (int32_t h = 0; h < 2; ++h) {
          double exact = 0, got = 0, norm = 0;
          for (int32_t i = 0; i < 96; ++i) {
            exact += double(q[h * 96 + i]) * k[h * 96 + i];
            got += double(hq[h * 96 + i]) * k2[h * 96 + i];
            norm += double(q[h * 96 + i]) * q[h * 96 + i];
          }
          EXPECT_NEAR(got, exact, (kt == KvType::kQ4_0 ? 0.25 : 0.05) * std::sqrt(norm) * 3) << kv_format_name(f);
        }
      }
    }
}

// Smoothed keys are stored as (k - offset) * scale and read back in the
// model's space by read_key; read() gives what attention reads; queries are
// divided by their KV head's scales, so every score moves by q.offset.
TEST(KvCache, KeySmoothingIsUndoneOnReadAndKeepsScoreDifferences) {
  const KvShape shape{2, 2 * 64, 2 * 64, 2};
  std::mt19937 rng(5);
  std::normal_distribution<float> nd;
  std::uniform_real_distribution<float> ud(0.5f, 2.0f);
  KeySmoothing sm{std::vector<float>(size_t(shape.n_layer) * shape.k_width),
                  std::vector<float>(size_t(shape.n_layer) * shape.k_width)};
  for (float& x : sm.offset) x = 6.0f * nd(rng);
  for (float& x : sm.scale) x = ud(rng);
  const std::vector<float>& mu = sm.offset;
  std::vector<float> k(shape.k_width), v(shape.v_width, 0.5f);
  for (KvType t : {KvType::kF32, KvType::kQ8_0, KvType::kQ4_0}) {
    SCOPED_TRACE(kv_type_name(t));
    KvCache plain(shape, 2, 16, kv_format(t, KvType::kF16)), smoothed(shape, 2, 16, kv_format(t, KvType::kF16));
    smoothed.set_key_smoothing(sm);
    // Four query heads over the two KV heads: a score difference between
    // two keys is the same from the stored keys as from the originals.
    std::vector<float> q(4 * 64), q_stored(q.size());
    for (float& x : q) x = nd(rng);
    q_stored = q;
    smoothed.rotate_queries(1, q_stored.data(), 4, 64);
    std::vector<std::vector<float>> kept, stored_kept;
    double err_plain = 0, err_smoothed = 0;
    for (int32_t slot = 0; slot < 16; ++slot) {
      for (int32_t i = 0; i < shape.k_width; ++i) k[i] = mu[shape.k_width + i] + nd(rng);
      plain.write(1, 1, slot, k.data(), v.data());
      smoothed.write(1, 1, slot, k.data(), v.data());
      std::vector<float> a(k.size()), b(k.size()), stored(k.size()), vv(v.size());
      plain.read_key(1, 1, slot, a.data());
      smoothed.read_key(1, 1, slot, b.data());
      smoothed.read(1, 1, slot, stored.data(), vv.data());
      for (int32_t i = 0; i < shape.k_width; ++i) {
        err_plain = std::max(err_plain, double(std::abs(a[i] - k[i])));
        err_smoothed = std::max(err_smoothed, double(std::abs(b[i] - k[i])));
        if (t == KvType::kF32) {
          ASSERT_FLOAT_EQ(stored[i], (k[i] - mu[shape.k_width + i]) * sm.scale[shape.k_width + i]);
        }
      }
      kept.push_back(k);
      stored_kept.push_back(stored);
    }
    if (t == KvType::kF32)
      for (int32_t h = 0; h < 4; ++h) {
        auto dot = [&](const std::vector<float>& x, const std::vector<float>& key) {
          double d = 0;
          for (int32_t i = 0; i < 64; ++i) d += double(x[h * 64 + i]) * key[(h / 2) * 64 + i];
          return d;
        };
        const double want = dot(q, kept[3]) - dot(q, kept[9]);
        EXPECT_NEAR(dot(q_stored, stored_kept[3]) - dot(q_stored, stored_kept[9]), want, 1e-4 * (1 + std::abs(want)));
      }
    if (t == KvType::kF32) {
      EXPECT_LT(err_smoothed, 1e-5);
    } else {
      EXPECT_LT(err_smoothed, 0.5 * err_plain) << err_plain << " " << err_smoothed;
    }
  }
  KvCache c(shape, 2, 16, KvType::kQ4_0);
  EXPECT_THROW(c.set_key_smoothing(KeySmoothing{std::vector<float>(5), std::vector<float>(5)}), Error);
  KeySmoothing zero_scale = sm;
  zero_scale.scale[7] = 0.0f;
  EXPECT_THROW(c.set_key_smoothing(zero_scale), Error);
  EXPECT_NO_THROW(c.set_key_smoothing({}));
  // Quantized keys are smoothed unless asked not to; f16 / f32 ones never.
  EXPECT_TRUE(kv_format(KvCacheTypes{KvType::kQ8_0, KvType::kQ4_0}).smooth_k);
  EXPECT_FALSE(kv_format(KvCacheTypes{KvType::kQ4_0, KvType::kQ4_0, KvRotation::kAuto, false}).smooth_k);
  EXPECT_FALSE(kv_format(KvCacheTypes{KvType::kF16, KvType::kQ4_0}).smooth_k);
  EXPECT_FALSE(kv_format(KvCacheTypes{KvType::kF32, KvType::kF16}).smooth_k);
}

// H is orthogonal and its own inverse, block by block.
TEST(KvCache, HadamardRotationIsAnInvolution) {
  std::mt19937 rng(1);
  std::normal_distribution<float> nd;
  for (int32_t n : {32, 64, 96, 160, 256}) {
    std::vector<float> x(n);
    for (float& e : x) e = nd(rng);
    std::vector<float> y = x;
    hadamard_rotate(y.data(), n);
    double nx = 0, ny = 0;
    for (int32_t i = 0; i < n; ++i) nx += double(x[i]) * x[i], ny += double(y[i]) * y[i];
    EXPECT_NEAR(ny, nx, 1e-4 * nx) << n;
    hadamard_rotate(y.data(), n);
    for (int32_t i = 0; i < n; ++i) EXPECT_NEAR(y[i], x[i], 1e-5f) << n << " " << i;
  }
  // A spike spreads evenly over its block.
  std::vector<float> e(64, 0.0f);
  e[3] = 8.0f;
  hadamard_rotate(e.data(), 64);
  for (float v : e) EXPECT_FLOAT_EQ(std::fabs(v), 1.0f);
}

TEST(KvCache, QuantizedTypesRefuseShapesTheyCannotHold) {
  auto message = [](auto&& f) {
    try {
      f();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  // stories260K's heads: 8 elements.
  const std::string small = message([] { KvCache(KvShape{5, 4 * 8, 4 * 8, 4}, 4, 16, KvType::kQ8_0); });
  EXPECT_NE(small.find("q8_0"), std::string::npos) << small;
  EXPECT_NE(small.find("8 elements"), std::string::npos) << small;
  const std::string blocks = message([] { KvCache(KvShape{1, 64, 64, 1}, 4, 8, KvType::kQ4_0); });
  EXPECT_NE(blocks.find("multiple of 16"), std::string::npos) << blocks;
  EXPECT_NO_THROW(KvCache(KvShape{5, 4 * 8, 4 * 8, 4}, 4, 16, kv_format(KvType::kF16, KvType::kF32)));
}

}  // namespace
}  // namespace tandem

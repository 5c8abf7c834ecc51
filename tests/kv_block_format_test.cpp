// The KV block format: blocks of every cache type and paging come back bit
// for bit, each mismatch is refused naming what differs, and imported
// blocks become prefix-cache hits announced as KV events.
#include "kv/block_format.h"

#include <filesystem>
#include <numeric>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "core/error.h"
#include "gguf/gguf.h"
#include "gguf/synth.h"
#include "kv/block_hash.h"
#include "kv/block_manager.h"
#include "model/model_fingerprint.h"
#include "test_support.h"

namespace tandem {
namespace {

constexpr int32_t kBs = 16;
const KvShape kShape{4, 64, 64, 2};

// 2 full-attention layers on group 0, 2 windowed layers on group 1.
KvPaging two_groups() { return kv_paging({false, true, false, true}, 32); }

void fill_random(KvCache& c, int32_t page, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.f, 1.f);
  std::vector<float> k(size_t(kShape.k_width)), v(size_t(kShape.v_width));
  for (int32_t l = 0; l < kShape.n_layer; ++l)
    for (int32_t s = 0; s < kBs; ++s) {
      for (auto& x : k) x = d(rng);
      for (auto& x : v) x = d(rng);
      c.write(l, page, s, k.data(), v.data());
    }
}

KvBlockKey key_of(uint32_t seed) {
  KvBlockKey key;
  key.tokens.resize(kBs);
  std::iota(key.tokens.begin(), key.tokens.end(), int32_t(seed));
  key.has_parent = true;
  key.parent = 0x1234;
  key.hash = chained_block_hash(key.parent, key.tokens);
  return key;
}

TEST(KvBlockFormat, RoundTripsEveryTypeBitForBit) {
  for (KvType t : {KvType::kF32, KvType::kF16, KvType::kQ8_0, KvType::kQ4_0}) {
    SCOPED_TRACE(kv_type_name(t));
    KvCacheTypes types{t, t};
    KvCache a(kShape, 8, kBs, kv_format(types), two_groups());
    KvCache b(kShape, 8, kBs, kv_format(types), two_groups());
    uint64_t smoothing = 0;
    if (kv_type_quantized(t)) {  // smoothing stored as the cache has it
      KeySmoothing s{std::vector<float>(size_t(kShape.n_layer * kShape.k_width), 0.25f),
                     std::vector<float>(size_t(kShape.n_layer * kShape.k_width), 2.0f)};
      a.set_key_smoothing(s);
      b.set_key_smoothing(s);
      smoothing = key_smoothing_fingerprint(s);
      EXPECT_NE(smoothing, 0u);
    }
    const std::vector<int32_t> src = {3, 5}, dst = {1, 6};
    fill_random(a, src[0], 1);
    fill_random(a, src[1], 2);
    const KvBlockLayout la = kv_block_layout(a, 42, smoothing), lb = kv_block_layout(b, 42, smoothing);
    EXPECT_EQ(la.n_groups, 2);
    EXPECT_EQ(la.page_bytes, a.block_bytes());
    const KvBlockKey key = key_of(7);
    const auto bytes = encode_kv_block(la, key, save_kv_pages(a, src));
    EXPECT_EQ(kv_block_total_bytes(std::span(bytes).first(kKvBlockPrefixBytes)), bytes.size());
    const KvBlockDecoded d = decode_kv_block(bytes, lb);
    ASSERT_TRUE(d) << d.message;
    EXPECT_EQ(d.block.key, key);
    load_kv_pages(b, dst, d.block.payload);
    EXPECT_EQ(save_kv_pages(b, dst), save_kv_pages(a, src));
    std::vector<float> ka(size_t(kShape.k_width)), va(size_t(kShape.v_width)), kb(ka), vb(va);
    for (int32_t l = 0; l < kShape.n_layer; ++l)
      for (int32_t s : {0, 7, kBs - 1}) {
        a.read(l, src[size_t(a.group(l))], s, ka.data(), va.data());
        b.read(l, dst[size_t(b.group(l))], s, kb.data(), vb.data());
        ASSERT_EQ(ka, kb);
        ASSERT_EQ(va, vb);
      }
  }
}

KvBlockError error_of(std::span<const std::byte> bytes, const KvBlockLayout& want, std::string* msg = nullptr) {
  const KvBlockDecoded d = decode_kv_block(bytes, want);
  if (msg) *msg = d.message;
  return d.error;
}

TEST(KvBlockFormat, NamesEachMismatch) {
  KvCache a(kShape, 4, kBs, kv_format(KvType::kQ8_0, KvType::kF16));
  fill_random(a, 2, 3);
  const KvBlockLayout l = kv_block_layout(a, 0xabc);
  const std::vector<int32_t> page = {2};
  const auto bytes = encode_kv_block(l, key_of(1), save_kv_pages(a, page));
  std::string msg;

  KvBlockLayout other = l;
  other.model = 0xdef;
  EXPECT_EQ(error_of(bytes, other, &msg), KvBlockError::kModel);
  EXPECT_NE(msg.find("model 0x0000000000000abc (expected 0x0000000000000def)"), std::string::npos) << msg;

  other = l;
  other.smoothing = 5;
  EXPECT_EQ(error_of(bytes, other, &msg), KvBlockError::kSmoothing);

  other = l;
  other.format.k = KvType::kF16;
  EXPECT_EQ(error_of(bytes, other, &msg), KvBlockError::kType);
  EXPECT_NE(msg.find("K q8_0 / V f16 (expected K f16 / V f16)"), std::string::npos) << msg;
  other = l;
  other.format.rotate_k = true;
  EXPECT_EQ(error_of(bytes, other), KvBlockError::kType);

  other = l;
  other.block_size = 32;
  EXPECT_EQ(error_of(bytes, other, &msg), KvBlockError::kBlockSize);
  EXPECT_NE(msg.find("blocks of 16 tokens (expected 32)"), std::string::npos) << msg;

  for (auto change : {+[](KvBlockLayout& x) { x.shape.n_layer = 5; }, +[](KvBlockLayout& x) { x.shape.k_width = 32; },
                      +[](KvBlockLayout& x) { x.shape.n_head_kv = 4; }, +[](KvBlockLayout& x) { x.n_groups = 2; },
                      +[](KvBlockLayout& x) { x.page_bytes += 64; }}) {
    other = l;
    change(other);
    EXPECT_EQ(error_of(bytes, other, &msg), KvBlockError::kCounts) << msg;
  }

  // A flipped byte anywhere after the checksum: header, token, payload.
  for (size_t at : {size_t(33), size_t(60), size_t(120), bytes.size() / 2, bytes.size() - 1}) {
    auto bad = bytes;
    bad[at] ^= std::byte{0x10};
    EXPECT_EQ(error_of(bad, l, &msg), KvBlockError::kChecksum) << at;
  }
  EXPECT_NE(msg.find("checksum"), std::string::npos);

  // Cut anywhere: never read past the end.
  for (size_t n : {size_t(0), size_t(10), kKvBlockPrefixBytes, size_t(100), bytes.size() - 1}) {
    EXPECT_EQ(error_of(std::span(bytes).first(n), l, &msg), KvBlockError::kTruncated) << n;
  }
  EXPECT_NE(msg.find("of its"), std::string::npos) << msg;

  auto bad = bytes;
  bad[0] = std::byte{'X'};
  EXPECT_EQ(error_of(bad, l), KvBlockError::kMagic);
  EXPECT_EQ(kv_block_total_bytes(bad), 0u);
  bad = bytes;
  bad[8] = std::byte{9};
  EXPECT_EQ(error_of(bad, l), KvBlockError::kVersion);
  bad = bytes;
  bad.push_back(std::byte{0});
  EXPECT_EQ(error_of(bad, l), KvBlockError::kMagic);
  // A total that lies about the size: the checksum does not cover it, the sizes catch it.
  bad = bytes;
  bad[16] = std::byte{1};
  EXPECT_NE(error_of(bad, l), KvBlockError::kNone);

  const std::vector<std::byte> payload = save_kv_pages(a, page);
  EXPECT_THROW(encode_kv_block(l, key_of(1), std::span(payload).first(10)), Error);
  KvBlockKey short_key = key_of(1);
  short_key.tokens.pop_back();
  EXPECT_THROW(encode_kv_block(l, short_key, payload), Error);
}

TEST(KvBlockFormat, ChecksumSeesEveryByteAndLength) {
  std::vector<std::byte> data(1000);
  for (size_t i = 0; i < data.size(); ++i) data[i] = std::byte(i * 7);
  const uint64_t h = kv_checksum(data);
  for (size_t n : {size_t(0), size_t(1), size_t(7), size_t(31), size_t(33), size_t(999)})
    EXPECT_NE(kv_checksum(std::span(data).first(n)), h) << n;
  for (size_t i = 0; i < data.size(); i += 37) {
    auto d = data;
    d[i] ^= std::byte{1};
    EXPECT_NE(kv_checksum(d), h) << i;
  }
}

TEST(KvBlockImport, ImportedBlocksAreHitsAndEvents) {
  // Two groups, as a model with sliding-window layers on pages of their own.
  BlockManager bm(40, 4, true, 1, 8);
  bm.record_events("");
  std::vector<int32_t> prompt(18);
  std::iota(prompt.begin(), prompt.end(), 100);
  EXPECT_EQ(bm.cached_blocks(prompt), 0);
  std::vector<std::vector<int32_t>> filled;
  const int32_t n = bm.import_blocks(prompt, "", 0, 10, [&](int32_t i, std::span<const int32_t> pages) {
    EXPECT_EQ(i, int32_t(filled.size()));
    EXPECT_EQ(pages.size(), 2u);
    filled.emplace_back(pages.begin(), pages.end());
    return i < 3;  // the fourth block "fails its check"
  });
  EXPECT_EQ(n, 3);
  EXPECT_EQ(bm.cached_blocks(prompt), 3);
  bm.check_invariants();
  EXPECT_EQ(bm.n_free(), 40);  // cached free, as computed blocks of a finished sequence

  // KV events name them by the chained content hash.
  const auto events = bm.take_events();
  ASSERT_EQ(events.size(), 3u);
  uint64_t parent = root_block_hash("");
  for (size_t i = 0; i < 3; ++i) {
    const auto t = std::span<const int32_t>(prompt).subspan(i * 4, 4);
    EXPECT_EQ(events[i].kind, KvCacheEvent::Kind::kStored);
    EXPECT_EQ(events[i].hash, chained_block_hash(parent, t));
    EXPECT_EQ(events[i].has_parent, i > 0);
    parent = events[i].hash;
  }

  // Continuing from the fourth block; then a prompt sharing them hits all.
  EXPECT_THROW(bm.import_blocks(prompt, "", 2, 1, [](int32_t, std::span<const int32_t>) { return true; }), Error);
  EXPECT_EQ(bm.import_blocks(prompt, "", 3, 1, [](int32_t, std::span<const int32_t>) { return true; }), 1);
  SeqBlocks s;
  bm.allocate(s, prompt);
  EXPECT_EQ(s.n_cached_tokens, 16);
  EXPECT_EQ(s.table[0], filled[0][0]);
  std::vector<int32_t> tokens(prompt);
  const BlockManager::LiveSeq live{&s, tokens};
  bm.check_invariants(std::span(&live, 1));
  bm.free(s);

  // A salted prompt does not see them; a refused import leaves nothing held.
  EXPECT_EQ(bm.cached_blocks(prompt, "tenant"), 0);
  EXPECT_EQ(bm.import_blocks(prompt, "tenant", 0, 4, [](int32_t, std::span<const int32_t>) { return false; }), 0);
  EXPECT_EQ(bm.n_free(), 40);
  bm.check_invariants();
}

TEST(KvBlockImport, FillsOnlyTheGroupsThatLackABlock) {
  // A running sequence holds its group 0 blocks; its windowed pages before
  // the window were given back and then dropped from the cache.
  BlockManager bm(40, 4, true, 1, 8);
  std::vector<int32_t> prompt(24);
  std::iota(prompt.begin(), prompt.end(), 7);
  SeqBlocks s;
  bm.allocate(s, prompt);
  bm.append(s, 24);
  bm.commit(s, prompt, 24);
  EXPECT_GT(bm.clear_prefix_cache(), 0);
  EXPECT_EQ(bm.cached_blocks(prompt), 0);
  std::vector<std::vector<int32_t>> seen;
  EXPECT_EQ(bm.import_blocks(prompt, "", 0, 6, [&](int32_t, std::span<const int32_t> pages) {
    seen.emplace_back(pages.begin(), pages.end());
    return true;
  }), 6);
  ASSERT_EQ(seen.size(), 6u);
  for (size_t i = 0; i < 6; ++i) {
    EXPECT_EQ(seen[i][0], -1) << i;  // group 0 holds every block
    // Group 1 gets every page: the two it still holds hang from the dropped ones.
    EXPECT_GE(seen[i][1], 0) << i;
  }
  EXPECT_EQ(bm.cached_blocks(prompt), 6);
  const BlockManager::LiveSeq live{&s, prompt};
  bm.check_invariants(std::span(&live, 1));
  bm.free(s);
  bm.check_invariants();
}

TEST(KvBlockImport, StopsWhenOnlyThePromptsPagesAreLeft) {
  BlockManager bm(6, 4, true);
  std::vector<int32_t> prompt(40);
  std::iota(prompt.begin(), prompt.end(), 1);
  EXPECT_EQ(bm.import_blocks(prompt, "", 0, 10, [](int32_t, std::span<const int32_t>) { return true; }), 6);
  EXPECT_EQ(bm.cached_blocks(prompt), 6);
  bm.check_invariants();
}

TEST(ModelFingerprint, TellsApartModelsOfOneShape) {
  namespace fs = std::filesystem;
  auto make = [](uint64_t seed) {
    SynthSpec s;
    s.n_layer = 1;
    s.n_embd = 32;
    s.n_ff = 64;
    s.n_head = 2;
    s.seed = seed;
    s.vocab_from = test::shared_path("models/vocab/ggml-vocab-llama-spm.gguf");
    const fs::path f = fs::temp_directory_path() / ("tandem_fingerprint_" + std::to_string(seed) + ".gguf");
    synth_model(s, f.string(), 1);
    return f;
  };
  const fs::path a = make(1), b = make(2);
  const uint64_t fa = model_fingerprint(*GgufFile::open(a.string()));
  EXPECT_EQ(fs::file_size(a), fs::file_size(b));
  EXPECT_EQ(model_fingerprint(*GgufFile::open(a.string())), fa);  // stable
  EXPECT_NE(model_fingerprint(*GgufFile::open(b.string())), fa);  // same shapes, other weights
  EXPECT_NE(model_fingerprint(*GgufFile::open(test::shared_path("models/gguf/stories260K.gguf"))), fa);
  fs::remove(a);
  fs::remove(b);
}

}  // namespace
}  // namespace tandem

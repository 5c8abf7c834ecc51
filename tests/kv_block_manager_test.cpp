// BlockManager: prefix sharing, key chaining, collision safety, copy-on-write,
// LRU eviction, failure atomicity, and a randomized stress run against a
// simulated KV store in which every slot records the exact prefix that
// produced it, so any read of wrong or overwritten K/V is caught.
#include "kv/block_manager.h"

#include <algorithm>
#include <map>
#include <numeric>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "core/error.h"
#include "kv/block_hash.h"

namespace tandem {
namespace {

using Tokens = std::vector<int32_t>;

Tokens range_tokens(int32_t first, int32_t n) {
  Tokens t(static_cast<size_t>(n));
  std::iota(t.begin(), t.end(), first);
  return t;
}

Tokens concat(Tokens a, const Tokens& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// A sequence as the engine holds it: its blocks and its tokens.
struct Seq {
  SeqBlocks b;
  Tokens tokens;
};

// The block manager plus a stand-in for the KV storage: slot (block, i) holds
// the tokens [0, pos] whose K/V would be there, after a mark of the group
// that wrote it (-1 for group 0, -2 for the first windowed group...).
class Harness {
 public:
  Harness(int32_t n_blocks, int32_t block_size, bool caching = true, int32_t n_windowed = 0, int32_t window = 0)
      : bm(n_blocks, block_size, caching, n_windowed, window),
        kv(size_t(n_blocks), std::vector<Tokens>(size_t(block_size))) {
    bm.set_copy_block([this](int32_t src, int32_t dst) {
      ++copies;
      last_copy = {src, dst};
      kv[size_t(dst)] = kv[size_t(src)];
    });
  }

  Seq admit(const Tokens& prompt, std::string_view salt = {}) {
    Seq s;
    s.tokens = prompt;
    bm.allocate(s.b, s.tokens, true, salt);
    verify_reads(s);
    return s;
  }

  // Runs a step that computes positions [n_computed, end).
  void compute(Seq& s, int32_t end) {
    bm.append(s.b, end);
    verify_reads(s);
    const int32_t bs = bm.block_size();
    for (int32_t p = s.b.n_computed; p < end; ++p)
      for (int32_t g = 0; g <= bm.n_windowed(); ++g)
        kv[size_t(page(s, g, p / bs))][size_t(p % bs)] = content(s.tokens, g, p);
    bm.commit(s.b, s.tokens, end);
  }
  static Tokens content(const Tokens& tokens, int32_t g, int32_t p) {
    Tokens t{-1 - g};
    t.insert(t.end(), tokens.begin(), tokens.begin() + p + 1);
    return t;
  }
  static int32_t page(const Seq& s, int32_t g, int32_t i) {
    return g == 0 ? s.b.table[size_t(i)] : s.b.windowed[size_t(g - 1)].table[size_t(i)];
  }
  void compute_all(Seq& s) { compute(s, int32_t(s.tokens.size())); }

  void decode(Seq& s, int32_t token) {
    s.tokens.push_back(token);
    compute_all(s);
  }

  // Every computed position reads the K/V of exactly its own prefix, in
  // every group; a windowed group from the next query's window on.
  void verify_reads(const Seq& s) const {
    const int32_t bs = bm.block_size();
    for (int32_t g = 0; g <= bm.n_windowed(); ++g) {
      const int32_t from = g == 0 ? 0 : std::max(0, s.b.n_computed - bm.window() + 1);
      for (int32_t p = from; p < s.b.n_computed; ++p) {
        const int32_t b = page(s, g, p / bs);
        ASSERT_GE(b, 0) << "group " << g << " position " << p << " has no block";
        ASSERT_EQ(kv[size_t(b)][size_t(p % bs)], content(s.tokens, g, p))
            << "group " << g << " position " << p << " reads K/V of another prefix";
      }
    }
  }

  void check(std::initializer_list<const Seq*> seqs) const {
    std::vector<BlockManager::LiveSeq> live;
    for (const Seq* s : seqs) live.push_back({&s->b, s->tokens});
    bm.check_invariants(live);
  }

  int32_t ref_holders(int32_t block, std::initializer_list<const Seq*> seqs) const {
    int32_t n = 0;
    for (const Seq* s : seqs) n += int32_t(std::count(s->b.table.begin(), s->b.table.end(), block));
    return n;
  }
  // Blocks the sequence holds in each windowed group.
  static int32_t windowed_held(const Seq& s) {
    int32_t n = 0;
    for (const auto& w : s.b.windowed) n += int32_t(std::count_if(w.table.begin(), w.table.end(), [](int32_t b) { return b >= 0; }));
    return n;
  }

  BlockManager bm;
  std::vector<std::vector<Tokens>> kv;
  int copies = 0;
  std::pair<int32_t, int32_t> last_copy{-1, -1};
};

TEST(KvBlockManager, SharedSystemPromptIsReused) {
  Harness h(32, 4);
  const Tokens sys = range_tokens(1, 10);
  Seq a = h.admit(concat(sys, {100, 101, 102}));
  EXPECT_EQ(a.b.n_cached_tokens, 0);
  h.compute_all(a);

  Seq b = h.admit(concat(sys, {200, 201}));
  EXPECT_EQ(b.b.n_cached_tokens, 8);  // the two full blocks of the 10-token system prompt
  EXPECT_EQ(b.b.n_computed, 8);
  EXPECT_EQ(b.b.table[0], a.b.table[0]);
  EXPECT_EQ(b.b.table[1], a.b.table[1]);
  EXPECT_NE(b.b.table[2], a.b.table[2]);
  h.check({&a, &b});
  h.compute_all(b);
  h.verify_reads(a);
  h.check({&a, &b});

  const BlockStats st = h.bm.stats();
  EXPECT_EQ(st.queried_tokens, 13u + 12u);
  EXPECT_EQ(st.hit_tokens, 8u);
  EXPECT_EQ(st.used, 4 + 1);  // a: 4 blocks; b: 3, two shared
  EXPECT_NEAR(st.hit_ratio(), 8.0 / 25.0, 1e-12);

  h.bm.free(a.b);
  h.bm.free(b.b);
  EXPECT_EQ(h.bm.stats().used, 0);
  h.check({});
}

TEST(KvBlockManager, OnlyComputedBlocksAreShared) {
  // A chunked prefill publishes a block once its K/V exists, not before.
  Harness h(32, 4);
  const Tokens prompt = range_tokens(1, 14);
  Seq a = h.admit(prompt);
  Seq b = h.admit(prompt);
  EXPECT_EQ(b.b.n_cached_tokens, 0);
  h.compute(a, 6);
  Seq c = h.admit(prompt);
  EXPECT_EQ(c.b.n_cached_tokens, 4);
  h.compute(a, 14);
  Seq d = h.admit(prompt);
  EXPECT_EQ(d.b.n_cached_tokens, 12);
  h.check({&a, &b, &c, &d});
  // b computed the same prefix on its own: its blocks duplicate a's, and its
  // prefix entries point at a's published ones.
  h.compute_all(b);
  EXPECT_EQ(b.b.prefix[0].block, a.b.table[0]);
  EXPECT_NE(b.b.table[0], a.b.table[0]);
  h.check({&a, &b, &c, &d});
  for (Seq* s : {&a, &b, &c, &d}) h.bm.free(s->b);
  h.check({});
}

TEST(KvBlockManager, KeysChainThroughThePrefix) {
  Harness h(32, 4);
  Seq a = h.admit({1, 2, 3, 4, 5, 6, 7, 8, 9});
  h.compute_all(a);
  // Same second block after a different first block: not a hit.
  Seq b = h.admit({9, 9, 9, 9, 5, 6, 7, 8, 9});
  EXPECT_EQ(b.b.n_cached_tokens, 0);
  // The second block's content at the start of a prompt: not a hit either.
  Seq c = h.admit({5, 6, 7, 8, 9});
  EXPECT_EQ(c.b.n_cached_tokens, 0);
  Seq d = h.admit({1, 2, 3, 4, 5, 6, 7, 8, 0, 0});
  EXPECT_EQ(d.b.n_cached_tokens, 8);
  Seq e = h.admit({1, 2, 3, 4, 5, 6, 7, 0, 0});
  EXPECT_EQ(e.b.n_cached_tokens, 4);
  h.check({&a, &b, &c, &d, &e});
}

// cache_salt: a prompt's blocks are found only under the same salt (no salt
// is a salt of its own), and a salted block's event hash is vLLM's, with the
// salt as its first block's extra key.
TEST(KvBlockManager, SaltsKeepPrefixesApart) {
  Harness h(64, 4);
  h.bm.record_events();
  const Tokens prompt = range_tokens(1, 10);
  Seq plain = h.admit(prompt);
  h.compute_all(plain);
  Seq a = h.admit(prompt, "tenant-a");
  EXPECT_EQ(a.b.n_cached_tokens, 0);  // the unsalted blocks are not a's
  EXPECT_EQ(a.b.salt, "tenant-a");
  h.compute_all(a);
  Seq a2 = h.admit(prompt, "tenant-a");
  EXPECT_EQ(a2.b.n_cached_tokens, 8);
  EXPECT_EQ(a2.b.table[0], a.b.table[0]);
  Seq b = h.admit(prompt, "tenant-b");
  EXPECT_EQ(b.b.n_cached_tokens, 0);
  Seq none = h.admit(prompt);
  EXPECT_EQ(none.b.n_cached_tokens, 8);
  EXPECT_EQ(none.b.table[0], plain.b.table[0]);
  h.check({&plain, &a, &a2, &b, &none});
  // The events: each of the two prefixes' two blocks once, the salted first
  // block hashed with its salt, the second chained to it as usual.
  std::vector<KvCacheEvent> ev = h.bm.take_events();
  ASSERT_EQ(ev.size(), 4u);
  const Tokens first(prompt.begin(), prompt.begin() + 4), second(prompt.begin() + 4, prompt.begin() + 8);
  const uint64_t root = root_block_hash("");
  EXPECT_EQ(ev[0].hash, chained_block_hash(root, first));
  EXPECT_EQ(ev[2].hash, chained_block_hash(root, first, "tenant-a"));
  EXPECT_FALSE(ev[2].has_parent);
  EXPECT_EQ(ev[3].hash, chained_block_hash(ev[2].hash, second));
  EXPECT_EQ(ev[3].parent, ev[2].hash);
  for (Seq* s : {&plain, &a, &a2, &b, &none}) h.bm.free(s->b);
  h.check({});
}

TEST(KvBlockManager, HashCollisionsNeverGiveWrongBlocks) {
  Harness h(32, 4);
  h.bm.set_hash_for_testing(0, 1);  // every key hashes to 0
  const Tokens t = {7, 7, 7, 7};
  Seq a = h.admit(concat(concat(t, t), {1}));
  h.compute_all(a);
  EXPECT_EQ(h.bm.stats().published, 1);  // the second block's key collides with the first's
  // Same tokens as the indexed block but another parent: a miss, not a reuse of block 0 at position 1.
  Seq b = h.admit(concat(concat(t, t), {2}));
  EXPECT_EQ(b.b.n_cached_tokens, 4);
  EXPECT_NE(b.b.table[1], b.b.table[0]);
  // Same hash, other tokens: a miss.
  Seq c = h.admit({1, 2, 3, 4, 5});
  EXPECT_EQ(c.b.n_cached_tokens, 0);
  h.compute_all(b);
  h.compute_all(c);
  h.verify_reads(a);
  h.check({&a, &b, &c});
  for (Seq* s : {&a, &b, &c}) h.bm.free(s->b);
  h.check({});
}

TEST(KvBlockManager, FullyCachedPromptRecomputesItsLastToken) {
  Harness h(8, 4);
  const Tokens prompt = range_tokens(10, 8);
  Seq a = h.admit(prompt);
  h.compute_all(a);
  EXPECT_EQ(h.copies, 0);

  Seq b = h.admit(prompt);
  EXPECT_EQ(b.b.n_cached_tokens, 7);
  EXPECT_EQ(b.b.n_computed, 7);
  EXPECT_EQ(b.b.table[0], a.b.table[0]);
  EXPECT_NE(b.b.table[1], a.b.table[1]);  // a private copy to write position 7 into
  EXPECT_EQ(h.copies, 1);
  EXPECT_EQ(h.last_copy, std::make_pair(a.b.table[1], b.b.table[1]));
  h.check({&a, &b});
  h.compute_all(b);
  h.verify_reads(a);
  EXPECT_EQ(b.b.prefix[1].block, a.b.table[1]);  // the cached block stays the canonical one
  h.check({&a, &b});

  // From the cached free list too: the published block is never written.
  const int32_t cached_last = a.b.table[1];
  h.bm.free(a.b);
  h.bm.free(b.b);
  Seq c = h.admit(prompt);
  EXPECT_EQ(c.b.n_cached_tokens, 7);
  EXPECT_NE(c.b.table[1], cached_last);
  h.compute_all(c);
  h.bm.free(c.b);
  Seq d = h.admit(prompt);
  EXPECT_EQ(d.b.n_cached_tokens, 7);
  h.check({&d});
  EXPECT_EQ(h.bm.stats().hit_tokens, 21u);
}

TEST(KvBlockManager, FullyCachedPromptWithoutRoomRecomputesItsLastBlock) {
  Harness h(2, 4);
  const Tokens prompt = range_tokens(10, 8);
  Seq a = h.admit(prompt);
  h.compute_all(a);
  EXPECT_FALSE(h.bm.can_allocate(prompt));
  h.bm.free(a.b);
  // Both blocks are cached, but copying the last one would need a third.
  ASSERT_TRUE(h.bm.can_allocate(prompt));
  Seq b = h.admit(prompt);
  EXPECT_EQ(b.b.n_cached_tokens, 4);
  EXPECT_EQ(h.copies, 0);
  h.compute_all(b);
  h.check({&b});
}

TEST(KvBlockManager, ForkSharesBlocksAndCopiesOnWrite) {
  Harness h(16, 4);
  Seq p = h.admit(range_tokens(1, 6));
  h.compute_all(p);
  Seq c{h.bm.fork(p.b), p.tokens};
  EXPECT_EQ(c.b.table, p.b.table);
  EXPECT_EQ(h.bm.stats().used, 2);
  h.check({&p, &c});

  EXPECT_EQ(h.bm.append_cost(c.b, 7), 1);  // the shared, partly filled block
  h.decode(c, 50);
  EXPECT_EQ(h.copies, 1);
  EXPECT_EQ(c.b.table[0], p.b.table[0]);  // full blocks stay shared
  EXPECT_NE(c.b.table[1], p.b.table[1]);
  EXPECT_EQ(h.bm.append_cost(p.b, 7), 0);  // the parent holds its block alone now
  h.decode(p, 60);
  EXPECT_EQ(h.copies, 1);
  h.verify_reads(c);
  h.verify_reads(p);
  h.check({&p, &c});

  // A fork at a block boundary shares only full blocks: no copy.
  h.decode(p, 61);
  Seq c2{h.bm.fork(p.b), p.tokens};
  h.decode(c2, 70);
  h.decode(p, 71);
  EXPECT_EQ(h.copies, 1);
  h.verify_reads(c2);
  h.verify_reads(p);
  h.check({&p, &c, &c2});

  for (Seq* s : {&p, &c, &c2}) h.bm.free(s->b);
  const BlockStats st = h.bm.stats();
  EXPECT_EQ(st.used, 0);
  EXPECT_EQ(st.cached_free, 2);  // the parent's two full blocks; the rest were never full
  h.check({});
}

TEST(KvBlockManager, EvictsLeastRecentlyFreedTailFirst) {
  Harness h(6, 4);
  Seq a = h.admit(range_tokens(100, 8));
  h.compute_all(a);
  Seq b = h.admit(range_tokens(200, 8));
  h.compute_all(b);
  const Tokens a_table = a.b.table, b_table = b.b.table;
  h.bm.free(a.b);
  h.bm.free(b.b);
  EXPECT_EQ(h.bm.stats().cached_free, 4);

  // Two never-used blocks go first, then a's tail, then a's head.
  Seq x = h.admit(range_tokens(300, 12));
  EXPECT_EQ(x.b.table[2], a_table[1]);
  EXPECT_EQ(h.bm.stats().cached_free, 3);
  Seq a2 = h.admit(range_tokens(100, 8));
  EXPECT_EQ(a2.b.n_cached_tokens, 4);
  EXPECT_EQ(a2.b.table[0], a_table[0]);
  EXPECT_EQ(a2.b.table[1], b_table[1]);  // the next least recently freed
  h.check({&x, &a2});
  h.bm.free(x.b);
  h.bm.free(a2.b);
  h.check({});
}

TEST(KvBlockManager, HitRefreshesRecency) {
  Harness h(5, 4);
  Seq a = h.admit(range_tokens(100, 8));
  h.compute_all(a);
  h.bm.free(a.b);
  Seq b = h.admit(range_tokens(200, 8));
  h.compute_all(b);
  h.bm.free(b.b);
  Seq a2 = h.admit(range_tokens(100, 9));  // touches a's blocks, so b's are now older
  EXPECT_EQ(a2.b.n_cached_tokens, 8);
  h.bm.free(a2.b);
  Seq c = h.admit(range_tokens(300, 8));  // one never-used block, then b's tail
  EXPECT_EQ(h.bm.stats().cached_free, 3);
  Seq a3 = h.admit(range_tokens(100, 9));  // its fresh block evicts b's head
  EXPECT_EQ(a3.b.n_cached_tokens, 8);
  h.bm.free(a3.b);
  Seq b2 = h.admit(range_tokens(200, 9));
  EXPECT_EQ(b2.b.n_cached_tokens, 0);
  h.check({&b2, &c});
}

TEST(KvBlockManager, OutOfBlocksChangesNothing) {
  Harness h(4, 4);
  Seq a = h.admit(range_tokens(1, 12));
  h.compute_all(a);
  const Tokens big = range_tokens(50, 8);
  EXPECT_FALSE(h.bm.can_allocate(big));
  const BlockStats before = h.bm.stats();
  Seq b;
  b.tokens = big;
  try {
    h.bm.allocate(b.b, big);
    FAIL() << "allocate succeeded without blocks";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kResource);
  }
  EXPECT_TRUE(b.b.table.empty());
  EXPECT_EQ(h.bm.stats().used, before.used);
  EXPECT_EQ(h.bm.stats().queried_tokens, before.queried_tokens);
  h.check({&a});

  Seq c = h.admit(range_tokens(90, 4));  // the last block
  EXPECT_FALSE(h.bm.can_append(a.b, 13));
  const SeqBlocks a_before = a.b;
  EXPECT_THROW(h.bm.append(a.b, 13), Error);
  EXPECT_EQ(a.b.table, a_before.table);
  EXPECT_EQ(a.b.n_tokens, 12);
  h.check({&a, &c});

  // Cached free blocks count as available, and hits on them are revived.
  h.bm.free(c.b);
  h.bm.free(a.b);
  EXPECT_TRUE(h.bm.can_allocate(range_tokens(1, 16)));   // 3 hits + 1 fresh
  EXPECT_FALSE(h.bm.can_allocate(range_tokens(1, 17)));  // needs 5
  h.check({});
}

TEST(KvBlockManager, PrefixCachingOff) {
  Harness h(16, 4, /*caching=*/false);
  Seq a = h.admit(range_tokens(1, 9));
  h.compute_all(a);
  Seq b = h.admit(range_tokens(1, 9));
  EXPECT_EQ(b.b.n_cached_tokens, 0);
  EXPECT_EQ(h.bm.stats().published, 0);
  h.bm.free(a.b);
  EXPECT_EQ(h.bm.stats().cached_free, 0);
  h.check({&b});
}

TEST(KvBlockManager, ClearPrefixCache) {
  Harness h(8, 4);
  Seq a = h.admit(range_tokens(1, 9));
  h.compute_all(a);
  h.bm.free(a.b);
  h.bm.clear_prefix_cache();
  EXPECT_EQ(h.bm.stats().cached_free, 0);
  EXPECT_EQ(h.bm.stats().published, 0);
  Seq b = h.admit(range_tokens(1, 9));
  EXPECT_EQ(b.b.n_cached_tokens, 0);
  h.check({&b});
}

TEST(KvBlockManager, RejectsMisuse) {
  EXPECT_THROW(BlockManager(0, 16), Error);
  EXPECT_THROW(BlockManager(8, 0), Error);
  Harness h(8, 4);
  SeqBlocks s;
  EXPECT_FALSE(h.bm.can_allocate({}));
  EXPECT_THROW(h.bm.allocate(s, {}), Error);
  const Tokens t = range_tokens(1, 6);
  h.bm.allocate(s, t);
  EXPECT_THROW(h.bm.allocate(s, t), Error);           // already allocated
  EXPECT_THROW(h.bm.commit(s, t, 7), Error);          // beyond its slots
  h.bm.commit(s, t, 5);
  EXPECT_THROW(h.bm.commit(s, t, 4), Error);          // going back
  SeqBlocks forged;
  forged.table = {7};
  forged.n_tokens = 3;
  EXPECT_THROW(h.bm.free(forged), Error);             // block 7 is not in use
  forged.table = {99};
  EXPECT_THROW(h.bm.fork(forged), Error);
  h.bm.free(s);
  h.bm.free(s);  // a no-op once empty
  h.bm.check_invariants();
  EXPECT_EQ(h.bm.stats().used, 0);
}

TEST(KvBlockManager, WindowedGroupsGiveBackPassedBlocksAndHitInEveryGroup) {
  Harness h(64, 4, true, 2, 8);  // two windowed groups; a query sees 8 positions
  Seq a = h.admit(range_tokens(1, 21));
  EXPECT_EQ(Harness::windowed_held(a), 0);  // windowed groups grow as positions are written
  h.compute(a, 12);
  // Position 12 reads 5..12: blocks 1 and 2 of each windowed group; block 0 went back.
  EXPECT_EQ(a.b.windowed[0].table, (std::vector<int32_t>{-1, a.b.windowed[0].table[1], a.b.windowed[0].table[2]}));
  h.compute_all(a);  // 21 positions: 13..20 are read next, blocks 3..5
  for (const auto& w : a.b.windowed) {
    ASSERT_EQ(w.table.size(), 6u);
    EXPECT_EQ(std::count(w.table.begin(), w.table.end(), -1), 3);
  }
  EXPECT_EQ(h.bm.stats().used, 6 + 2 * 3);
  h.check({&a});
  // The same prompt again: every group's blocks are still cached, so the
  // hit covers all five whole blocks, though the windowed ones went back
  // long ago; only those inside the window are held again.
  const Tokens prompt = a.tokens;
  h.bm.free(a.b);
  Seq b = h.admit(concat(prompt, {99}));
  EXPECT_EQ(b.b.n_computed, 20);
  EXPECT_EQ(Harness::windowed_held(b), 2 * 2);  // blocks 3 and 4: positions 13..19
  h.compute_all(b);
  h.check({&b});
  h.bm.free(b.b);
  // A pool without room for a window of the windowed groups refuses the prompt.
  Harness tight(6 + 2 * 2, 4, true, 2, 8);
  EXPECT_FALSE(tight.bm.can_allocate(range_tokens(1, 24)));
  EXPECT_TRUE(Harness(6 + 2 * 3, 4, true, 2, 8).bm.can_allocate(range_tokens(1, 24)));
}

// ---- randomized stress ----

// What a router subscribed to the KV events knows: content hash -> (parent, tokens).
struct EventReplay {
  struct Entry {
    bool has_parent;
    uint64_t parent;
  };
  std::map<uint64_t, Entry> held;
  int stored = 0, removed = 0, cleared = 0;

  void apply(const std::vector<KvCacheEvent>& events, const BlockManager& bm) {
    const int32_t block_size = bm.block_size();
    for (const KvCacheEvent& e : events) {
      switch (e.kind) {
        case KvCacheEvent::Kind::kStored:
          ASSERT_FALSE(held.contains(e.hash)) << "stored twice: " << e.hash;
          ASSERT_EQ(e.tokens.size(), size_t(block_size));
          ASSERT_EQ(bm.content_hash(e.has_parent, e.parent, e.tokens), e.hash);
          if (e.has_parent) {
            ASSERT_TRUE(held.contains(e.parent)) << "stored before its parent";
          }
          held[e.hash] = {e.has_parent, e.parent};
          ++stored;
          break;
        case KvCacheEvent::Kind::kRemoved:
          ASSERT_EQ(held.erase(e.hash), 1u) << "removed a hash not held: " << e.hash;
          ++removed;
          break;
        case KvCacheEvent::Kind::kCleared:
          held.clear();
          ++cleared;
          break;
      }
    }
  }
  std::vector<uint64_t> hashes() const {
    std::vector<uint64_t> out;
    for (const auto& [h, e] : held) out.push_back(h);
    return out;
  }
};

struct StressConfig {
  int32_t block_size;
  uint64_t hash_mask;
  bool caching;
  uint32_t seed;
  int events_from = -1;  // the operation at which KV events start (-1: never)
  int32_t n_windowed = 0, window = 0;
  bool swap = false;  // preempted sequences keep their K/V outside the pool (restore)
};

void stress(const StressConfig& cfg) {
  const int32_t n_blocks = 40 + 16 * cfg.n_windowed;
  Harness h(n_blocks, cfg.block_size, cfg.caching, cfg.n_windowed, cfg.window);
  h.bm.set_hash_for_testing(cfg.hash_mask, 0x5eed0000ULL + cfg.seed);
  std::mt19937 rng(cfg.seed);
  auto uniform = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };

  // A few shared prefixes over a small alphabet, so that equal block
  // contents turn up under different prefixes.
  std::vector<Tokens> prefixes;
  for (int i = 0; i < 4; ++i) {
    Tokens p(size_t(uniform(0, 14)));
    for (auto& t : p) t = uniform(0, 3);
    prefixes.push_back(p);
  }
  std::vector<Seq> live;
  std::vector<Tokens> preempted;
  // Swapped out: tokens, computed positions, and the saved slots of group 0's
  // blocks then each windowed group's from its window on (as the scheduler lays them out).
  struct Swapped {
    Tokens tokens;
    int32_t computed;
    std::vector<std::vector<Tokens>> pages;
  };
  std::vector<Swapped> swapped;
  int admitted = 0, refused = 0, forks = 0, preemptions = 0, restored = 0, given_back = 0;

  auto check_all = [&] {
    std::vector<BlockManager::LiveSeq> view;
    for (const Seq& s : live) view.push_back({&s.b, s.tokens});
    h.bm.check_invariants(view);
  };
  auto try_admit = [&](const Tokens& prompt) {
    if (!h.bm.can_allocate(prompt)) {
      const int32_t free_before = h.bm.n_free();
      SeqBlocks s;
      EXPECT_THROW(h.bm.allocate(s, prompt), Error);
      EXPECT_TRUE(s.table.empty());
      EXPECT_EQ(h.bm.n_free(), free_before);
      ++refused;
      return false;
    }
    Seq s = h.admit(prompt);
    EXPECT_LT(s.b.n_computed, int32_t(prompt.size()));  // at least one token left to compute
    live.push_back(std::move(s));
    ++admitted;
    return true;
  };

  auto swap_in = [&] {
    Swapped w = std::move(swapped.back());
    swapped.pop_back();
    if (!h.bm.can_allocate(w.tokens)) {
      swapped.push_back(std::move(w));
      return;
    }
    Seq s;
    s.tokens = w.tokens;
    h.bm.allocate(s.b, s.tokens);
    const int32_t done = std::max(s.b.n_computed, w.computed);
    if (h.bm.restore_cost(s.b, done) > h.bm.n_free()) {
      h.bm.free(s.b);
      swapped.push_back(std::move(w));
      return;
    }
    h.bm.restore(s.b, done);
    const int32_t bs = h.bm.block_size(), n = h.bm.blocks_for(w.computed), kept = h.bm.first_kept_block(w.computed);
    const int32_t first = s.b.n_computed / bs;
    size_t at = 0;
    for (int32_t g = 0; g <= h.bm.n_windowed(); ++g) {
      const int32_t from = g == 0 ? 0 : kept;
      for (int32_t i = from; i < n; ++i, ++at)
        if (i >= first) h.kv[size_t(Harness::page(s, g, i))] = w.pages[at];
    }
    h.bm.commit(s.b, s.tokens, done);
    h.verify_reads(s);
    live.push_back(std::move(s));
    ++restored;
  };

  EventReplay router;
  for (int op = 0; op < 4000; ++op) {
    if (op == cfg.events_from) h.bm.record_events();
    const int kind = uniform(0, 99);
    if (kind < 20 && live.size() < 10) {
      Tokens prompt = prefixes[size_t(uniform(0, 3))];
      const int extra = uniform(1, 10);
      for (int i = 0; i < extra; ++i) prompt.push_back(uniform(0, 3));
      try_admit(prompt);
    } else if (kind < 25 && !preempted.empty() && live.size() < 10) {
      if (try_admit(preempted.back())) preempted.pop_back();
    } else if (kind < 25 && !swapped.empty() && live.size() < 10) {
      swap_in();
    } else if (kind < 80 && !live.empty()) {
      Seq& s = live[size_t(uniform(0, int(live.size()) - 1))];
      int32_t end;
      if (s.b.n_computed < int32_t(s.tokens.size())) {
        end = std::min(int32_t(s.tokens.size()), s.b.n_computed + uniform(1, 6));  // a prefill chunk
      } else {
        s.tokens.push_back(uniform(0, 3));  // a decode step
        end = int32_t(s.tokens.size());
      }
      if (h.bm.can_append(s.b, end)) {
        h.compute(s, end);
        for (const auto& w : s.b.windowed) given_back += !w.table.empty() && w.table[0] < 0;
      } else {
        const SeqBlocks before = s.b;
        EXPECT_THROW(h.bm.append(s.b, end), Error);
        EXPECT_EQ(s.b.table, before.table);
        // Preempt: keep the tokens (and, swapping, the K/V), drop the blocks.
        if (cfg.swap && s.b.n_computed > 0) {
          Swapped w{s.tokens, s.b.n_computed, {}};
          const int32_t n = h.bm.blocks_for(w.computed), kept = h.bm.first_kept_block(w.computed);
          for (int32_t g = 0; g <= h.bm.n_windowed(); ++g)
            for (int32_t i = g == 0 ? 0 : kept; i < n; ++i) w.pages.push_back(h.kv[size_t(Harness::page(s, g, i))]);
          swapped.push_back(std::move(w));
        } else {
          preempted.push_back(s.tokens);
        }
        h.bm.free(s.b);
        s = std::move(live.back());
        live.pop_back();
        ++preemptions;
      }
    } else if (kind < 88 && !live.empty() && live.size() < 12) {
      const Seq& s = live[size_t(uniform(0, int(live.size()) - 1))];
      Seq child{h.bm.fork(s.b), s.tokens};
      live.push_back(std::move(child));
      ++forks;
    } else if (!live.empty()) {
      const size_t i = size_t(uniform(0, int(live.size()) - 1));
      h.bm.free(live[i].b);
      live[i] = std::move(live.back());
      live.pop_back();
    }
    check_all();
    if (cfg.events_from >= 0 && op >= cfg.events_from) {
      router.apply(h.bm.take_events(), h.bm);
      ASSERT_EQ(router.hashes(), h.bm.content_hashes()) << "after operation " << op;
    }
    if (::testing::Test::HasFailure()) return;
  }
  for (const Seq& s : live) h.verify_reads(s);
  for (Seq& s : live) h.bm.free(s.b);
  live.clear();
  check_all();
  const BlockStats st = h.bm.stats();
  EXPECT_EQ(st.used, 0);
  EXPECT_EQ(st.free, n_blocks);
  EXPECT_LE(st.cached_free, n_blocks);
  // The run exercised what it is meant to.
  EXPECT_GT(admitted, 200);
  EXPECT_GT(refused + preemptions, 10);
  EXPECT_GT(forks, 50);
  EXPECT_GT(h.copies, 20);
  if (cfg.caching) {
    EXPECT_GT(st.hit_tokens, 100u);
  }
  if (cfg.swap) {
    EXPECT_GT(restored, 5);
  }
  if (cfg.n_windowed > 0) {
    EXPECT_GT(given_back, 100);
  }
  if (cfg.events_from >= 0) {
    EXPECT_GT(router.stored, 20);
    EXPECT_GT(router.removed, 10);
    h.bm.clear_prefix_cache();  // every block is free now: one AllBlocksCleared
    router.apply(h.bm.take_events(), h.bm);
    EXPECT_EQ(router.cleared, 1);
    EXPECT_TRUE(router.held.empty());
    EXPECT_TRUE(h.bm.content_hashes().empty());
  }
}

TEST(KvBlockManager, StressBlockSize4) { stress({4, ~uint64_t(0), true, 1}); }
TEST(KvBlockManager, StressBlockSize3) { stress({3, ~uint64_t(0), true, 2}); }
TEST(KvBlockManager, StressCollidingHashes) { stress({4, 3, true, 3}); }
TEST(KvBlockManager, StressCachingOff) { stress({4, ~uint64_t(0), false, 4}); }
// The KV events, replayed as a router would, name exactly the content cached,
// whether recording starts with the pool empty or full of published blocks.
TEST(KvBlockManager, StressEventsFromTheStart) { stress({4, ~uint64_t(0), true, 5, 0}); }
TEST(KvBlockManager, StressEventsFromMidway) { stress({3, ~uint64_t(0), true, 6, 1500}); }
TEST(KvBlockManager, StressEventsCollidingHashes) { stress({4, 3, true, 7, 0}); }
// Windowed groups: pages behind the window go back as sequences grow, every
// position a query still reads is there, hits hold in every group, and
// swapped sequences come back with their window.
TEST(KvBlockManager, StressWindowedGroups) { stress({4, ~uint64_t(0), true, 8, -1, 2, 6}); }
TEST(KvBlockManager, StressWindowedGroupsSwapped) { stress({3, ~uint64_t(0), true, 9, -1, 3, 5, true}); }
TEST(KvBlockManager, StressWindowedGroupsEvents) { stress({4, ~uint64_t(0), true, 10, 0, 1, 9, true}); }

TEST(KvBlockManager, EventsNameContentAlikeOnEveryReplica) {
  // Two managers (different seeds, different block ids): the same prompt
  // yields the same hashes, chained through the parent.
  Harness a(8, 4), b(8, 4);
  a.bm.record_events();
  b.bm.record_events();
  Seq other = b.admit(range_tokens(100, 6));  // shifts b's block ids
  b.compute_all(other);
  b.bm.take_events();
  Seq sa = a.admit(range_tokens(1, 10)), sb = b.admit(range_tokens(1, 10));
  a.compute_all(sa);
  b.compute_all(sb);
  const std::vector<KvCacheEvent> ea = a.bm.take_events(), eb = b.bm.take_events();
  ASSERT_EQ(ea.size(), 2u);  // two full blocks of 4; the partial third is not cached
  ASSERT_EQ(eb.size(), 2u);
  EXPECT_NE(sa.b.table, sb.b.table);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(ea[i].kind, KvCacheEvent::Kind::kStored);
    EXPECT_EQ(ea[i].hash, eb[i].hash);
    EXPECT_EQ(ea[i].tokens, range_tokens(1 + 4 * int32_t(i), 4));
  }
  EXPECT_FALSE(ea[0].has_parent);
  EXPECT_TRUE(ea[1].has_parent);
  EXPECT_EQ(ea[1].parent, ea[0].hash);
  // The same tokens after another prefix are other content.
  EXPECT_NE(a.bm.content_hash(false, 0, range_tokens(5, 4)), ea[1].hash);
}

TEST(KvBlockManager, EventsForEvictionAndClearing) {
  Harness h(6, 4);
  h.bm.record_events();
  Seq a = h.admit(range_tokens(1, 8));
  h.compute_all(a);
  EXPECT_EQ(h.bm.take_events().size(), 2u);
  // A block in use survives a clear: the freed ones are removed one by one.
  Seq b = h.admit(range_tokens(50, 9));
  h.compute_all(b);
  h.bm.free(a.b);
  h.bm.take_events();
  EXPECT_EQ(h.bm.clear_prefix_cache(), 2);
  std::vector<KvCacheEvent> ev = h.bm.take_events();
  ASSERT_EQ(ev.size(), 2u);
  EXPECT_EQ(ev[0].kind, KvCacheEvent::Kind::kRemoved);
  EXPECT_EQ(ev[1].kind, KvCacheEvent::Kind::kRemoved);
  EXPECT_EQ(h.bm.content_hashes().size(), 2u);  // b's two full blocks
  // Eviction: a prompt that needs every block pushes out b's cached ones.
  h.bm.free(b.b);
  Seq c = h.admit(range_tokens(200, 24));
  h.compute_all(c);
  ev = h.bm.take_events();
  int removed = 0, stored = 0;
  for (const KvCacheEvent& e : ev) (e.kind == KvCacheEvent::Kind::kRemoved ? removed : stored) += 1;
  EXPECT_EQ(removed, 2);
  EXPECT_EQ(stored, 6);
  EXPECT_TRUE(h.bm.content_hashes().size() == 6u);
  h.bm.free(c.b);
  h.check({});
}

}  // namespace
}  // namespace tandem

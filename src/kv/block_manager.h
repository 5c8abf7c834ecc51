// Paged KV block accounting for the serving engine: which pool block holds
// which positions of which sequence, reference counts for shared blocks, and
// the prefix cache.
//
// Prefix cache. A full block whose K/V has been computed is *published* under
// a key (the block that holds the previous block_size tokens of the prefix,
// that block's epoch, and this block's tokens). A later prompt walks its full
// blocks from the start and reuses every published block whose key matches
// exactly; the first miss ends the walk. Keys chain through block *identity*
// (id + epoch, bumped whenever a block is handed out anew) rather than through
// a hash of the previous block, and every hit compares parent and tokens
// exactly, so a hash collision can cost a cache hit but never returns K/V
// computed for a different prefix. The 64-bit hash (seeded per manager) only
// indexes the map.
//
// Copy-on-write. A published block is immutable, and a block held by several
// sequences (after fork, or a prefix hit) is never written in place: before a
// sequence writes a position in such a block, it gets a private copy through
// the copy callback (set_copy_block), which the engine wires to the KV storage.
//
// Life of a sequence (single-threaded; the engine keeps one SeqBlocks per
// sequence next to its token list):
//   can_allocate(prompt) / allocate(s, prompt)
//       table covers the prompt; s.n_computed = s.n_cached_tokens (hits).
//       Positions [n_computed, prompt) are writable at once: a fully cached
//       prompt still recomputes its last token, into a private copy of the
//       cached block (or recomputes that whole block when it cannot copy).
//   before each step that writes positions [s.n_computed, end):
//       can_append(s, end) / append(s, end)
//       grows the table when end > n_tokens and copies shared blocks in the
//       write range; a no-op for a prefill chunk into fresh blocks.
//   after each step: commit(s, tokens, n_computed)
//       records how far K/V is written and publishes newly completed blocks.
//       Blocks are published only here, after their K/V exists: a block that a
//       chunked prefill has not yet reached must not be a hit for anyone.
//   truncate(s, n): after a speculative step, drops the slots of positions
//       past n whose K/V was written for draft tokens that were rejected.
//   fork(s): a new sequence sharing all of s's blocks (n > 1 choices).
//   free(s): drops s's references; published blocks stay cached for reuse.
// Free blocks without cached content are reused first; then cached blocks,
// least recently freed first (a sequence's tail before its head).
//
// Windowed groups (kv/kv_cache.h, KvPaging). A model whose sliding-window
// layers sit on pages of their own has, per sequence, one more table per
// windowed group. Those tables grow with the positions written (append), not
// with the prompt at allocate, and commit gives back every page the window
// has passed: a query at p reads positions (p - window, p], and no later
// query is earlier than n_computed. Their pages are published and found like
// group 0's, each group chaining its own blocks; a prefix hit is as long as
// it is in every group. Only group 0's blocks make KV events.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace tandem {

// A block as it was at one point in time: the block id and its epoch then.
struct BlockRef {
  int32_t block = -1;  // -1: none
  uint64_t epoch = 0;
  bool operator==(const BlockRef&) const = default;
};

// One windowed group's share of a sequence.
struct WindowedBlocks {
  std::vector<int32_t> table;   // covers [0, table.size() * block_size); -1: given back
  std::vector<BlockRef> prefix; // as SeqBlocks::prefix, for this group's blocks
};

// One sequence's share of the pool.
struct SeqBlocks {
  std::vector<int32_t> table;   // block ids in position order; covers [0, n_tokens)
  int32_t n_tokens = 0;         // positions with a slot
  int32_t n_computed = 0;       // positions whose K/V is written (as last committed)
  int32_t n_cached_tokens = 0;  // prompt tokens whose K/V came from the prefix cache at allocate
  // For each full computed block (n_computed / block_size of them): the
  // published block holding the same content under the same prefix, which
  // need not be table[i] (a concurrent duplicate), or none.
  std::vector<BlockRef> prefix;
  std::vector<WindowedBlocks> windowed;  // one per windowed group once allocated
  // A streaming window evicted positions: slots no longer hold the K/V of
  // the tokens at their index, so nothing more is published or checked
  // against tokens (its prefix entries are none).
  bool detached = false;
  // The prompt's cache salt (allocate's): its first block's key, so that only
  // sequences with the same salt share any of its blocks. "": none.
  std::string salt;
};

struct BlockStats {
  int64_t total = 0;
  int64_t used = 0;         // ref count > 0
  int64_t free = 0;         // ref count 0, cached or not
  int64_t cached_free = 0;  // free blocks still holding published content
  int64_t published = 0;    // blocks in the prefix index (used or free)
  uint64_t queried_tokens = 0;  // prompt tokens looked up by allocate
  uint64_t hit_tokens = 0;      // of those, served from the cache
  double hit_ratio() const { return queried_tokens ? double(hit_tokens) / double(queried_tokens) : 0.0; }
};

// A change in what the prefix cache holds, for routers that send a request to
// the replica caching its prefix (KV events; server/kv_events.h publishes them).
// A block is named by a content hash, the same on every replica and the one
// llm-d and vLLM compute: of its parent's hash and its tokens (kv/block_hash.h).
// Each hash is stored once however many blocks hold that content, and removed
// when the last one goes.
struct KvCacheEvent {
  enum class Kind : uint8_t { kStored, kRemoved, kCleared };
  Kind kind = Kind::kStored;
  uint64_t hash = 0;            // kStored, kRemoved
  bool has_parent = false;      // kStored: false for a prompt's first block
  uint64_t parent = 0;
  std::vector<int32_t> tokens;  // kStored: the block's block_size tokens
};

// Copies the K/V of every layer of block `src` into block `dst`.
using CopyBlockFn = std::function<void(int32_t src, int32_t dst)>;
// Copies slots [from, to) of block `src` into the same slots of `dst`.
using CopySlotsFn = std::function<void(int32_t src, int32_t dst, int32_t from, int32_t to)>;

class BlockManager {
 public:
  // Throws kInvalidArgument unless both counts are positive (and the
  // window, with windowed groups).
  BlockManager(int32_t n_blocks, int32_t block_size, bool enable_prefix_caching = true, int32_t n_windowed = 0,
               int32_t window = 0);

  // Needed before a write into a shared block (after fork). Without it, and
  // when the pool has no block to spare, a fully cached prompt recomputes its
  // whole last block instead of copying it.
  void set_copy_block(CopyBlockFn fn) { copy_block_ = std::move(fn); }
  // Needed by evict() when the kept head ends inside a block.
  void set_copy_slots(CopySlotsFn fn) { copy_slots_ = std::move(fn); }

  int32_t n_blocks() const { return static_cast<int32_t>(blocks_.size()); }
  int32_t block_size() const { return block_size_; }
  int32_t n_windowed() const { return n_windowed_; }
  int32_t window() const { return window_; }
  // The first block a windowed group still needs once positions
  // [0, n_computed) are written.
  int32_t first_kept_block(int32_t n_computed) const {
    return std::max(0, n_computed - window_ + 1) / block_size_;
  }
  bool prefix_caching() const { return prefix_caching_; }
  int32_t n_free() const { return static_cast<int32_t>(plain_free_.size()) + n_cached_free_; }
  int32_t blocks_for(int64_t n_tokens) const {
    return static_cast<int32_t>((n_tokens + block_size_ - 1) / block_size_);
  }

  // Whether allocate(tokens) would succeed now, including the private copy a
  // fully cached prompt needs for its last token. With windowed groups, also
  // whether a window's worth of their pages is free, so that an admitted
  // prompt can make progress (allocate asks the same).
  // use_cache = false: no prefix-cache hits (every position is computed
  // again; the blocks are still published as they complete).
  // salt: the prompt's cache salt (SeqBlocks::salt); hits only among its equals.
  bool can_allocate(std::span<const int32_t> tokens, bool use_cache = true, std::string_view salt = {}) const;
  // `s` must be empty and `tokens` non-empty (kInvalidArgument). Throws
  // kResource, changing nothing, when the pool is short.
  void allocate(SeqBlocks& s, std::span<const int32_t> tokens, bool use_cache = true, std::string_view salt = {});

  // Blocks that append(s, end) would take from the pool.
  int32_t append_cost(const SeqBlocks& s, int32_t end) const;
  bool can_append(const SeqBlocks& s, int32_t end) const { return append_cost(s, end) <= n_free(); }
  // Makes positions [s.n_computed, end) writable by `s` alone. kResource,
  // changing nothing, when the pool is short.
  void append(SeqBlocks& s, int32_t end);

  // Positions [s.n_computed, n) come back from elsewhere (swap space) rather
  // than from a step: the windowed groups get fresh pages for the blocks of
  // those positions that a commit of n keeps (-1 before them). restore_cost
  // is how many it takes; restore throws kResource, changing nothing, when
  // the pool is short. Group 0 already covers them (allocate).
  int32_t restore_cost(const SeqBlocks& s, int32_t n) const;
  void restore(SeqBlocks& s, int32_t n);

  // K/V of positions [0, n_computed) of `s` is written; `tokens` holds at
  // least those tokens. Publishes the blocks this completes.
  void commit(SeqBlocks& s, std::span<const int32_t> tokens, int32_t n_computed);

  // Gives back the slots past `n_tokens` (>= n_computed): the positions of
  // rejected draft tokens. Blocks no longer covered return to the pool;
  // their content was never published (only computed blocks are).
  void truncate(SeqBlocks& s, int32_t n_tokens);
  // Forgets the K/V of positions from `n` on (n <= n_computed) and gives back
  // the slots after it: for a cache whose content is never published (a
  // draft model's). Throws kInvalidArgument if a block it drops is published.
  void rollback(SeqBlocks& s, int32_t n);

  // A streaming window: forgets computed positions [from, from + count)
  // (count a multiple of the block size) and moves the ones after them down
  // by count; the blocks before `from` become private (their keys are
  // rewritten next) and the sequence detached. evict_cost is the blocks it
  // takes from the pool first (copies of shared head blocks); evict throws
  // kResource, changing nothing, when they are short. No windowed groups.
  int32_t evict_cost(const SeqBlocks& s, int32_t from) const;
  void evict(SeqBlocks& s, int32_t from, int32_t count);

  SeqBlocks fork(const SeqBlocks& s);
  // Releases every block of `s` and leaves it empty; freeing an empty one is a no-op.
  void free(SeqBlocks& s);

  // Whether a block still holds what it held when `r` was taken (published,
  // same epoch): a reference that does not pin the block can check it.
  bool holds(BlockRef r) const { return is_current(r); }

  // Blocks computed elsewhere (a KV store, another instance). How many of
  // the prompt's first full blocks the prefix cache holds in every group.
  int32_t cached_blocks(std::span<const int32_t> tokens, std::string_view salt = {}) const;
  // Publishes the prompt's full blocks from `first` (== cached_blocks) on,
  // at most `count`, as cached free blocks, as commit would have: takes a
  // page for each group that lacks the block, and fill(index, pages) (one
  // per group, group 0's first; -1 where the group holds it already) writes
  // its K/V. Stops at the first block fill refuses (returns false), or when
  // no page is left but the prompt's own; returns how many it published.
  // The prompt's cached blocks are kept meanwhile, and the new ones are
  // announced as KV events like computed ones. kInvalidArgument when
  // `first` is not cached_blocks.
  using FillBlockFn = std::function<bool(int32_t index, std::span<const int32_t> pages)>;
  int32_t import_blocks(std::span<const int32_t> tokens, std::string_view salt, int32_t first, int32_t count,
                        const FillBlockFn& fill);

  // Forgets cached content of free blocks (e.g. to measure a cold start).
  // Returns how many blocks it dropped.
  int32_t clear_prefix_cache();

  // Starts recording KvCacheEvents (off by default: nothing is kept); the
  // caller takes them after each change, e.g. once per engine step. The seed
  // names the root of every prefix (kv/block_hash.h).
  void record_events(std::string_view hash_seed = "");
  std::vector<KvCacheEvent> take_events() { return std::exchange(events_, {}); }
  // The content hash a block of `tokens` after a block of hash `parent` gets
  // (has_parent = false: the first block of a prompt).
  uint64_t content_hash(bool has_parent, uint64_t parent, std::span<const int32_t> tokens,
                        std::string_view salt = {}) const;
  // The content hashes held now, ascending: what the events so far describe.
  std::vector<uint64_t> content_hashes() const;

  BlockStats stats() const;

  // Throws std::logic_error naming the first broken invariant: each block is
  // either used (ref > 0) or in exactly one free list; the cached list holds
  // only published blocks and the plain list none; the index maps each key
  // hash to a published block whose stored key hashes to it, and nothing else.
  void check_invariants() const;
  // Also checks the live sequences against the manager: ref counts equal the
  // number of tables holding each block, tables hold no block twice, cover
  // exactly their tokens (at most one partly filled block), and every
  // published block and prefix entry of a sequence holds that sequence's tokens.
  struct LiveSeq {
    const SeqBlocks* seq;
    std::span<const int32_t> tokens;
  };
  void check_invariants(std::span<const LiveSeq> live) const;

  // Test hook: keeps only these bits of every key hash, to force collisions.
  // Tests fix the seed (normally random, against crafted collisions) so that
  // a run is reproducible, and narrow the mask to force collisions.
  void set_hash_for_testing(uint64_t mask, uint64_t seed) {
    hash_mask_ = mask;
    seed_ = seed;
  }

 private:
  enum class State : uint8_t { kPlainFree, kCachedFree, kUsed };
  struct Block {
    int32_t ref = 0;
    State state = State::kPlainFree;
    bool published = false;
    bool windowed = false;  // published by a windowed group (no KV events)
    uint64_t epoch = 0;
    uint64_t hash = 0;      // of the key, while published
    uint64_t content = 0;   // content_hash, while published and recording events
    BlockRef parent;        // key: previous block of the prefix (none for the first)
    std::string salt;       // a first block's cache salt, while published (its content hash)
    int32_t lru_prev = -1;  // cached free list links
    int32_t lru_next = -1;
  };
  struct Plan {
    std::vector<int32_t> hits;  // published blocks matching the prompt's first full blocks
    std::vector<std::vector<int32_t>> windowed_hits;  // as many per windowed group
    int32_t need = 0;           // blocks taken from the pool
    bool full_hit = false;      // every token is cached: the last block gets a private copy
  };

  uint64_t key_hash(BlockRef parent, std::span<const int32_t> tokens) const;
  // The parent of a prompt's first block in group g: none for group 0, a
  // mark per windowed group so that the groups' keys never meet; its epoch
  // is the salt's key (salt_key), so that salts' keys never meet either.
  static BlockRef root(int32_t g, uint64_t salt_key = 0) { return BlockRef{-1 - g, salt_key}; }
  // 0 for no salt; else 64 bits of its SHA-256 (never 0).
  static uint64_t salt_key(std::string_view salt);
  // Published blocks of group g's chain matching the prompt's first full blocks, at most `most`.
  std::vector<int32_t> walk(int32_t g, std::span<const int32_t> tokens, size_t most, uint64_t salt_key) const;
  std::span<const int32_t> stored_tokens(int32_t b) const {
    return {key_tokens_.data() + size_t(b) * block_size_, size_t(block_size_)};
  }
  // The published block with this exact key; -1 when none.
  int32_t find(BlockRef parent, std::span<const int32_t> tokens, uint64_t hash) const;
  bool is_current(BlockRef r) const {
    return r.block >= 0 && blocks_[r.block].published && blocks_[r.block].epoch == r.epoch;
  }
  Plan plan(std::span<const int32_t> tokens, bool use_cache, uint64_t salt_key) const;
  // Windowed groups' blocks an admission wants free beyond the plan's: a
  // window's worth (or the prompt's) each, so that the prompt can progress.
  int64_t headroom(const Plan& p, size_t n_tokens) const;

  int32_t take_free();          // precondition: n_free() > 0
  void acquire(int32_t b);      // one more reference to a used or cached-free block
  void release(int32_t b);
  void publish(int32_t b, BlockRef parent, std::span<const int32_t> tokens, uint64_t hash, bool windowed = false,
               std::string_view salt = {});
  // Publishes the blocks of one group's table that positions [0, n_computed) complete.
  void publish_done(std::vector<int32_t>& table, std::vector<BlockRef>& prefix, int32_t g,
                    std::span<const int32_t> tokens, int32_t n_computed, std::string_view salt);
  // Gives back the windowed groups' pages the window has passed.
  void drop_passed(SeqBlocks& s);
  void unpublish(int32_t b, bool quiet = false);
  void copy_on_write(std::vector<int32_t>& table, size_t index);
  // A block a sequence may not write in place: shared, or published (immutable).
  bool needs_copy(int32_t b) const { return blocks_[b].ref > 1 || blocks_[b].published; }
  void lru_push_back(int32_t b);
  void lru_remove(int32_t b);
  void check_seq_shape(const SeqBlocks& s, const char* what) const;

  int32_t block_size_;
  bool prefix_caching_;
  int32_t n_windowed_;
  int32_t window_;
  uint64_t seed_;
  uint64_t hash_mask_ = ~uint64_t(0);
  CopyBlockFn copy_block_;
  CopySlotsFn copy_slots_;
  std::vector<Block> blocks_;
  std::vector<int32_t> key_tokens_;  // block_size tokens per block, valid while published
  std::vector<int32_t> plain_free_;  // stack
  int32_t lru_head_ = -1, lru_tail_ = -1, n_cached_free_ = 0;
  std::unordered_map<uint64_t, int32_t> index_;  // key hash -> published block
  uint64_t queried_tokens_ = 0, hit_tokens_ = 0;
  bool recording_ = false;
  uint64_t root_hash_ = 0;
  std::vector<KvCacheEvent> events_;
  std::unordered_map<uint64_t, int32_t> content_refs_;  // content hash -> published blocks holding it
};

}  // namespace tandem

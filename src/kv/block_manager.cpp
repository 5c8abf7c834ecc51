#include "kv/block_manager.h"

#include <algorithm>
#include <random>
#include <stdexcept>

#include <fmt/format.h>

#include "core/error.h"
#include "kv/block_hash.h"
#include "kv/mix64.h"

namespace tandem {
namespace {

[[noreturn]] void broken(const std::string& what) { throw std::logic_error("BlockManager invariant: " + what); }

}  // namespace

BlockManager::BlockManager(int32_t n_blocks, int32_t block_size, bool enable_prefix_caching, int32_t n_windowed,
                           int32_t window)
    : block_size_(block_size), prefix_caching_(enable_prefix_caching), n_windowed_(n_windowed), window_(window) {
  if (n_blocks <= 0 || block_size <= 0)
    fail(ErrorKind::kInvalidArgument, "block manager needs a positive block count and size (got {} blocks of {})",
         n_blocks, block_size);
  if (n_windowed < 0 || (n_windowed > 0 && window <= 0))
    fail(ErrorKind::kInvalidArgument, "block manager: {} windowed groups need a positive window (got {})", n_windowed,
         window);
  // A per-process seed keeps a client from crafting prompts whose keys collide
  // with another's (which would only cost cache hits, as hits compare keys exactly).
  std::random_device rd;
  seed_ = (uint64_t(rd()) << 32) ^ rd();
  blocks_.resize(n_blocks);
  key_tokens_.resize(size_t(n_blocks) * block_size);
  plain_free_.reserve(n_blocks);
  for (int32_t b = n_blocks - 1; b >= 0; --b) plain_free_.push_back(b);
}

uint64_t BlockManager::key_hash(BlockRef parent, std::span<const int32_t> tokens) const {
  uint64_t h = fmix64(seed_ ^ (uint64_t(uint32_t(parent.block)) + 0x9e3779b97f4a7c15ULL));
  h = fmix64(h ^ parent.epoch);
  size_t i = 0;
  for (; i + 1 < tokens.size(); i += 2)
    h = fmix64(h ^ (uint64_t(uint32_t(tokens[i])) | uint64_t(uint32_t(tokens[i + 1])) << 32));
  if (i < tokens.size()) h = fmix64(h ^ uint64_t(uint32_t(tokens[i])) ^ (uint64_t(1) << 63));
  return h & hash_mask_;
}

int32_t BlockManager::find(BlockRef parent, std::span<const int32_t> tokens, uint64_t hash) const {
  auto it = index_.find(hash);
  if (it == index_.end()) return -1;
  const int32_t b = it->second;
  if (blocks_[b].parent != parent) return -1;
  auto stored = stored_tokens(b);
  if (!std::equal(stored.begin(), stored.end(), tokens.begin(), tokens.end())) return -1;
  return b;
}

uint64_t BlockManager::salt_key(std::string_view salt) {
  return salt.empty() ? 0 : root_block_hash(salt) | 1;
}

std::vector<int32_t> BlockManager::walk(int32_t g, std::span<const int32_t> tokens, size_t most,
                                        uint64_t salt_key) const {
  std::vector<int32_t> hits;
  const size_t bs = size_t(block_size_);
  BlockRef parent = root(g, salt_key);
  for (size_t i = 0; i < most && (i + 1) * bs <= tokens.size(); ++i) {
    auto t = tokens.subspan(i * bs, bs);
    const int32_t b = find(parent, t, key_hash(parent, t));
    if (b < 0) break;
    hits.push_back(b);
    parent = {b, blocks_[b].epoch};
  }
  return hits;
}

BlockManager::Plan BlockManager::plan(std::span<const int32_t> tokens, bool use_cache, uint64_t salt_key) const {
  Plan p;
  const size_t bs = size_t(block_size_);
  p.windowed_hits.resize(size_t(n_windowed_));
  if (prefix_caching_ && use_cache) {
    p.hits = walk(0, tokens, SIZE_MAX, salt_key);
    // A hit needs its K/V in every group.
    for (int32_t g = 0; g < n_windowed_ && !p.hits.empty(); ++g) {
      p.windowed_hits[g] = walk(g + 1, tokens, p.hits.size(), salt_key);
      p.hits.resize(p.windowed_hits[g].size());
    }
    for (auto& w : p.windowed_hits) w.resize(p.hits.size());
  }
  auto need = [&](bool full_hit) {
    int32_t n = blocks_for(int64_t(tokens.size())) - static_cast<int32_t>(p.hits.size());
    for (int32_t b : p.hits) n += blocks_[b].ref == 0;  // revived from the cached free list
    // Windowed groups take their hits inside the window and nothing more.
    const int32_t computed = static_cast<int32_t>(p.hits.size() * bs) - full_hit;
    for (const auto& w : p.windowed_hits)
      for (size_t i = size_t(first_kept_block(std::max(0, computed))); i < w.size(); ++i) n += blocks_[w[i]].ref == 0;
    return n + (full_hit ? 1 + n_windowed_ : 0);
  };
  p.full_hit = !tokens.empty() && p.hits.size() * bs == tokens.size();
  p.need = need(p.full_hit);
  if (p.full_hit && (p.need > n_free() || !copy_block_)) {
    // No room (or no way) to copy the last block: recompute all of it instead,
    // so a prompt that fits the pool is never refused for being cached.
    p.hits.pop_back();
    for (auto& w : p.windowed_hits) w.pop_back();
    p.full_hit = false;
    p.need = need(false);
  }
  return p;
}

int64_t BlockManager::headroom(const Plan& p, size_t n_tokens) const {
  if (n_windowed_ == 0) return 0;
  const int64_t left = int64_t(n_tokens) - int64_t(p.hits.size()) * block_size_;
  return int64_t(n_windowed_) * blocks_for(std::min<int64_t>(left, int64_t{window_} + block_size_));
}

bool BlockManager::can_allocate(std::span<const int32_t> tokens, bool use_cache, std::string_view salt) const {
  if (tokens.empty()) return false;
  const Plan p = plan(tokens, use_cache, salt_key(salt));
  return p.need + headroom(p, tokens.size()) <= n_free();
}

void BlockManager::allocate(SeqBlocks& s, std::span<const int32_t> tokens, bool use_cache, std::string_view salt) {
  if (!s.table.empty() || s.n_tokens != 0)
    fail(ErrorKind::kInvalidArgument, "allocate: the sequence already holds {} blocks ({} tokens)", s.table.size(),
         s.n_tokens);
  if (tokens.empty()) fail(ErrorKind::kInvalidArgument, "allocate: the token list is empty");
  const Plan p = plan(tokens, use_cache, salt_key(salt));
  if (const int64_t want = p.need + headroom(p, tokens.size()); want > n_free())
    fail(ErrorKind::kResource, "KV cache full: {} tokens need {} more blocks, {} free", tokens.size(), want, n_free());

  s = SeqBlocks{};
  s.salt = salt;
  s.windowed.resize(size_t(n_windowed_));
  const int32_t n_cached = static_cast<int32_t>(p.hits.size()) * block_size_ - (p.full_hit ? 1 : 0);
  // Hits first, so that taking fresh blocks cannot evict one of them.
  for (int32_t b : p.hits) {
    acquire(b);
    s.table.push_back(b);
    s.prefix.push_back({b, blocks_[b].epoch});
  }
  // A windowed group holds only its hits inside the window.
  const size_t kept = size_t(first_kept_block(std::max(0, n_cached)));
  for (int32_t g = 0; g < n_windowed_; ++g) {
    WindowedBlocks& w = s.windowed[g];
    for (size_t i = 0; i < p.windowed_hits[g].size(); ++i) {
      const int32_t b = p.windowed_hits[g][i];
      if (i >= kept) acquire(b);
      w.table.push_back(i >= kept ? b : -1);
      w.prefix.push_back({b, blocks_[b].epoch});
    }
  }
  const int32_t n_table = blocks_for(int64_t(tokens.size()));
  while (static_cast<int32_t>(s.table.size()) < n_table) s.table.push_back(take_free());
  s.n_tokens = static_cast<int32_t>(tokens.size());
  s.n_cached_tokens = n_cached;
  if (p.full_hit) {
    // The engine needs the last token's logits, so it recomputes that token,
    // writing its K/V: into a private copy of the cached block.
    s.prefix.pop_back();
    for (auto& w : s.windowed) w.prefix.pop_back();
    try {
      copy_on_write(s.table, s.table.size() - 1);
      for (auto& w : s.windowed) copy_on_write(w.table, w.table.size() - 1);
    } catch (...) {
      free(s);
      throw;
    }
  }
  s.n_computed = s.n_cached_tokens;
  if (!use_cache) return;  // not a lookup: the hit ratio leaves it out
  queried_tokens_ += tokens.size();
  hit_tokens_ += uint64_t(s.n_cached_tokens);
}

int32_t BlockManager::append_cost(const SeqBlocks& s, int32_t end) const {
  if (end <= s.n_computed) return 0;
  const int64_t n_table = int64_t(s.table.size());
  const int64_t want = blocks_for(end);
  int64_t cost = std::max<int64_t>(0, want - n_table);
  for (int64_t i = s.n_computed / block_size_; i < std::min(want, n_table); ++i) cost += needs_copy(s.table[i]);
  for (const WindowedBlocks& w : s.windowed) {
    const int64_t n_w = int64_t(w.table.size());
    cost += std::max<int64_t>(0, want - n_w);
    for (int64_t i = s.n_computed / block_size_; i < std::min(want, n_w); ++i) cost += needs_copy(w.table[i]);
  }
  return static_cast<int32_t>(std::min<int64_t>(cost, INT32_MAX));
}

void BlockManager::append(SeqBlocks& s, int32_t end) {
  if (end <= s.n_computed) return;
  check_seq_shape(s, "append");
  const int32_t cost = append_cost(s, end);
  if (cost > n_free())
    fail(ErrorKind::kResource, "KV cache full: growing a sequence to {} tokens needs {} blocks, {} free", end, cost,
         n_free());
  const size_t want = size_t(blocks_for(end));
  const size_t first = size_t(s.n_computed / block_size_);
  const size_t last = std::min(want, s.table.size());
  auto own = [&](std::vector<int32_t>& table, size_t last) {
    for (size_t i = first; i < last; ++i) {
      if (!needs_copy(table[i])) continue;
      if (!copy_block_) fail(ErrorKind::kInvalidArgument, "append: writing a shared block needs a block copy callback");
      copy_on_write(table, i);
    }
    while (table.size() < want) table.push_back(take_free());
  };
  own(s.table, last);
  for (WindowedBlocks& w : s.windowed) own(w.table, std::min(want, w.table.size()));
  s.n_tokens = std::max(s.n_tokens, end);
}

int32_t BlockManager::restore_cost(const SeqBlocks& s, int32_t n) const {
  const size_t kept = size_t(first_kept_block(n)), want = size_t(blocks_for(n));
  int64_t cost = 0;
  for (const WindowedBlocks& w : s.windowed) cost += int64_t(want) - int64_t(std::min(want, std::max(kept, w.table.size())));
  return static_cast<int32_t>(std::min<int64_t>(cost, INT32_MAX));
}

void BlockManager::restore(SeqBlocks& s, int32_t n) {
  check_seq_shape(s, "restore");
  if (n < s.n_computed || n > s.n_tokens)
    fail(ErrorKind::kInvalidArgument, "restore: {} positions of a sequence with {} slots and {} computed", n,
         s.n_tokens, s.n_computed);
  const int32_t cost = restore_cost(s, n);
  if (cost > n_free())
    fail(ErrorKind::kResource, "KV cache full: restoring {} positions needs {} blocks, {} free", n, cost, n_free());
  const size_t kept = size_t(first_kept_block(n)), want = size_t(blocks_for(n));
  for (WindowedBlocks& w : s.windowed)
    while (w.table.size() < want) w.table.push_back(w.table.size() >= kept ? take_free() : -1);
}

void BlockManager::commit(SeqBlocks& s, std::span<const int32_t> tokens, int32_t n_computed) {
  if (n_computed < s.n_computed || n_computed > s.n_tokens || size_t(n_computed) > tokens.size())
    fail(ErrorKind::kInvalidArgument,
         "commit: {} computed tokens for a sequence with {} slots, {} already computed and {} tokens", n_computed,
         s.n_tokens, s.n_computed, tokens.size());
  check_seq_shape(s, "commit");
  for (const WindowedBlocks& w : s.windowed)
    if (int64_t(w.table.size()) < blocks_for(n_computed))
      fail(ErrorKind::kInvalidArgument, "commit: {} computed tokens, but a windowed group has {} blocks", n_computed,
           w.table.size());
  s.n_computed = n_computed;
  if (s.detached) {
    s.prefix.resize(size_t(n_computed / block_size_));
    return;
  }
  publish_done(s.table, s.prefix, 0, tokens, n_computed, s.salt);
  for (int32_t g = 0; g < n_windowed_; ++g)
    publish_done(s.windowed[g].table, s.windowed[g].prefix, g + 1, tokens, n_computed, s.salt);
  drop_passed(s);
}

void BlockManager::publish_done(std::vector<int32_t>& table, std::vector<BlockRef>& prefix, int32_t g,
                                std::span<const int32_t> tokens, int32_t n_computed, std::string_view salt) {
  const size_t bs = size_t(block_size_);
  const size_t n_full = size_t(n_computed) / bs;
  const uint64_t sk = prefix.empty() ? salt_key(salt) : 0;
  while (prefix.size() < n_full) {
    const size_t i = prefix.size();
    BlockRef ref;  // none: this content is not reachable through the cache
    const BlockRef parent = i == 0 ? root(g, sk) : prefix[i - 1];
    // A page already given back (its window passed in this same commit, or
    // before it was ever published) is not published.
    if (prefix_caching_ && (i == 0 || is_current(parent)) && table[i] >= 0) {
      auto t = tokens.subspan(i * bs, bs);
      const uint64_t h = key_hash(parent, t);
      const int32_t found = find(parent, t, h);
      if (found >= 0) {
        ref = {found, blocks_[found].epoch};  // ours (a hit) or a concurrent duplicate
      } else if (!index_.contains(h) && !blocks_[table[i]].published) {
        publish(table[i], parent, t, h, g > 0, i == 0 ? salt : std::string_view());
        ref = {table[i], blocks_[table[i]].epoch};
      }
      // else a different key holds this hash: the block stays private.
    }
    prefix.push_back(ref);
  }
}

void BlockManager::drop_passed(SeqBlocks& s) {
  const size_t kept = size_t(first_kept_block(s.n_computed));
  for (WindowedBlocks& w : s.windowed)
    for (size_t i = 0; i < std::min(kept, w.table.size()); ++i)
      if (w.table[i] >= 0) {
        release(w.table[i]);
        w.table[i] = -1;
      }
}

int32_t BlockManager::evict_cost(const SeqBlocks& s, int32_t from) const {
  int32_t cost = 0;
  for (int32_t i = 0; i < blocks_for(from) && i < int32_t(s.table.size()); ++i) cost += needs_copy(s.table[i]);
  return cost;
}

void BlockManager::evict(SeqBlocks& s, int32_t from, int32_t count) {
  check_seq_shape(s, "evict");
  const int32_t bs = block_size_;
  if (n_windowed_ > 0 || from < 0 || count <= 0 || count % bs != 0 || from + count > s.n_computed)
    fail(ErrorKind::kInvalidArgument, "evict: {} positions after {} of a sequence with {} computed (blocks of {})",
         count, from, s.n_computed, bs);
  const size_t b0 = size_t(from / bs), k = size_t(count / bs);
  const int32_t off = from % bs;
  if (off != 0 && !copy_slots_) fail(ErrorKind::kInvalidArgument, "evict: needs a slot copy callback");
  if (evict_cost(s, from) > n_free())
    fail(ErrorKind::kResource, "KV cache full: evicting needs {} blocks, {} free", evict_cost(s, from), n_free());
  for (size_t i = 0; i < size_t(blocks_for(from)); ++i)
    if (needs_copy(s.table[i])) copy_on_write(s.table, i);
  // With the kept head ending inside block b0, the positions after the gap
  // that land in b0 come from block b0 + k (the same slots: count is whole blocks).
  size_t first = b0;
  if (off != 0) {
    copy_slots_(s.table[b0 + k], s.table[b0], off, bs);
    first = b0 + 1;
  }
  for (size_t i = first; i < first + k; ++i) release(s.table[i]);
  s.table.erase(s.table.begin() + ptrdiff_t(first), s.table.begin() + ptrdiff_t(first + k));
  s.n_tokens -= count;
  s.n_computed -= count;
  s.n_cached_tokens = std::min(s.n_cached_tokens, s.n_computed);
  s.detached = true;
  s.prefix.assign(size_t(s.n_computed / bs), BlockRef{});
}

SeqBlocks BlockManager::fork(const SeqBlocks& s) {
  check_seq_shape(s, "fork");
  for (int32_t b : s.table) acquire(b);
  for (const WindowedBlocks& w : s.windowed)
    for (int32_t b : w.table)
      if (b >= 0) acquire(b);
  return s;
}

void BlockManager::truncate(SeqBlocks& s, int32_t n_tokens) {
  check_seq_shape(s, "truncate");
  if (n_tokens < s.n_computed || n_tokens > s.n_tokens)
    fail(ErrorKind::kInvalidArgument, "truncate: to {} tokens a sequence with {} slots and {} computed", n_tokens,
         s.n_tokens, s.n_computed);
  const size_t keep = static_cast<size_t>(blocks_for(n_tokens));
  while (s.table.size() > keep) {
    release(s.table.back());
    s.table.pop_back();
  }
  for (WindowedBlocks& w : s.windowed)
    while (w.table.size() > keep) {
      if (w.table.back() >= 0) release(w.table.back());
      w.table.pop_back();
    }
  s.n_tokens = n_tokens;
}

void BlockManager::rollback(SeqBlocks& s, int32_t n) {
  check_seq_shape(s, "rollback");
  if (n < 0 || n > s.n_computed)
    fail(ErrorKind::kInvalidArgument, "rollback: to {} of {} computed positions", n, s.n_computed);
  const size_t whole = static_cast<size_t>(n / block_size_);
  for (size_t i = whole; i < s.prefix.size(); ++i)
    if (s.prefix[i].block >= 0 || blocks_[s.table[i]].published)
      fail(ErrorKind::kInvalidArgument, "rollback: block {} of the sequence is published", i);
  if (!s.windowed.empty() && first_kept_block(s.n_computed) > 0)
    fail(ErrorKind::kInvalidArgument, "rollback: a windowed group has given back pages the positions need");
  for (WindowedBlocks& w : s.windowed) {
    for (size_t i = whole; i < w.prefix.size(); ++i)
      if (w.prefix[i].block >= 0 || (w.table[i] >= 0 && blocks_[w.table[i]].published))
        fail(ErrorKind::kInvalidArgument, "rollback: block {} of a windowed group is published", i);
    w.prefix.resize(std::min(w.prefix.size(), whole));
  }
  s.prefix.resize(std::min(s.prefix.size(), whole));
  s.n_computed = n;
  truncate(s, n);
}

void BlockManager::free(SeqBlocks& s) {
  check_seq_shape(s, "free");
  // Tail first: the cached list then evicts a prefix's later blocks before
  // its earlier ones, which every longer match depends on.
  for (auto wt = s.windowed.rbegin(); wt != s.windowed.rend(); ++wt)
    for (auto it = wt->table.rbegin(); it != wt->table.rend(); ++it)
      if (*it >= 0) release(*it);
  for (auto it = s.table.rbegin(); it != s.table.rend(); ++it) release(*it);
  s = SeqBlocks{};
}

int32_t BlockManager::cached_blocks(std::span<const int32_t> tokens, std::string_view salt) const {
  if (!prefix_caching_) return 0;
  const uint64_t sk = salt_key(salt);
  std::vector<int32_t> hits = walk(0, tokens, SIZE_MAX, sk);
  size_t n = hits.size();
  for (int32_t g = 0; g < n_windowed_ && n > 0; ++g) n = walk(g + 1, tokens, n, sk).size();
  return static_cast<int32_t>(n);
}

int32_t BlockManager::import_blocks(std::span<const int32_t> tokens, std::string_view salt, int32_t first,
                                    int32_t count, const FillBlockFn& fill) {
  if (!prefix_caching_ || count <= 0) return 0;
  const uint64_t sk = salt_key(salt);
  const int32_t groups = 1 + n_windowed_;
  // Each group's cached chain (a group may hold more than the shortest:
  // windowed pages are given back, and reused, before group 0's), held
  // with the imported blocks so that taking a fresh page never evicts them.
  std::vector<std::vector<int32_t>> held(static_cast<size_t>(groups));
  size_t shortest = SIZE_MAX;
  for (int32_t g = 0; g < groups; ++g) {
    held[g] = walk(g, tokens, SIZE_MAX, sk);
    shortest = std::min(shortest, held[g].size());
  }
  if (first < 0 || size_t(first) != shortest)
    fail(ErrorKind::kInvalidArgument, "import_blocks: block {} does not follow the prompt's {} cached blocks", first,
         shortest);
  for (const auto& h : held)
    for (int32_t b : h) acquire(b);
  auto release_held = [&] {
    // Tail first, windowed groups first, as free() does: the cached list
    // gives up a prefix's later blocks before its earlier ones.
    for (auto h = held.rbegin(); h != held.rend(); ++h)
      for (auto it = h->rbegin(); it != h->rend(); ++it) release(*it);
  };
  const size_t bs = size_t(block_size_);
  int32_t done = 0;
  std::vector<int32_t> pages(static_cast<size_t>(groups));
  std::vector<BlockRef> parents(static_cast<size_t>(groups));
  for (size_t i = size_t(first); done < count && (i + 1) * bs <= tokens.size(); ++i, ++done) {
    auto t = tokens.subspan(i * bs, bs);
    // A page for each group that lacks block i; -1 for those that hold it.
    int32_t need = 0;
    bool free_key = true;
    for (int32_t g = 0; g < groups; ++g) {
      if (i < held[g].size()) continue;
      ++need;
      parents[g] = i == 0 ? root(g, sk) : BlockRef{held[g][i - 1], blocks_[held[g][i - 1]].epoch};
      free_key = free_key && !index_.contains(key_hash(parents[g], t));
    }
    // Another key holding this hash stays (as in commit), and the pool keeps
    // what it needs.
    if (!free_key || n_free() < need) break;
    for (int32_t g = 0; g < groups; ++g) pages[g] = i < held[g].size() ? -1 : take_free();
    bool filled = false;
    try {
      filled = fill(static_cast<int32_t>(i), pages);
    } catch (...) {
      for (int32_t p : pages)
        if (p >= 0) release(p);
      release_held();
      throw;
    }
    if (!filled) {
      for (int32_t p : pages)
        if (p >= 0) release(p);
      break;
    }
    for (int32_t g = 0; g < groups; ++g) {
      if (pages[g] < 0) continue;
      publish(pages[g], parents[g], t, key_hash(parents[g], t), g > 0, i == 0 ? salt : std::string_view());
      held[g].push_back(pages[g]);
    }
  }
  release_held();
  return done;
}

int32_t BlockManager::clear_prefix_cache() {
  // Every published block free: one AllBlocksCleared says it all.
  const bool all = recording_ && int64_t(index_.size()) == n_cached_free_ && n_cached_free_ > 0;
  int32_t n = 0;
  while (lru_head_ >= 0) {
    const int32_t b = lru_head_;
    lru_remove(b);
    unpublish(b, all);
    blocks_[b].state = State::kPlainFree;
    plain_free_.push_back(b);
    ++n;
  }
  if (all) {
    content_refs_.clear();
    events_.emplace_back().kind = KvCacheEvent::Kind::kCleared;
  }
  return n;
}

void BlockManager::record_events(std::string_view hash_seed) {
  if (recording_) return;
  recording_ = true;
  root_hash_ = root_block_hash(hash_seed);
  // Blocks published before now are announced as if just stored, parents first.
  std::vector<int32_t> order;
  for (int32_t b = 0; b < n_blocks(); ++b)
    if (blocks_[b].published && !blocks_[b].windowed) order.push_back(b);
  std::vector<bool> done(blocks_.size());
  for (size_t k = 0; k < order.size(); ++k) {
    // Walk up to the first ancestor not yet announced; announce down from there.
    std::vector<int32_t> chain;
    for (int32_t b = order[k]; b >= 0 && !done[b] && blocks_[b].published;) {
      chain.push_back(b);
      const BlockRef p = blocks_[b].parent;
      b = is_current(p) ? p.block : -1;
    }
    for (auto it = chain.rbegin(); it != chain.rend(); ++it) {
      const Block& blk = blocks_[*it];
      const bool has_parent = is_current(blk.parent);
      const uint64_t parent = has_parent ? blocks_[blk.parent.block].content : 0;
      blocks_[*it].content = content_hash(has_parent, parent, stored_tokens(*it), blk.salt);
      done[*it] = true;
      if (content_refs_[blocks_[*it].content]++ == 0) {
        auto t = stored_tokens(*it);
        events_.push_back({KvCacheEvent::Kind::kStored, blocks_[*it].content, has_parent, parent, {t.begin(), t.end()}});
      }
    }
  }
}

std::vector<uint64_t> BlockManager::content_hashes() const {
  std::vector<uint64_t> out;
  out.reserve(content_refs_.size());
  for (const auto& [h, n] : content_refs_) out.push_back(h);
  std::sort(out.begin(), out.end());
  return out;
}

uint64_t BlockManager::content_hash(bool has_parent, uint64_t parent, std::span<const int32_t> tokens,
                                    std::string_view salt) const {
  // As vLLM: the salt is an extra key of the prompt's first block alone; the chain carries it on.
  return chained_block_hash(has_parent ? parent : root_hash_, tokens, has_parent ? std::string_view() : salt);
}

BlockStats BlockManager::stats() const {
  BlockStats st;
  st.total = n_blocks();
  st.free = n_free();
  st.used = st.total - st.free;
  st.cached_free = n_cached_free_;
  st.published = static_cast<int64_t>(index_.size());
  st.queried_tokens = queried_tokens_;
  st.hit_tokens = hit_tokens_;
  return st;
}

// ---- block lists ----

int32_t BlockManager::take_free() {
  int32_t b;
  if (!plain_free_.empty()) {
    b = plain_free_.back();
    plain_free_.pop_back();
  } else {
    b = lru_head_;
    lru_remove(b);
    unpublish(b);
  }
  Block& blk = blocks_[b];
  blk.state = State::kUsed;
  blk.ref = 1;
  ++blk.epoch;  // whatever pointed at its old content no longer matches
  return b;
}

void BlockManager::acquire(int32_t b) {
  Block& blk = blocks_[b];
  if (blk.ref == 0) {
    lru_remove(b);  // only published (cached) blocks are reachable while free
    blk.state = State::kUsed;
  }
  ++blk.ref;
}

void BlockManager::release(int32_t b) {
  Block& blk = blocks_[b];
  if (--blk.ref > 0) return;
  if (blk.published) {
    blk.state = State::kCachedFree;
    lru_push_back(b);
  } else {
    blk.state = State::kPlainFree;
    plain_free_.push_back(b);
  }
}

void BlockManager::copy_on_write(std::vector<int32_t>& table, size_t index) {
  const int32_t old = table[index];
  const int32_t fresh = take_free();
  try {
    copy_block_(old, fresh);
  } catch (...) {
    release(fresh);
    throw;
  }
  table[index] = fresh;
  release(old);
}

void BlockManager::publish(int32_t b, BlockRef parent, std::span<const int32_t> tokens, uint64_t hash,
                           bool windowed, std::string_view salt) {
  Block& blk = blocks_[b];
  std::copy(tokens.begin(), tokens.end(), key_tokens_.begin() + ptrdiff_t(b) * block_size_);
  blk.published = true;
  blk.hash = hash;
  blk.parent = parent;
  blk.salt = salt;
  blk.windowed = windowed;
  index_[hash] = b;
  if (!recording_ || windowed) return;
  // The parent is current when a block is published (commit checks it).
  const bool has_parent = parent.block >= 0;
  const uint64_t parent_content = has_parent ? blocks_[parent.block].content : 0;
  blk.content = content_hash(has_parent, parent_content, tokens, salt);
  if (content_refs_[blk.content]++ == 0)
    events_.push_back({KvCacheEvent::Kind::kStored, blk.content, has_parent, parent_content,
                       {tokens.begin(), tokens.end()}});
}

void BlockManager::unpublish(int32_t b, bool quiet) {
  Block& blk = blocks_[b];
  if (!blk.published) return;
  index_.erase(blk.hash);
  blk.published = false;
  blk.parent = {};
  blk.salt.clear();
  // Every group 0 block is announced while recording (record_events
  // announces those published before).
  if (!recording_ || quiet || blk.windowed) return;
  auto it = content_refs_.find(blk.content);
  if (it != content_refs_.end() && --it->second == 0) {
    content_refs_.erase(it);
    KvCacheEvent& e = events_.emplace_back();
    e.kind = KvCacheEvent::Kind::kRemoved;
    e.hash = blk.content;
  }
}

void BlockManager::lru_push_back(int32_t b) {
  Block& blk = blocks_[b];
  blk.lru_prev = lru_tail_;
  blk.lru_next = -1;
  if (lru_tail_ >= 0)
    blocks_[lru_tail_].lru_next = b;
  else
    lru_head_ = b;
  lru_tail_ = b;
  ++n_cached_free_;
}

void BlockManager::lru_remove(int32_t b) {
  Block& blk = blocks_[b];
  if (blk.lru_prev >= 0)
    blocks_[blk.lru_prev].lru_next = blk.lru_next;
  else
    lru_head_ = blk.lru_next;
  if (blk.lru_next >= 0)
    blocks_[blk.lru_next].lru_prev = blk.lru_prev;
  else
    lru_tail_ = blk.lru_prev;
  blk.lru_prev = blk.lru_next = -1;
  --n_cached_free_;
}

// Guards the entry points that walk a caller's table against one that is not
// ours (never allocated, or already freed elsewhere) before anything changes.
void BlockManager::check_seq_shape(const SeqBlocks& s, const char* what) const {
  if (s.n_tokens < 0 || s.n_computed < 0 || s.n_computed > s.n_tokens ||
      int64_t(s.table.size()) != blocks_for(s.n_tokens) || s.prefix.size() > s.table.size())
    fail(ErrorKind::kInvalidArgument, "{}: inconsistent sequence ({} blocks for {} tokens, {} computed)", what,
         s.table.size(), s.n_tokens, s.n_computed);
  for (int32_t b : s.table)
    if (b < 0 || b >= n_blocks() || blocks_[b].ref <= 0)
      fail(ErrorKind::kInvalidArgument, "{}: block {} is not in use", what, b);
  if (s.windowed.size() != (s.table.empty() ? s.windowed.size() : size_t(n_windowed_)))
    fail(ErrorKind::kInvalidArgument, "{}: the sequence has {} windowed tables, the pool {} groups", what,
         s.windowed.size(), n_windowed_);
  for (const WindowedBlocks& w : s.windowed) {
    if (w.table.size() > s.table.size() || w.prefix.size() > w.table.size())
      fail(ErrorKind::kInvalidArgument, "{}: a windowed table of {} blocks for {} tokens", what, w.table.size(),
           s.n_tokens);
    for (int32_t b : w.table)
      if (b < -1 || b >= n_blocks() || (b >= 0 && blocks_[b].ref <= 0))
        fail(ErrorKind::kInvalidArgument, "{}: block {} is not in use", what, b);
  }
}

// ---- invariants ----

void BlockManager::check_invariants() const {
  const int32_t n = n_blocks();
  int32_t n_plain = 0, n_cached = 0, n_published = 0;
  for (int32_t b = 0; b < n; ++b) {
    const Block& blk = blocks_[b];
    switch (blk.state) {
      case State::kUsed:
        if (blk.ref <= 0) broken(fmt::format("block {} is used with ref count {}", b, blk.ref));
        break;
      case State::kPlainFree:
        ++n_plain;
        if (blk.ref != 0 || blk.published) broken(fmt::format("plain free block {} has ref {} or is published", b, blk.ref));
        break;
      case State::kCachedFree:
        ++n_cached;
        if (blk.ref != 0 || !blk.published) broken(fmt::format("cached free block {} has ref {} or is unpublished", b, blk.ref));
        break;
    }
    if (blk.published) {
      ++n_published;
      auto it = index_.find(blk.hash);
      if (it == index_.end() || it->second != b) broken(fmt::format("published block {} is not indexed", b));
      if (key_hash(blk.parent, stored_tokens(b)) != blk.hash) broken(fmt::format("block {} key does not hash to its entry", b));
      if (blk.parent.block == b) broken(fmt::format("block {} is its own parent", b));
    }
  }
  std::vector<uint8_t> seen(size_t(n), 0);
  for (int32_t b : plain_free_) {
    if (b < 0 || b >= n || seen[b]) broken(fmt::format("plain free list holds block {} twice or out of range", b));
    seen[b] = 1;
    if (blocks_[b].state != State::kPlainFree) broken(fmt::format("plain free list holds block {} in another state", b));
  }
  if (int32_t(plain_free_.size()) != n_plain) broken("plain free list size differs from plain free blocks");
  int32_t walked = 0, prev = -1;
  for (int32_t b = lru_head_; b >= 0; prev = b, b = blocks_[b].lru_next) {
    if (b >= n || seen[b] || ++walked > n) broken(fmt::format("cached free list loops or holds block {} twice", b));
    seen[b] = 1;
    if (blocks_[b].state != State::kCachedFree) broken(fmt::format("cached free list holds block {} in another state", b));
    if (blocks_[b].lru_prev != prev) broken(fmt::format("cached free list back link of block {} is wrong", b));
  }
  if (prev != lru_tail_) broken("cached free list tail is wrong");
  if (walked != n_cached || n_cached_free_ != n_cached) broken("cached free count differs from cached free blocks");
  if (int32_t(index_.size()) != n_published) broken("index holds entries for unpublished blocks");
  for (const auto& [h, b] : index_)
    if (b < 0 || b >= n || blocks_[b].hash != h) broken(fmt::format("index entry points at block {} of another hash", b));
  if (!prefix_caching_ && n_published) broken("blocks published with prefix caching off");
  if (recording_) {  // each content hash counted once per published block holding it
    std::unordered_map<uint64_t, int32_t> refs;
    for (int32_t b = 0; b < n; ++b)
      if (blocks_[b].published && !blocks_[b].windowed) ++refs[blocks_[b].content];
    if (refs != content_refs_) broken("content hash counts differ from the published blocks");
  }
}

void BlockManager::check_invariants(std::span<const LiveSeq> live) const {
  check_invariants();
  const int32_t n = n_blocks();
  const size_t bs = size_t(block_size_);
  std::vector<int32_t> holders(size_t(n), 0);
  std::vector<size_t> stamp(size_t(n), 0);
  auto same_tokens = [&](int32_t b, std::span<const int32_t> tokens, size_t i) {
    auto stored = stored_tokens(b);
    return std::equal(stored.begin(), stored.end(), tokens.begin() + ptrdiff_t(i * bs));
  };
  for (size_t k = 0; k < live.size(); ++k) {
    const SeqBlocks& s = *live[k].seq;
    const auto tokens = live[k].tokens;
    if (s.n_tokens < 0 || int64_t(s.table.size()) != blocks_for(s.n_tokens))
      broken(fmt::format("sequence {} has {} blocks for {} tokens", k, s.table.size(), s.n_tokens));
    if (s.n_cached_tokens < 0 || s.n_cached_tokens > s.n_computed || s.n_computed > s.n_tokens ||
        size_t(s.n_computed) > tokens.size())
      broken(fmt::format("sequence {}: cached {}, computed {}, slots {}, tokens {}", k, s.n_cached_tokens,
                         s.n_computed, s.n_tokens, tokens.size()));
    if (s.prefix.size() != size_t(s.n_computed) / bs)
      broken(fmt::format("sequence {} has {} prefix entries for {} computed tokens", k, s.prefix.size(), s.n_computed));
    // One group's table and prefix entries: each block held once, a
    // windowed group's given back exactly before its window, and published
    // content (unless the positions moved: detached) under this prefix.
    auto check_table = [&](const std::vector<int32_t>& table, const std::vector<BlockRef>& prefix, int32_t g,
                           size_t kept) {
      for (size_t i = 0; i < table.size(); ++i) {
        const int32_t b = table[i];
        if (g > 0 && (i < kept) != (b < 0))
          broken(fmt::format("sequence {} group {} block {}: {} though the window starts at block {}", k, g, i,
                             b < 0 ? "given back" : "held", kept));
        if (g > 0 && b < 0) continue;
        if (b < 0 || b >= n || stamp[b] == k + 1)
          broken(fmt::format("sequence {} holds block {} twice or out of range", k, b));
        stamp[b] = k + 1;
        ++holders[b];
        const Block& blk = blocks_[b];
        if (!blk.published || s.detached) continue;
        if (i >= prefix.size())
          broken(fmt::format("sequence {} holds published block {} beyond its computed tokens", k, b));
        if (!same_tokens(b, tokens, i)) broken(fmt::format("sequence {} group {} block {}: cached tokens differ", k, g, b));
        if (blk.parent != (i == 0 ? root(g, salt_key(s.salt)) : prefix[i - 1]))
          broken(fmt::format("sequence {} group {} block {}: published under another prefix", k, g, b));
      }
      for (size_t i = 0; i < prefix.size(); ++i) {
        if (!is_current(prefix[i])) continue;
        const int32_t b = prefix[i].block;
        if (!same_tokens(b, tokens, i)) broken(fmt::format("sequence {} group {} prefix block {}: tokens differ", k, g, i));
        if (blocks_[b].parent != (i == 0 ? root(g, salt_key(s.salt)) : prefix[i - 1]))
          broken(fmt::format("sequence {} group {} prefix block {}: another parent", k, g, i));
      }
    };
    check_table(s.table, s.prefix, 0, 0);
    if (!s.table.empty() && s.windowed.size() != size_t(n_windowed_))
      broken(fmt::format("sequence {} has {} windowed tables for {} groups", k, s.windowed.size(), n_windowed_));
    for (size_t g = 0; g < s.windowed.size(); ++g) {
      const WindowedBlocks& w = s.windowed[g];
      if (w.prefix.size() != s.prefix.size() || w.table.size() > s.table.size() ||
          (s.n_computed > 0 && int64_t(w.table.size()) < blocks_for(s.n_computed)))
        broken(fmt::format("sequence {} group {}: {} blocks and {} prefix entries for {} computed of {} tokens", k,
                           g + 1, w.table.size(), w.prefix.size(), s.n_computed, s.n_tokens));
      check_table(w.table, w.prefix, int32_t(g) + 1, size_t(first_kept_block(s.n_computed)));
    }
  }
  for (int32_t b = 0; b < n; ++b)
    if (holders[b] != blocks_[b].ref)
      broken(fmt::format("block {} has ref count {} but {} holders", b, blocks_[b].ref, holders[b]));
}

}  // namespace tandem

// A KV store that outlives the process (serve/run/bench --kv-store DIR):
// full prefix blocks as files named by their content hash
// (kv/block_hash.h, seed ""), in the block format of kv/block_format.h.
//
// - Written when a block enters the prefix cache (after the step's commit):
//   the engine's thread copies the block's pages out, a writer thread
//   encodes and writes them to a temporary name and renames it into place,
//   so several instances can share the folder and a reader never sees half
//   a file. A block already known to be on disk is not written again.
// - Read at intake, when a new prompt's full blocks run past what the
//   in-memory prefix cache holds: each next block's file is read, checked
//   (checksum, model, format, and that it is the block this prompt asks
//   for), written into free pages and published in the prefix cache, so the
//   scheduler's admission finds it as a hit. The first block missing or
//   refused ends the walk; a refused one is warned about and recomputed
//   (then written again), never used.
// - Least recently used files (written or read) go beyond the size.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

#include "engine/metrics.h"
#include "kv/block_format.h"

namespace tandem {

class BlockManager;
class Executor;
struct Sequence;

class KvStore {
 public:
  // Creates the folder if needed and takes stock of its files (their
  // modification times order them for eviction). Throws kIo when the folder
  // cannot be made, kInvalidArgument for a size <= 0.
  KvStore(std::string dir, int64_t max_bytes, const KvBlockLayout& layout, BlockManager& blocks, Executor& exec);
  ~KvStore();  // writes what is queued, then stops the writer
  KvStore(const KvStore&) = delete;
  KvStore& operator=(const KvStore&) = delete;

  // Intake, on the engine's thread: the prompt's full blocks past the prefix
  // cache's, from files into the cache. Returns how many it loaded.
  int32_t load(std::span<const int32_t> prompt, std::string_view salt);
  // After a commit, on the engine's thread: the sequence's cached full
  // blocks from index `from` on (those the commit published) to files.
  void save(const Sequence& s, int32_t from);
  // Waits until every queued block is written (tests, shutdown).
  void flush();
  KvStoreStats stats() const;

 private:
  struct Pending {
    KvBlockKey key;
    std::vector<std::byte> payload;
  };
  struct FileInfo {
    int64_t bytes = 0;
    uint64_t used = 0;  // recency: higher is more recent
  };
  std::string path_of(uint64_t hash) const;
  // Reads and checks block `index` of the prompt; empty when missing or refused.
  bool read_block(const KvBlockKey& want, std::vector<std::byte>& payload);
  void writer_loop();
  void write_one(Pending& p);
  void evict_locked();  // under mu_

  const std::string dir_;
  const int64_t max_bytes_;
  const KvBlockLayout layout_;
  BlockManager& blocks_;
  Executor& exec_;

  mutable std::mutex mu_;
  std::condition_variable wake_, idle_;
  std::deque<Pending> queue_;
  size_t queued_bytes_ = 0;
  bool writing_ = false, stop_ = false;
  std::unordered_map<uint64_t, FileInfo> files_;
  uint64_t clock_ = 0;
  KvStoreStats stats_;
  std::thread writer_;
};

}  // namespace tandem

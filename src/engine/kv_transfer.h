// A prompt's K/V leaving one engine and entering another (prefill and
// decode instances): the engine's side of the transfer. What moves is a run
// of the prompt's full blocks, each as the executor saves it (every layer of
// the block's positions) with its tokens; how it travels between processes is
// the server's business (server/kv_transfer.h).
//
// Export (the prefill instance): when a request that asked for it ends, its
// prompt's full computed blocks are copied out to the request's callback, on
// the engine's thread, before the blocks go back to the pool. A copy rather
// than pinned pool blocks: the pool never waits on a decode instance that is
// slow or gone, and the copy is a memcpy (18 MB per 1,000 tokens of Gemma 3
// 270M's f16 cache).
//
// Import (the decode instance): a request carrying blocks has them written
// into pool blocks and published in the prefix cache under its own tokens at
// intake, just before it is scheduled; admission then finds them as prefix
// hits, and the tail that is not a full block is computed as usual, so the
// output is the one the instance would give had it computed the prompt itself.
#pragma once

#include <cstddef>
#include <climits>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace tandem {

class BlockManager;
class Executor;

// Blocks [first, first + n) of a prompt: n * block_size tokens and
// n * block_bytes bytes, block after block.
struct KvBlockRun {
  int32_t first = 0;
  int32_t block_size = 0;
  size_t block_bytes = 0;
  std::vector<int32_t> tokens;
  std::vector<std::byte> data;
  int32_t n_blocks() const { return block_size > 0 ? static_cast<int32_t>(tokens.size()) / block_size : 0; }
};

// What an import did.
struct KvImportResult {
  int32_t loaded = 0;   // blocks written into the pool and published
  int32_t cached = 0;   // of the prompt's leading blocks, already in the prefix cache
  std::string skipped;  // why nothing (more) was imported: the prompt is then computed here
  double seconds = 0;   // writing the blocks into the pool (the engine's thread)
};

// Whether this pool's blocks can move: one page per block holding every
// layer (no sliding-window groups). "" when they can, else why not.
std::string kv_transfer_unsupported(const BlockManager& blocks);

// The prompt's full computed blocks of `table` (blocks [0, n_full)) as a run.
KvBlockRun export_blocks(Executor& exec, std::span<const int32_t> table, std::span<const int32_t> prompt,
                         int32_t n_full, int32_t block_size);

// Writes `run` into pool blocks and publishes them as the blocks of
// `prompt` (under `salt`), through BlockManager::import_blocks. Throws kInvalidArgument when the run does not fit
// the pool (block size, block bytes) or holds other tokens than the prompt;
// blocks the cache already holds are kept, and a run that would leave a gap
// after them is not used (skipped says so).
// At most `max_blocks` are written per call: a caller spreading a long run
// over several steps calls again, and the blocks written before are then
// counted as cached.
KvImportResult import_blocks(BlockManager& blocks, Executor& exec, const KvBlockRun& run,
                             std::span<const int32_t> prompt, const std::string& salt,
                             int32_t max_blocks = INT32_MAX);

}  // namespace tandem

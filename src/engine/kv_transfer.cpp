#include "engine/kv_transfer.h"

#include <algorithm>
#include <chrono>

#include "core/error.h"
#include "kv/block_manager.h"
#include "model/executor.h"

namespace tandem {

std::string kv_transfer_unsupported(const BlockManager& blocks) {
  if (blocks.n_windowed() > 0)
    return "the KV pool keeps sliding-window layers on pages of their own; KV transfer needs every layer's "
           "blocks (--swa-full)";
  if (!blocks.prefix_caching()) return "prefix caching is off; KV transfer publishes blocks through it";
  return "";
}

KvBlockRun export_blocks(Executor& exec, std::span<const int32_t> table, std::span<const int32_t> prompt,
                         int32_t n_full, int32_t block_size) {
  KvBlockRun run;
  run.block_size = block_size;
  run.block_bytes = exec.block_bytes();
  n_full = std::min<int32_t>(n_full, static_cast<int32_t>(table.size()));
  n_full = std::min<int32_t>(n_full, static_cast<int32_t>(prompt.size()) / block_size);
  if (n_full <= 0) return run;
  run.tokens.assign(prompt.begin(), prompt.begin() + int64_t{n_full} * block_size);
  run.data.resize(run.block_bytes * size_t(n_full));
  for (int32_t i = 0; i < n_full; ++i) exec.save_block(table[i], run.data.data() + run.block_bytes * size_t(i));
  return run;
}

KvImportResult import_blocks(BlockManager& blocks, Executor& exec, const KvBlockRun& run,
                             std::span<const int32_t> prompt, const std::string& salt, int32_t max_blocks) {
  KvImportResult r;
  const int32_t bs = blocks.block_size();
  if (run.block_size != bs)
    fail(ErrorKind::kInvalidArgument, "KV blocks of {} tokens; this instance's blocks hold {}", run.block_size, bs);
  if (run.block_bytes != exec.block_bytes())
    fail(ErrorKind::kInvalidArgument, "KV blocks of {} bytes; this instance's blocks are {} bytes", run.block_bytes,
         exec.block_bytes());
  const int32_t n = run.n_blocks();
  if (run.data.size() != run.block_bytes * size_t(n) || run.tokens.size() != size_t(n) * size_t(bs))
    fail(ErrorKind::kInvalidArgument, "a KV block run of {} blocks holds {} bytes and {} tokens", n, run.data.size(),
         run.tokens.size());
  const int64_t end = int64_t{run.first + n} * bs;
  if (run.first < 0 || end > static_cast<int64_t>(prompt.size()))
    fail(ErrorKind::kInvalidArgument, "KV blocks {}..{} lie beyond the prompt's {} tokens", run.first,
         run.first + n - 1, prompt.size());
  if (!std::equal(run.tokens.begin(), run.tokens.end(), prompt.begin() + int64_t{run.first} * bs))
    fail(ErrorKind::kInvalidArgument, "the KV blocks were computed for other tokens than this prompt's");
  if (n == 0) return r;
  if (const std::string why = kv_transfer_unsupported(blocks); !why.empty()) {
    r.skipped = why;
    return r;
  }
  const std::span<const int32_t> head = prompt.first(size_t(end));
  r.cached = std::min(blocks.cached_blocks(head, salt), run.first + n);
  if (r.cached >= run.first + n) return r;  // everything is here already
  if (r.cached < run.first) {
    r.skipped = "the prefix cache no longer holds the blocks before the ones sent";
    return r;
  }
  const auto t0 = std::chrono::steady_clock::now();
  const int32_t want = std::min(run.first + n - r.cached, std::max(1, max_blocks));
  r.loaded = blocks.import_blocks(head, salt, r.cached, want,
                                  [&](int32_t i, std::span<const int32_t> pages) {
                                    exec.load_block(pages[0], run.data.data() + run.block_bytes * size_t(i - run.first));
                                    return true;
                                  });
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (r.loaded < want) r.skipped = "no free KV blocks for all the blocks sent";
  return r;
}

}  // namespace tandem

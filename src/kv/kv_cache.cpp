#include "kv/kv_cache.h"

#include <new>

#include "core/error.h"

namespace tandem {

KvCache::KvCache(const KvShape& shape, int32_t n_blocks, int32_t block_size)
    : shape_(shape), n_blocks_(n_blocks), block_size_(block_size) {
  if (n_blocks <= 0 || block_size <= 0)
    fail(ErrorKind::kInvalidArgument, "KV cache needs at least one block (got {} blocks of {})", n_blocks,
         block_size);
  const size_t tokens = size_t(n_blocks) * block_size;
  try {
    k_.resize(tokens * shape.n_layer * shape.k_width);
    v_.resize(tokens * shape.n_layer * shape.v_width);
  } catch (const std::bad_alloc&) {
    fail(ErrorKind::kResource, "cannot allocate a KV cache of {} tokens ({} MiB)", tokens,
         tokens * bytes_per_token(shape) >> 20);
  }
  free_.reserve(n_blocks);
  for (int32_t b = n_blocks - 1; b >= 0; --b) free_.push_back(b);
}

int32_t KvCache::allocate() {
  if (free_.empty()) return -1;
  int32_t b = free_.back();
  free_.pop_back();
  return b;
}

void KvCache::release(int32_t block) { free_.push_back(block); }

bool SeqKv::reserve(KvCache& cache, int32_t n) {
  const int32_t need = (n + cache.block_size() - 1) / cache.block_size() - static_cast<int32_t>(blocks.size());
  if (need <= 0) return true;
  if (need > cache.n_free()) return false;
  for (int32_t i = 0; i < need; ++i) blocks.push_back(cache.allocate());
  return true;
}

void SeqKv::release(KvCache& cache) {
  for (int32_t b : blocks) cache.release(b);
  blocks.clear();
  n_tokens = 0;
}

}  // namespace tandem

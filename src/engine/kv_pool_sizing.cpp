#include "engine/kv_pool_sizing.h"

#include <algorithm>
#include <climits>

#include "core/error.h"
#include "kv/key_bounds.h"
#include "runtime/memory_info.h"
#include "model/model.h"

namespace tandem {
namespace {

constexpr int64_t kDefaultKvCapBytes = int64_t{2} << 30;

// Bytes of one block's key bounds (every layer kept, every KV head).
uint64_t key_bound_bytes_per_block(const KvShape& shape, const std::vector<bool>& layers) {
  const int32_t kept = static_cast<int32_t>(std::count(layers.begin(), layers.end(), true));
  return kept == 0 ? 0 : KeyBounds::bytes_per_block(kept, shape.n_head_kv, shape.k_width / shape.n_head_kv);
}

}  // namespace

uint64_t kv_pool_bytes(const KvPlan& p) {
  const uint64_t kv = static_cast<uint64_t>(p.n_blocks) * p.block_size *
                      KvCache::layer_bytes_per_token(p.shape, p.format) * uint64_t(p.paging.layers_per_page);
  return kv + static_cast<uint64_t>(p.n_blocks) * key_bound_bytes_per_block(p.shape, p.key_bounds);
}

KvPlan size_kv_pool(const Model& m, const KvPoolAsk& a) {
  const ModelConfig& mc = m.config();
  const KvShape shape = m.kv_shape();
  KvFormat format = a.format;
  // A latent cache is read back as the latent itself (kernels/latent_attention.h):
  // its elements are stored neither rotated nor smoothed.
  if (mc.latent_attention()) format.rotate_k = format.rotate_v = format.smooth_k = false;
  const int64_t per_token = static_cast<int64_t>(KvCache::bytes_per_token(shape, format));
  // Sliding-window layers on pages of their own, given back as the window
  // passes them; every size below is in tokens that hold all layers.
  const KvPaging paging =
      a.page_windowed_layers ? kv_paging(mc.layer_is_swa, mc.sliding_window) : kv_paging(shape.n_layer);
  const int64_t groups = paging.n_groups;
  // A size in bytes buys tokens at their K/V plus each block's key bounds
  // (a token block of every group: `groups` blocks).
  const int64_t bounds_per_block = static_cast<int64_t>(key_bound_bytes_per_block(shape, a.key_bounds));
  auto tokens_of = [&](int64_t bytes) {
    if (bounds_per_block == 0) return bytes / per_token;
    return static_cast<int64_t>(static_cast<__int128>(bytes) * a.block_size /
                                (per_token * a.block_size + groups * bounds_per_block));
  };
  if (a.swap_bytes < 0) fail(ErrorKind::kInvalidArgument, "swap space must be >= 0 bytes, got {}", a.swap_bytes);
  // The pool and the swap space are committed as they fill, so the kernel
  // accepts sizes beyond the machine's memory and the OOM killer settles it
  // later: a size asked for must fit what is available now, and the default
  // takes at most half of it.
  const std::optional<uint64_t> avail = available_memory_bytes(a.memory_available);
  int64_t tokens = a.kv_tokens;
  if (tokens <= 0 && a.kv_bytes > 0) tokens = tokens_of(a.kv_bytes);
  const bool sized_by_default = tokens <= 0;
  if (sized_by_default) {
    tokens = std::min<int64_t>(int64_t{a.max_seqs} * a.max_context, tokens_of(kDefaultKvCapBytes));
    if (avail) tokens = std::min<int64_t>(tokens, tokens_of(static_cast<int64_t>(*avail / 2)));
  }
  // A block of every group is one token block of every layer (the padding
  // of a last, partly filled group aside).
  const int64_t n_blocks = tokens / a.block_size * groups;
  const int64_t ctx_blocks = (a.max_context + a.block_size - 1) / a.block_size;
  // A windowed group holds a window and the prompt chunk being written.
  const int64_t one_context =
      ctx_blocks + (groups - 1) * ((std::min<int64_t>(a.max_context, int64_t{paging.window} + a.prefill_chunk) +
                                    a.block_size - 1) / a.block_size + 1);
  if (n_blocks < std::min(one_context, ctx_blocks * groups))
    fail(sized_by_default ? ErrorKind::kResource : ErrorKind::kInvalidArgument,
         "the KV pool ({} tokens{}) cannot hold one full context of {} tokens", tokens,
         sized_by_default ? ", half the memory available" : "", a.max_context);
  if (n_blocks > INT32_MAX) fail(ErrorKind::kInvalidArgument, "KV pool of {} blocks is too large", n_blocks);
  KvPlan plan{shape, static_cast<int32_t>(n_blocks), a.block_size, format, paging, a.max_context, a.key_bounds};
  const uint64_t pool_bytes = kv_pool_bytes(plan);
  if (avail && pool_bytes + static_cast<uint64_t>(a.swap_bytes) > *avail)
    fail(ErrorKind::kResource,
         "the KV pool ({} MiB{}) and swap space ({} MiB) need more than the {} MiB of memory available; ask for less",
         pool_bytes >> 20, bounds_per_block > 0 ? ", key bounds included" : "", a.swap_bytes >> 20, *avail >> 20);
  return plan;
}

}  // namespace tandem

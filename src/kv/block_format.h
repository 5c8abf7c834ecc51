// The form a KV block takes outside the process (a KV store's files, the
// transfer between a prefill and a decode instance): one full block of
// block_size positions, every layer's K and V bytes exactly as the paged
// cache stores them (any KvType, quantization scales included, rotated and
// smoothed as stored), behind a header that lets the receiver check it
// before use.
//
// Layout (little-endian):
//   0  "TNDMKVB1"   8  u32 version   12 u32 header bytes   16 u64 total bytes
//   24 u64 checksum of bytes [32, total): header fields, tokens and payload
//   32 u64 model fingerprint   40 u64 key-smoothing fingerprint
//   48 u8 k type, v type, rotate k, rotate v, smooth k, has parent, u16 0
//   56 i32 block size, n_layer, k_width, v_width, n_head_kv, layers per
//      page, page groups, token count
//   88 u64 page bytes   96 u64 block hash   104 u64 parent hash
//   112 i32 tokens[token count], then the payload at `header bytes`: one
//      page per group (group 0 first), each KvCache::save_block's bytes.
// The first 32 bytes are enough to know how many follow (a stream reads
// them, then the rest).
//
// The block hash is kv/block_hash's content hash (the prefix cache's KV
// events name blocks by it), so a receiver finds a block by the prompt it
// serves and registers it in its prefix cache under the same name.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "kv/kv_cache.h"

namespace tandem {

inline constexpr size_t kKvBlockPrefixBytes = 32;

// What a block must match to be used by a cache: the model it was computed
// by, and how the cache stores it.
struct KvBlockLayout {
  uint64_t model = 0;      // model identity (model/model_fingerprint.h)
  uint64_t smoothing = 0;  // key_smoothing_fingerprint of the cache's smoothing (0: none)
  KvFormat format;
  KvShape shape;
  int32_t block_size = 0;
  int32_t layers_per_page = 0;
  int32_t n_groups = 1;
  uint64_t page_bytes = 0;  // one page: KvCache::block_bytes()
  uint64_t payload_bytes() const { return page_bytes * uint64_t(n_groups); }
};
// smoothing: key_smoothing_fingerprint of what the cache stores keys through.
KvBlockLayout kv_block_layout(const KvCache& cache, uint64_t model, uint64_t smoothing = 0);
KvBlockLayout kv_block_layout(const KvShape& shape, const KvFormat& format, const KvPaging& paging,
                              int32_t block_size, uint64_t model, uint64_t smoothing);
// 0 for no smoothing; otherwise a hash of its offsets and scales: keys
// stored through other ones would be read wrongly.
uint64_t key_smoothing_fingerprint(const KeySmoothing& s);

// A block's name in the prefix: its content hash, its parent's (none for a
// prompt's first block), and its tokens.
struct KvBlockKey {
  uint64_t hash = 0;
  bool has_parent = false;
  uint64_t parent = 0;
  std::vector<int32_t> tokens;
  bool operator==(const KvBlockKey&) const = default;
};

struct KvBlock {
  KvBlockKey key;
  std::vector<std::byte> payload;  // layout.payload_bytes(): the pages, group 0 first
};

// Throws kInvalidArgument when the payload is not payload_bytes() long or
// the key does not hold block_size tokens.
std::vector<std::byte> encode_kv_block(const KvBlockLayout& layout, const KvBlockKey& key,
                                       std::span<const std::byte> payload);

// What did not match, first found first: size, then checksum, then the
// fields in the order below.
enum class KvBlockError : uint8_t {
  kNone,
  kTruncated,  // fewer bytes than the header says (or than a header)
  kMagic,      // not a block (or trailing bytes)
  kVersion,
  kChecksum,
  kModel,
  kSmoothing,
  kType,       // K/V types, rotation
  kBlockSize,
  kCounts,     // layers, widths, heads, paging, page bytes, token count
};
const char* kv_block_error_name(KvBlockError e);

struct KvBlockDecoded {
  KvBlockError error = KvBlockError::kNone;
  std::string message;  // names what differs, e.g. "model 0x12.. (expected 0x34..)"
  KvBlock block;
  explicit operator bool() const { return error == KvBlockError::kNone; }
};
// Checks `bytes` against the layout this cache expects; never reads past them.
KvBlockDecoded decode_kv_block(std::span<const std::byte> bytes, const KvBlockLayout& expected);
// The same checks, without copying the payload out: `payload` views `bytes`
// (a receiver copies it once, straight to where it goes).
struct KvBlockChecked {
  KvBlockError error = KvBlockError::kNone;
  std::string message;
  KvBlockKey key;
  std::span<const std::byte> payload;
  explicit operator bool() const { return error == KvBlockError::kNone; }
};
KvBlockChecked check_kv_block(std::span<const std::byte> bytes, const KvBlockLayout& expected);
// From the first kKvBlockPrefixBytes of a block: how many bytes it has in
// all (0 when they are not a block's start).
uint64_t kv_block_total_bytes(std::span<const std::byte> prefix);

// A block's pages (one per group, group 0 first) to and from a payload.
std::vector<std::byte> save_kv_pages(const KvCache& cache, std::span<const int32_t> pages);
void load_kv_pages(KvCache& cache, std::span<const int32_t> pages, std::span<const std::byte> payload);

// The 64-bit checksum the format uses (fast, not cryptographic: it finds
// corruption and truncation, not forgery).
uint64_t kv_checksum(std::span<const std::byte> bytes, uint64_t seed = 0);

}  // namespace tandem

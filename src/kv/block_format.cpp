#include "kv/block_format.h"

#include <bit>
#include <cstring>

#include <fmt/format.h>

#include "core/error.h"
#include "kv/mix64.h"

namespace tandem {
namespace {

static_assert(std::endian::native == std::endian::little, "the block format is written as the CPU stores it");

constexpr char kMagic[8] = {'T', 'N', 'D', 'M', 'K', 'V', 'B', '1'};
constexpr uint32_t kVersion = 1;
constexpr size_t kFixedBytes = 112;  // up to the tokens

constexpr uint64_t kP1 = 0x9e3779b185ebca87ULL, kP2 = 0xc2b2ae3d27d4eb4fULL, kP3 = 0x165667b19e3779f9ULL;

uint64_t load64(const std::byte* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

template <typename T>
void put(std::vector<std::byte>& out, size_t at, T v) {
  std::memcpy(out.data() + at, &v, sizeof(T));
}
template <typename T>
T get(std::span<const std::byte> in, size_t at) {
  T v;
  std::memcpy(&v, in.data() + at, sizeof(T));
  return v;
}

size_t header_bytes(size_t n_tokens) { return (kFixedBytes + 4 * n_tokens + 7) / 8 * 8; }

}  // namespace

uint64_t kv_checksum(std::span<const std::byte> bytes, uint64_t seed) {
  // Four independent multiply-rotate lanes over 32-byte stripes keep the
  // multiplier busy (several GB/s), then the tail word by word and byte by byte.
  uint64_t lane[4] = {seed + kP1 + kP2, seed + kP2, seed, seed - kP1};
  const std::byte* p = bytes.data();
  size_t n = bytes.size();
  auto round = [](uint64_t acc, uint64_t w) { return std::rotl(acc + w * kP2, 31) * kP1; };
  for (; n >= 32; p += 32, n -= 32)
    for (int i = 0; i < 4; ++i) lane[i] = round(lane[i], load64(p + 8 * i));
  uint64_t h = std::rotl(lane[0], 1) + std::rotl(lane[1], 7) + std::rotl(lane[2], 12) + std::rotl(lane[3], 18);
  h ^= uint64_t(bytes.size()) * kP3;
  for (; n >= 8; p += 8, n -= 8) h = std::rotl(h ^ round(0, load64(p)), 27) * kP1 + kP3;
  for (; n > 0; ++p, --n) h = std::rotl(h ^ (uint64_t(std::to_integer<uint8_t>(*p)) * kP3), 11) * kP1;
  return fmix64(h);
}

uint64_t key_smoothing_fingerprint(const KeySmoothing& s) {
  if (s.offset.empty() && s.scale.empty()) return 0;
  const auto o = std::as_bytes(std::span(s.offset));
  const auto c = std::as_bytes(std::span(s.scale));
  return kv_checksum(c, kv_checksum(o, 1)) | 1;
}

KvBlockLayout kv_block_layout(const KvShape& shape, const KvFormat& format, const KvPaging& paging,
                              int32_t block_size, uint64_t model, uint64_t smoothing) {
  KvBlockLayout l;
  l.model = model;
  l.smoothing = smoothing;
  l.format = format;
  l.shape = shape;
  l.block_size = block_size;
  l.layers_per_page = paging.layers_per_page > 0 ? paging.layers_per_page : shape.n_layer;
  l.n_groups = paging.layers_per_page > 0 ? paging.n_groups : 1;
  l.page_bytes = KvCache::layer_bytes_per_token(shape, format) * uint64_t(l.layers_per_page) * uint64_t(block_size);
  return l;
}

KvBlockLayout kv_block_layout(const KvCache& cache, uint64_t model, uint64_t smoothing) {
  return kv_block_layout(cache.shape(), cache.format(), cache.paging(), cache.block_size(), model, smoothing);
}

std::vector<std::byte> encode_kv_block(const KvBlockLayout& l, const KvBlockKey& key,
                                       std::span<const std::byte> payload) {
  if (payload.size() != l.payload_bytes())
    fail(ErrorKind::kInvalidArgument, "KV block payload of {} bytes, the layout's is {}", payload.size(),
         l.payload_bytes());
  if (key.tokens.size() != size_t(l.block_size))
    fail(ErrorKind::kInvalidArgument, "KV block of {} tokens, the layout's blocks hold {}", key.tokens.size(),
         l.block_size);
  const size_t head = header_bytes(key.tokens.size());
  std::vector<std::byte> out(head + payload.size());
  std::memcpy(out.data(), kMagic, 8);
  put<uint32_t>(out, 8, kVersion);
  put<uint32_t>(out, 12, uint32_t(head));
  put<uint64_t>(out, 16, out.size());
  put<uint64_t>(out, 32, l.model);
  put<uint64_t>(out, 40, l.smoothing);
  const uint8_t flags[8] = {uint8_t(l.format.k), uint8_t(l.format.v), l.format.rotate_k, l.format.rotate_v,
                            l.format.smooth_k,   key.has_parent,      0,                  0};
  std::memcpy(out.data() + 48, flags, 8);
  const int32_t counts[8] = {l.block_size,      l.shape.n_layer,  l.shape.k_width, l.shape.v_width,
                             l.shape.n_head_kv, l.layers_per_page, l.n_groups,     int32_t(key.tokens.size())};
  std::memcpy(out.data() + 56, counts, sizeof counts);
  put<uint64_t>(out, 88, l.page_bytes);
  put<uint64_t>(out, 96, key.hash);
  put<uint64_t>(out, 104, key.has_parent ? key.parent : 0);
  std::memcpy(out.data() + kFixedBytes, key.tokens.data(), 4 * key.tokens.size());
  if (!payload.empty()) std::memcpy(out.data() + head, payload.data(), payload.size());
  put<uint64_t>(out, 24, kv_checksum(std::span(out).subspan(kKvBlockPrefixBytes)));
  return out;
}

uint64_t kv_block_total_bytes(std::span<const std::byte> prefix) {
  if (prefix.size() < kKvBlockPrefixBytes || std::memcmp(prefix.data(), kMagic, 8) != 0) return 0;
  return get<uint64_t>(prefix, 16);
}

const char* kv_block_error_name(KvBlockError e) {
  switch (e) {
    case KvBlockError::kNone: return "none";
    case KvBlockError::kTruncated: return "truncated";
    case KvBlockError::kMagic: return "not a KV block";
    case KvBlockError::kVersion: return "version";
    case KvBlockError::kChecksum: return "checksum";
    case KvBlockError::kModel: return "model";
    case KvBlockError::kSmoothing: return "key smoothing";
    case KvBlockError::kType: return "KV type";
    case KvBlockError::kBlockSize: return "block size";
    case KvBlockError::kCounts: return "counts";
  }
  return "?";
}

KvBlockDecoded decode_kv_block(std::span<const std::byte> in, const KvBlockLayout& want) {
  KvBlockChecked c = check_kv_block(in, want);
  KvBlockDecoded r;
  r.error = c.error;
  r.message = std::move(c.message);
  if (!c) return r;
  r.block.key = std::move(c.key);
  r.block.payload.assign(c.payload.begin(), c.payload.end());
  return r;
}

KvBlockChecked check_kv_block(std::span<const std::byte> in, const KvBlockLayout& want) {
  KvBlockChecked r;
  auto bad = [&](KvBlockError e, std::string msg) {
    r.error = e;
    r.message = fmt::format("KV block refused ({}): {}", kv_block_error_name(e), msg);
    return std::move(r);
  };
  if (in.size() < kKvBlockPrefixBytes)
    return bad(KvBlockError::kTruncated, fmt::format("{} bytes, fewer than a header", in.size()));
  if (std::memcmp(in.data(), kMagic, 8) != 0) return bad(KvBlockError::kMagic, "no TNDMKVB1 mark at its start");
  if (const uint32_t v = get<uint32_t>(in, 8); v != kVersion)
    return bad(KvBlockError::kVersion, fmt::format("format version {} (this build reads {})", v, kVersion));
  const uint64_t total = get<uint64_t>(in, 16);
  if (in.size() < total)
    return bad(KvBlockError::kTruncated, fmt::format("{} of its {} bytes", in.size(), total));
  if (in.size() > total)
    return bad(KvBlockError::kMagic, fmt::format("{} bytes after its {} bytes", in.size() - total, total));
  if (total < kFixedBytes)
    return bad(KvBlockError::kTruncated, fmt::format("{} bytes, fewer than a header", total));
  if (const uint64_t sum = kv_checksum(in.subspan(kKvBlockPrefixBytes)); sum != get<uint64_t>(in, 24))
    return bad(KvBlockError::kChecksum,
               fmt::format("checksum {:#018x} of the contents, {:#018x} recorded", sum, get<uint64_t>(in, 24)));
  // From here the bytes are as written: what differs is what they were written for.
  if (const uint64_t m = get<uint64_t>(in, 32); m != want.model)
    return bad(KvBlockError::kModel, fmt::format("model {:#018x} (expected {:#018x})", m, want.model));
  if (const uint64_t s = get<uint64_t>(in, 40); s != want.smoothing)
    return bad(KvBlockError::kSmoothing,
               fmt::format("key smoothing {:#018x} (expected {:#018x})", s, want.smoothing));
  uint8_t f[8];
  std::memcpy(f, in.data() + 48, 8);
  KvFormat got{KvType(f[0]), KvType(f[1]), f[2] != 0, f[3] != 0, f[4] != 0};
  auto type_name = [](uint8_t t) { return t <= uint8_t(KvType::kQ4_0) ? kv_type_name(KvType(t)) : "unknown"; };
  if (f[0] != uint8_t(want.format.k) || f[1] != uint8_t(want.format.v))
    return bad(KvBlockError::kType, fmt::format("K {} / V {} (expected K {} / V {})", type_name(f[0]), type_name(f[1]),
                                                kv_type_name(want.format.k), kv_type_name(want.format.v)));
  if (got.rotate_k != want.format.rotate_k || got.rotate_v != want.format.rotate_v || got.smooth_k != want.format.smooth_k)
    return bad(KvBlockError::kType,
               fmt::format("rotation K {} V {}, smoothed keys {} (expected {} {} {})", got.rotate_k, got.rotate_v,
                           got.smooth_k, want.format.rotate_k, want.format.rotate_v, want.format.smooth_k));
  int32_t c[8];
  std::memcpy(c, in.data() + 56, sizeof c);
  if (c[0] != want.block_size)
    return bad(KvBlockError::kBlockSize, fmt::format("blocks of {} tokens (expected {})", c[0], want.block_size));
  const int32_t want_c[8] = {want.block_size,      want.shape.n_layer,    want.shape.k_width, want.shape.v_width,
                             want.shape.n_head_kv, want.layers_per_page, want.n_groups,      want.block_size};
  static constexpr const char* kNames[8] = {"block size", "layers",          "K width",     "V width",
                                            "KV heads",   "layers per page", "page groups", "tokens"};
  for (int i = 1; i < 8; ++i)
    if (c[i] != want_c[i])
      return bad(KvBlockError::kCounts, fmt::format("{} {} (expected {})", kNames[i], c[i], want_c[i]));
  if (const uint64_t pb = get<uint64_t>(in, 88); pb != want.page_bytes)
    return bad(KvBlockError::kCounts, fmt::format("pages of {} bytes (expected {})", pb, want.page_bytes));
  const uint32_t head = get<uint32_t>(in, 12);
  if (head != header_bytes(size_t(c[7])) || total != head + want.payload_bytes())
    return bad(KvBlockError::kCounts, fmt::format("{} bytes with a header of {} (expected {} and {})", total, head,
                                                  header_bytes(size_t(c[7])) + want.payload_bytes(),
                                                  header_bytes(size_t(c[7]))));
  r.key.has_parent = f[5] != 0;
  r.key.hash = get<uint64_t>(in, 96);
  r.key.parent = get<uint64_t>(in, 104);
  r.key.tokens.resize(size_t(c[7]));
  std::memcpy(r.key.tokens.data(), in.data() + kFixedBytes, 4 * size_t(c[7]));
  r.payload = in.subspan(head);
  return r;
}

std::vector<std::byte> save_kv_pages(const KvCache& cache, std::span<const int32_t> pages) {
  const size_t pb = cache.block_bytes();
  std::vector<std::byte> out(pb * pages.size());
  for (size_t g = 0; g < pages.size(); ++g) cache.save_block(pages[g], out.data() + g * pb);
  return out;
}

void load_kv_pages(KvCache& cache, std::span<const int32_t> pages, std::span<const std::byte> payload) {
  const size_t pb = cache.block_bytes();
  if (payload.size() != pb * pages.size())
    fail(ErrorKind::kInvalidArgument, "KV block payload of {} bytes for {} pages of {}", payload.size(), pages.size(),
         pb);
  for (size_t g = 0; g < pages.size(); ++g) cache.load_block(pages[g], payload.data() + g * pb);
}

}  // namespace tandem

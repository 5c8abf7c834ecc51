#include "server/kv_transfer.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>

#include <fmt/format.h>

#include "core/error.h"
#include "runtime/sha256.h"

namespace tandem::server {
namespace {

// The block's frame until the shared block format takes its place: a fixed
// header, the block's tokens, its K/V as the executor saves it, a checksum.
constexpr char kBlockMagic[4] = {'T', 'K', 'V', 'B'};
constexpr uint32_t kBlockVersion = 1;
constexpr size_t kModelField = 64, kFormatField = 32;
constexpr size_t kHeaderBytes = 4 + 4 + kModelField + kFormatField + 4 + 8 + 4;

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// 64 bits over 8-byte words (a multiply-xorshift chain): fast enough not to
// show beside the copy, and any flipped bit changes it.
uint64_t checksum(const char* p, size_t n) {
  uint64_t h = 0x9E3779B97F4A7C15ull ^ n;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w;
    std::memcpy(&w, p + i, 8);
    h = (h ^ w) * 0xBF58476D1CE4E5B9ull;
    h ^= h >> 31;
  }
  for (; i < n; ++i) h = (h ^ uint8_t(p[i])) * 0x94D049BB133111EBull;
  return h ^ (h >> 29);
}

void put_field(std::string& out, const std::string& s, size_t width) {
  std::string f = s.substr(0, width);
  f.resize(width, '\0');
  out += f;
}
std::string get_field(const char* p, size_t width) { return std::string(p, strnlen(p, width)); }

template <class T>
void put(std::string& out, T v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof v);
}
template <class T>
T get(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

}  // namespace

const char* role_name(Role r) {
  switch (r) {
    case Role::kPrefill: return "prefill";
    case Role::kDecode: return "decode";
    case Role::kBoth: break;
  }
  return "both";
}

Role parse_role(const std::string& name) {
  if (name == "both") return Role::kBoth;
  if (name == "prefill") return Role::kPrefill;
  if (name == "decode") return Role::kDecode;
  fail(ErrorKind::kInvalidArgument, "unknown role '{}' (prefill, decode or both)", name);
}

std::string model_file_identity(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) fail(ErrorKind::kIo, "cannot read {} to identify the model", path);
  std::fseek(f, 0, SEEK_END);
  const long size = std::ftell(f);
  Sha256 h;
  h.update(fmt::format("{}\n", size));
  constexpr long kPart = 1 << 20;
  std::vector<uint8_t> buf(static_cast<size_t>(kPart));
  for (const long at : {0L, std::max(0L, size - kPart)}) {
    std::fseek(f, at, SEEK_SET);
    const size_t n = std::fread(buf.data(), 1, buf.size(), f);
    h.update(std::span<const uint8_t>(buf.data(), n));
  }
  std::fclose(f);
  std::string hex;
  for (uint8_t b : h.finish()) hex += fmt::format("{:02x}", b);
  return hex;
}

std::string encode_block(const KvBlockSpec& spec, const KvBlockRun& run, int32_t i) {
  const size_t bs = size_t(run.block_size);
  std::string out;
  out.reserve(kHeaderBytes + bs * 4 + run.block_bytes + 8);
  out.append(kBlockMagic, 4);
  put(out, kBlockVersion);
  put_field(out, spec.model, kModelField);
  put_field(out, spec.kv_format, kFormatField);
  put(out, run.block_size);
  put(out, static_cast<uint64_t>(run.block_bytes));
  put(out, run.first + i);
  out.append(reinterpret_cast<const char*>(run.tokens.data() + bs * size_t(i)), bs * 4);
  out.append(reinterpret_cast<const char*>(run.data.data() + run.block_bytes * size_t(i)), run.block_bytes);
  put(out, checksum(out.data(), out.size()));
  return out;
}

void decode_block(const KvBlockSpec& spec, std::string_view b, int32_t index, std::span<const int32_t> prompt,
                  KvBlockRun& run) {
  if (b.size() < kHeaderBytes + 8 || std::memcmp(b.data(), kBlockMagic, 4) != 0)
    fail(ErrorKind::kInvalidArgument, "not a Tandem KV block ({} bytes)", b.size());
  const char* p = b.data() + 4;
  if (const auto v = get<uint32_t>(p); v != kBlockVersion)
    fail(ErrorKind::kInvalidArgument, "KV block format version {}; this instance reads {}", v, kBlockVersion);
  p += 4;
  const std::string model = get_field(p, kModelField);
  p += kModelField;
  const std::string format = get_field(p, kFormatField);
  p += kFormatField;
  const auto bs = get<int32_t>(p);
  const auto bytes = get<uint64_t>(p + 4);
  const auto at = get<int32_t>(p + 12);
  if (model != spec.model)
    fail(ErrorKind::kInvalidArgument, "the KV blocks are of another model ({}); this instance serves {}", model,
         spec.model);
  if (format != spec.kv_format)
    fail(ErrorKind::kInvalidArgument, "the KV blocks are of KV type {}; this instance stores {}", format,
         spec.kv_format);
  if (bs != spec.block_size)
    fail(ErrorKind::kInvalidArgument, "the KV blocks hold {} tokens each; this instance's hold {}", bs,
         spec.block_size);
  if (bytes != spec.block_bytes)
    fail(ErrorKind::kInvalidArgument, "the KV blocks are {} bytes each; this instance's are {} (another layout)",
         bytes, spec.block_bytes);
  if (at != index) fail(ErrorKind::kInvalidArgument, "KV block {} arrived in place of block {}", at, index);
  const size_t want = kHeaderBytes + size_t(bs) * 4 + bytes + 8;
  if (b.size() != want)
    fail(ErrorKind::kInvalidArgument, "KV block {} is {} bytes; its header says {}", index, b.size(), want);
  if (get<uint64_t>(b.data() + want - 8) != checksum(b.data(), want - 8))
    fail(ErrorKind::kInvalidArgument, "KV block {} fails its checksum (corrupted in transit)", index);
  const char* toks = b.data() + kHeaderBytes;
  const int64_t from = int64_t{index} * bs;
  if (from + bs > static_cast<int64_t>(prompt.size()) ||
      std::memcmp(toks, prompt.data() + from, size_t(bs) * 4) != 0)
    fail(ErrorKind::kInvalidArgument, "KV block {} was computed for other tokens than this prompt's", index);
  run.tokens.insert(run.tokens.end(), prompt.begin() + from, prompt.begin() + from + bs);
  const auto* kv = reinterpret_cast<const std::byte*>(toks + size_t(bs) * 4);
  run.data.insert(run.data.end(), kv, kv + bytes);
}

KvTransfer::KvTransfer(KvTransferConfig cfg, KvBlockSpec spec, std::unique_ptr<KvTransport> transport)
    : cfg_(std::move(cfg)), spec_(std::move(spec)), transport_(std::move(transport)) {
  std::random_device rd;
  engine_id_ = fmt::format("tandem-{:08x}{:08x}", rd(), rd());
}

KvTransfer::~KvTransfer() {
  if (transport_) transport_->stop();
}

int KvTransfer::listen() {
  port_ = transport_->listen(
      cfg_.host, cfg_.port, [this](uint64_t id) { return take_block(id); },
      [this](std::span<const uint64_t> ids, bool sent) {
        if (!sent) stats_.failures += 1;
        release(ids);
      });
  return port_;
}

std::vector<uint64_t> KvTransfer::pin(KvBlockRun run) {
  expire();
  auto shared = std::make_shared<const KvBlockRun>(std::move(run));
  std::vector<uint64_t> ids;
  const double t = now_s();
  std::lock_guard<std::mutex> lock(mu_);
  for (int32_t i = 0; i < shared->n_blocks(); ++i) {
    const uint64_t id = next_id_++;
    pinned_[id] = Pinned{shared, i, t};
    ids.push_back(id);
  }
  stats_.pinned_blocks += shared->n_blocks();
  stats_.pinned_bytes += static_cast<int64_t>(shared->block_bytes) * shared->n_blocks();
  return ids;
}

std::optional<std::string> KvTransfer::take_block(uint64_t id) {
  std::shared_ptr<const KvBlockRun> run;
  int32_t index = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const auto it = pinned_.find(id);
    if (it == pinned_.end()) return std::nullopt;
    run = it->second.run;
    index = it->second.index;
  }
  std::string b = encode_block(spec_, *run, index);
  stats_.sent_blocks += 1;
  stats_.sent_bytes += b.size();
  return b;
}

void KvTransfer::release(std::span<const uint64_t> ids) {
  std::lock_guard<std::mutex> lock(mu_);
  for (uint64_t id : ids) {
    const auto it = pinned_.find(id);
    if (it == pinned_.end()) continue;
    stats_.pinned_blocks -= 1;
    stats_.pinned_bytes -= static_cast<int64_t>(it->second.run->block_bytes);
    pinned_.erase(it);
  }
}

void KvTransfer::expire() {
  const double t = now_s();
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = pinned_.begin(); it != pinned_.end();) {
    if (t - it->second.since < cfg_.pin_s) {
      ++it;
      continue;
    }
    stats_.pinned_blocks -= 1;
    stats_.pinned_bytes -= static_cast<int64_t>(it->second.run->block_bytes);
    stats_.expired_blocks += 1;
    it = pinned_.erase(it);
  }
}

KvBlockRun KvTransfer::fetch(const KvTransferParams& t, std::span<const int32_t> prompt, int32_t skip) {
  const auto t0 = std::chrono::steady_clock::now();
  KvBlockRun run;
  run.first = skip;
  run.block_size = spec_.block_size;
  run.block_bytes = spec_.block_bytes;
  const size_t n = t.remote_block_ids.size();
  if (static_cast<int64_t>(n) * spec_.block_size > static_cast<int64_t>(prompt.size()))
    fail(ErrorKind::kInvalidArgument,
         "kv_transfer_params names {} blocks of {} tokens; the prompt has {} tokens here (another model or "
         "tokenizer?)",
         n, spec_.block_size, prompt.size());
  stats_.fetches += 1;
  stats_.skipped_blocks += std::min<size_t>(size_t(skip), n);
  // A block from a peer of another model or layout is refused by its header,
  // read within this bound: the frame of one of this instance's blocks.
  const size_t max_block = kHeaderBytes + size_t(spec_.block_size) * 4 + spec_.block_bytes + 8;
  try {
    transport_->fetch(t.remote_host, t.remote_port, t.remote_block_ids, std::min<size_t>(size_t(skip), n), max_block,
                      cfg_.fetch_timeout_s, [&](size_t i, std::string block) {
                        stats_.received_bytes += block.size();
                        decode_block(spec_, block, static_cast<int32_t>(i), prompt, run);
                        stats_.received_blocks += 1;
                      });
  } catch (...) {
    stats_.failures += 1;
    throw;
  }
  stats_.fetch_us += static_cast<uint64_t>(
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  return run;
}

std::string KvTransfer::prometheus() const {
  std::string out;
  auto family = [&](const char* name, const char* type, const char* help, double v) {
    out += fmt::format("# HELP {} {}\n# TYPE {} {}\n{} {}\n", name, help, name, type, name, v);
  };
  const KvTransferStats& s = stats_;
  family("tandem_kv_transfer_sent_blocks_total", "counter", "KV blocks sent to decode instances", s.sent_blocks);
  family("tandem_kv_transfer_sent_bytes_total", "counter", "Bytes of KV blocks sent, framing included", s.sent_bytes);
  family("tandem_kv_transfer_received_blocks_total", "counter", "KV blocks received from prefill instances and checked",
         s.received_blocks);
  family("tandem_kv_transfer_received_bytes_total", "counter", "Bytes of KV blocks received", s.received_bytes);
  family("tandem_kv_transfer_skipped_blocks_total", "counter",
         "KV blocks not fetched because the prefix cache already held them", s.skipped_blocks);
  family("tandem_kv_transfer_fetches_total", "counter", "KV fetches started", s.fetches);
  family("tandem_kv_transfer_fetch_seconds_total", "counter", "Time in KV fetches, connect to last block checked",
         double(s.fetch_us.load()) / 1e6);
  family("tandem_kv_transfer_failures_total", "counter",
         "KV transfers that failed (a peer gone, a timeout, a block refused)", s.failures);
  family("tandem_kv_transfer_expired_blocks_total", "counter", "Pinned KV blocks dropped unfetched after the timeout",
         s.expired_blocks);
  family("tandem_kv_transfer_pinned_blocks", "gauge", "KV blocks held for decode instances to fetch",
         double(s.pinned_blocks.load()));
  family("tandem_kv_transfer_pinned_bytes", "gauge", "Bytes of KV held for decode instances to fetch",
         double(s.pinned_bytes.load()));
  return out;
}

}  // namespace tandem::server

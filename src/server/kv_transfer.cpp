#include "server/kv_transfer.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <thread>
#include <time.h>

#include <fmt/format.h>

#include "core/error.h"
#include "kv/block_hash.h"

namespace tandem::server {
namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// This thread's CPU time, kernel time included (the socket's copy counts).
double thread_cpu_s() {
  timespec ts{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + double(ts.tv_nsec) * 1e-9;
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

std::string encode_block(const KvBlockLayout& layout, const KvBlockRun& run, std::span<const uint64_t> hashes,
                         int32_t i) {
  const size_t bs = size_t(run.block_size);
  KvBlockKey key;
  key.tokens.assign(run.tokens.begin() + bs * size_t(i), run.tokens.begin() + bs * size_t(i + 1));
  // The run starts at the prompt's first block (run.first == 0 on export).
  key.hash = hashes[size_t(i)];
  key.has_parent = i > 0;
  key.parent = i > 0 ? hashes[size_t(i) - 1] : 0;
  const auto payload = std::span<const std::byte>(run.data).subspan(run.block_bytes * size_t(i), run.block_bytes);
  const std::vector<std::byte> b = encode_kv_block(layout, key, payload);
  return std::string(reinterpret_cast<const char*>(b.data()), b.size());
}

void decode_block(const KvBlockLayout& layout, std::span<const std::byte> bytes, int32_t index,
                  std::span<const int32_t> prompt, uint64_t hash, KvBlockRun& run) {
  const KvBlockChecked d = check_kv_block(bytes, layout);
  if (!d) fail(ErrorKind::kInvalidArgument, "block {}: {}", index, d.message);
  const int64_t from = int64_t{index} * layout.block_size;
  if (from + layout.block_size > static_cast<int64_t>(prompt.size()) ||
      !std::equal(d.key.tokens.begin(), d.key.tokens.end(), prompt.begin() + from) ||
      d.key.hash != hash)
    fail(ErrorKind::kInvalidArgument, "block {} was computed for other tokens than this prompt's", index);
  run.tokens.insert(run.tokens.end(), prompt.begin() + from, prompt.begin() + from + layout.block_size);
  run.data.insert(run.data.end(), d.payload.begin(), d.payload.end());
}

KvTransfer::KvTransfer(KvTransferConfig cfg, KvBlockLayout layout, std::unique_ptr<KvTransport> transport)
    : cfg_(std::move(cfg)), layout_(std::move(layout)), transport_(std::move(transport)) {
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
  auto shared = std::make_shared<PinnedRun>();
  shared->hashes = prompt_block_hashes(run.tokens, run.block_size);  // once for the run, not per block sent
  shared->run = std::move(run);
  std::vector<uint64_t> ids;
  const double t = now_s();
  std::lock_guard<std::mutex> lock(mu_);
  const int32_t n = shared->run.n_blocks();
  for (int32_t i = 0; i < n; ++i) {
    const uint64_t id = next_id_++;
    pinned_[id] = Pinned{shared, i, t};
    ids.push_back(id);
  }
  stats_.pinned_blocks += n;
  stats_.pinned_bytes += static_cast<int64_t>(shared->run.block_bytes) * n;
  return ids;
}

std::optional<std::string> KvTransfer::take_block(uint64_t id) {
  std::shared_ptr<const PinnedRun> run;
  int32_t index = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const auto it = pinned_.find(id);
    if (it == pinned_.end()) return std::nullopt;
    run = it->second.run;
    index = it->second.index;
  }
  std::string b = encode_block(layout_, run->run, run->hashes, index);
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
    stats_.pinned_bytes -= static_cast<int64_t>(it->second.run->run.block_bytes);
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
    stats_.pinned_bytes -= static_cast<int64_t>(it->second.run->run.block_bytes);
    stats_.expired_blocks += 1;
    it = pinned_.erase(it);
  }
}

KvBlockRun KvTransfer::fetch(const KvTransferParams& t, std::span<const int32_t> prompt, int32_t skip) {
  const auto t0 = std::chrono::steady_clock::now();
  KvBlockRun run;
  run.first = skip;
  run.block_size = layout_.block_size;
  run.block_bytes = layout_.payload_bytes();
  const size_t n = t.remote_block_ids.size();
  if (static_cast<int64_t>(n) * layout_.block_size > static_cast<int64_t>(prompt.size()))
    fail(ErrorKind::kInvalidArgument,
         "kv_transfer_params names {} blocks of {} tokens; the prompt has {} tokens here (another model or "
         "tokenizer?)",
         n, layout_.block_size, prompt.size());
  stats_.fetches += 1;
  stats_.skipped_blocks += std::min<size_t>(size_t(skip), n);
  const size_t want = n - std::min<size_t>(size_t(skip), n);
  run.data.reserve(want * run.block_bytes);  // one allocation for the whole run
  run.tokens.reserve(want * size_t(run.block_size));
  // A block of another layout (a larger block size, another model) is read
  // whole so that its header can say what differs, within this bound.
  const size_t one = 4096 + size_t(layout_.block_size) * 4 + layout_.payload_bytes();
  const size_t max_block = std::max<size_t>(16 * one, size_t{64} << 20);
  try {
    const std::vector<uint64_t> hashes = prompt_block_hashes(prompt, layout_.block_size, {}, n);
    double cpu = thread_cpu_s();
    transport_->fetch(t.remote_host, t.remote_port, t.remote_block_ids, std::min<size_t>(size_t(skip), n), max_block,
                      cfg_.fetch_timeout_s, [&](size_t i, std::span<const std::byte> block) {
                        stats_.received_bytes += block.size();
                        decode_block(layout_, block, static_cast<int32_t>(i), prompt, hashes[i], run);
                        stats_.received_blocks += 1;
                        // Paced while this instance decodes: the receiving
                        // (copy, checksum) shares its cores, and a fetch run
                        // flat out would stall every sequence's next tokens.
                        const double now = thread_cpu_s(), used = now - cpu;
                        if (cfg_.fetch_share < 1 && decoding_ && decoding_()) {
                          const double rest = used * (1 - cfg_.fetch_share) / cfg_.fetch_share;
                          stats_.paced_us += static_cast<uint64_t>(rest * 1e6);
                          std::this_thread::sleep_for(std::chrono::duration<double>(rest));
                        }
                        cpu = thread_cpu_s();
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
  family("tandem_kv_transfer_imported_blocks_total", "counter",
         "Fetched KV blocks written into this instance's pool and prefix cache", s.imported_blocks);
  family("tandem_kv_transfer_import_seconds_total", "counter",
         "Time the engine spent writing fetched blocks into its pool", double(s.import_us.load()) / 1e6);
  family("tandem_kv_transfer_paced_seconds_total", "counter",
         "Time fetches waited so that receiving took at most --kv-fetch-share of a decoding instance's core",
         double(s.paced_us.load()) / 1e6);
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

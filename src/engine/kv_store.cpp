#include "engine/kv_store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <system_error>

#include <fmt/format.h>

#include "core/error.h"
#include "engine/sequence.h"
#include "kv/block_hash.h"
#include "kv/block_manager.h"
#include "model/executor.h"

namespace tandem {
namespace fs = std::filesystem;
namespace {

// Blocks waiting for the writer beyond this are dropped (counted as write
// failures): a slow disk costs cache files, never engine memory or steps.
constexpr size_t kMaxQueuedBytes = size_t{256} << 20;
constexpr const char* kSuffix = ".kvb";

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void warn(const std::string& what) { std::fprintf(stderr, "warning: kv-store: %s\n", what.c_str()); }

// 16 hex digits and the suffix: a block file, and its hash.
bool parse_name(const std::string& name, uint64_t& hash) {
  if (name.size() != 16 + 4 || !name.ends_with(kSuffix)) return false;
  hash = 0;
  for (size_t i = 0; i < 16; ++i) {
    const char c = name[i];
    const int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
    if (d < 0) return false;
    hash = hash << 4 | uint64_t(d);
  }
  return true;
}

bool read_all(int fd, std::byte* out, size_t n) {
  while (n > 0) {
    const ssize_t r = ::read(fd, out, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    out += r;
    n -= size_t(r);
  }
  return true;
}

bool write_all(int fd, const std::byte* in, size_t n) {
  while (n > 0) {
    const ssize_t r = ::write(fd, in, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    in += r;
    n -= size_t(r);
  }
  return true;
}

}  // namespace

KvStore::KvStore(std::string dir, int64_t max_bytes, const KvBlockLayout& layout, BlockManager& blocks,
                 Executor& exec)
    : dir_(std::move(dir)), max_bytes_(max_bytes), layout_(layout), blocks_(blocks), exec_(exec) {
  if (max_bytes <= 0) fail(ErrorKind::kInvalidArgument, "--kv-store-size must be > 0 bytes, got {}", max_bytes);
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec || !fs::is_directory(dir_))
    fail(ErrorKind::kIo, "--kv-store {}: cannot make the folder ({})", dir_, ec ? ec.message() : "not a folder");
  // The files there now, oldest first.
  std::vector<std::pair<fs::file_time_type, uint64_t>> found;
  for (const auto& e : fs::directory_iterator(dir_, ec)) {
    uint64_t h = 0;
    std::error_code fe;
    if (!e.is_regular_file(fe) || !parse_name(e.path().filename().string(), h)) continue;
    const auto size = e.file_size(fe);
    const auto t = e.last_write_time(fe);
    if (fe) continue;
    files_[h] = {int64_t(size), 0};
    stats_.bytes += int64_t(size);
    found.emplace_back(t, h);
  }
  std::sort(found.begin(), found.end());
  for (const auto& [t, h] : found) files_[h].used = ++clock_;
  evict_locked();
  writer_ = std::thread([this] { writer_loop(); });
}

KvStore::~KvStore() {
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  writer_.join();
}

std::string KvStore::path_of(uint64_t hash) const { return fmt::format("{}/{:016x}{}", dir_, hash, kSuffix); }

int32_t KvStore::load(std::span<const int32_t> prompt, std::string_view salt) {
  const int32_t bs = layout_.block_size;
  const int32_t n_full = static_cast<int32_t>(prompt.size() / size_t(bs));
  if (!blocks_.prefix_caching() || n_full == 0) return 0;
  const int32_t first = blocks_.cached_blocks(prompt, salt);
  if (first >= n_full) return 0;
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<uint64_t> hashes = prompt_block_hashes(prompt, bs, salt);
  // Cheap miss first: no file for the next block (the common case).
  if (::access(path_of(hashes[size_t(first)]).c_str(), R_OK) != 0) return 0;
  std::vector<std::byte> payload;
  KvBlockKey want;
  uint64_t bytes = 0;
  const int32_t n = blocks_.import_blocks(prompt, salt, first, n_full - first, [&](int32_t i, std::span<const int32_t> pages) {
    want.hash = hashes[size_t(i)];
    want.has_parent = i > 0;
    want.parent = i > 0 ? hashes[size_t(i) - 1] : 0;
    const auto t = prompt.subspan(size_t(i) * size_t(bs), size_t(bs));
    want.tokens.assign(t.begin(), t.end());
    if (!read_block(want, payload)) return false;
    for (size_t g = 0; g < pages.size(); ++g)
      if (pages[g] >= 0) exec_.load_block(pages[g], payload.data() + g * layout_.page_bytes);
    bytes += payload.size();
    return true;
  });
  std::lock_guard lk(mu_);
  stats_.blocks_read += uint64_t(n);
  stats_.bytes_read += bytes;
  stats_.read_seconds += seconds_since(t0);
  return n;
}

bool KvStore::read_block(const KvBlockKey& want, std::vector<std::byte>& payload) {
  const std::string path = path_of(want.hash);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;  // not there (or evicted by another instance): a miss
  struct stat st {};
  std::vector<std::byte> bytes;
  bool ok = ::fstat(fd, &st) == 0 && uint64_t(st.st_size) <= layout_.payload_bytes() + (uint64_t{1} << 20);
  if (ok) {
    bytes.resize(size_t(st.st_size));
    ok = read_all(fd, bytes.data(), bytes.size());
  }
  ::close(fd);
  std::string problem;
  KvBlockDecoded d;
  if (!ok) {
    problem = fmt::format("cannot read it whole ({} bytes)", st.st_size);
  } else {
    d = decode_kv_block(bytes, layout_);
    if (!d) problem = d.message;
    else if (d.block.key != want)
      problem = fmt::format("it holds block {:016x} of other tokens or another parent", d.block.key.hash);
  }
  std::lock_guard lk(mu_);
  if (!problem.empty()) {
    ++stats_.read_failures;
    // Forgotten, so that the recomputed block is written over it.
    if (auto it = files_.find(want.hash); it != files_.end()) {
      stats_.bytes -= it->second.bytes;
      files_.erase(it);
    }
    warn(fmt::format("{}: {}; the block is recomputed", path, problem));
    return false;
  }
  payload = std::move(d.block.payload);
  // Read: recently used, here and (by its time) for the other instances.
  ::utimensat(AT_FDCWD, path.c_str(), nullptr, 0);
  auto& f = files_[want.hash];
  if (f.bytes == 0) stats_.bytes += int64_t(bytes.size());
  f.bytes = int64_t(bytes.size());
  f.used = ++clock_;
  return true;
}

void KvStore::save(const Sequence& s, int32_t from) {
  const SeqBlocks& b = s.blocks;
  if (b.detached || from < 0 || size_t(from) >= b.prefix.size()) return;
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<uint64_t> hashes =
      prompt_block_hashes(s.tokens, layout_.block_size, s.req->params.cache_salt, b.prefix.size());
  const size_t pb = size_t(layout_.page_bytes);
  for (size_t i = size_t(from); i < hashes.size(); ++i) {
    // Every group's page, as published (a windowed page given back in this
    // same commit still holds it until the next step takes it).
    std::vector<int32_t> pages;
    if (blocks_.holds(b.prefix[i])) pages.push_back(b.prefix[i].block);
    for (const WindowedBlocks& w : b.windowed)
      if (i < w.prefix.size() && blocks_.holds(w.prefix[i])) pages.push_back(w.prefix[i].block);
    if (pages.size() != size_t(layout_.n_groups)) continue;
    {
      std::lock_guard lk(mu_);
      if (files_.contains(hashes[i])) continue;  // on disk, or queued
      if (queued_bytes_ + layout_.payload_bytes() > kMaxQueuedBytes) {
        ++stats_.write_failures;
        continue;
      }
      files_[hashes[i]] = {0, ++clock_};
    }
    Pending p;
    p.key.hash = hashes[i];
    p.key.has_parent = i > 0;
    p.key.parent = i > 0 ? hashes[i - 1] : 0;
    const auto t = std::span<const int32_t>(s.tokens).subspan(i * size_t(layout_.block_size), size_t(layout_.block_size));
    p.key.tokens.assign(t.begin(), t.end());
    p.payload.resize(layout_.payload_bytes());
    for (size_t g = 0; g < pages.size(); ++g) exec_.save_block(pages[g], p.payload.data() + g * pb);
    std::lock_guard lk(mu_);
    queued_bytes_ += p.payload.size();
    queue_.push_back(std::move(p));
  }
  std::lock_guard lk(mu_);
  stats_.capture_seconds += seconds_since(t0);
  wake_.notify_one();
}

void KvStore::writer_loop() {
  std::unique_lock lk(mu_);
  for (;;) {
    wake_.wait(lk, [&] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) break;  // stopping, all written
    Pending p = std::move(queue_.front());
    queue_.pop_front();
    writing_ = true;
    lk.unlock();
    write_one(p);
    lk.lock();
    queued_bytes_ -= p.payload.size();
    writing_ = false;
    if (queue_.empty()) idle_.notify_all();
  }
  idle_.notify_all();
}

void KvStore::write_one(Pending& p) {
  static std::atomic<uint64_t> serial{0};
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<std::byte> bytes = encode_kv_block(layout_, p.key, p.payload);
  const std::string path = path_of(p.key.hash);
  // A name of its own per writer, renamed into place whole: readers (here or
  // in another instance) see the old file or the new one, never a part.
  const std::string tmp = fmt::format("{}/.{:016x}.{}.{}.tmp", dir_, p.key.hash, ::getpid(), serial++);
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  bool ok = fd >= 0 && write_all(fd, bytes.data(), bytes.size());
  if (fd >= 0) ok = ::close(fd) == 0 && ok;
  ok = ok && ::rename(tmp.c_str(), path.c_str()) == 0;
  if (!ok) ::unlink(tmp.c_str());
  std::lock_guard lk(mu_);
  stats_.write_seconds += seconds_since(t0);
  auto it = files_.find(p.key.hash);
  if (!ok) {
    ++stats_.write_failures;
    if (it != files_.end() && it->second.bytes == 0) files_.erase(it);
    return;
  }
  ++stats_.blocks_written;
  stats_.bytes_written += bytes.size();
  FileInfo& f = files_[p.key.hash];
  stats_.bytes += int64_t(bytes.size()) - f.bytes;
  f.bytes = int64_t(bytes.size());
  f.used = ++clock_;
  evict_locked();
}

void KvStore::evict_locked() {
  while (stats_.bytes > max_bytes_ && !files_.empty()) {
    auto oldest = files_.end();
    for (auto it = files_.begin(); it != files_.end(); ++it)
      if (it->second.bytes > 0 && (oldest == files_.end() || it->second.used < oldest->second.used)) oldest = it;
    if (oldest == files_.end()) break;
    ::unlink(path_of(oldest->first).c_str());
    stats_.bytes -= oldest->second.bytes;
    files_.erase(oldest);
    ++stats_.blocks_evicted;
  }
}

void KvStore::flush() {
  std::unique_lock lk(mu_);
  idle_.wait(lk, [&] { return queue_.empty() && !writing_; });
}

KvStoreStats KvStore::stats() const {
  std::lock_guard lk(mu_);
  return stats_;
}

}  // namespace tandem

#include "model/repack_cache.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include <fmt/format.h>

namespace tandem {

namespace {

constexpr char kMagic[8] = {'T', 'N', 'D', 'R', 'P', 'K', '0', '1'};
constexpr size_t kAlign = 4096;  // every buffer starts on a page

size_t align_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

uint64_t fnv1a(std::string_view s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

// The header: magic, key length, key, buffer count, buffer sizes (u64 each,
// little-endian as the machine), then zeros up to the first page.
std::string header_bytes(const std::string& key, std::span<const size_t> sizes) {
  std::string h(kMagic, sizeof kMagic);
  auto put = [&](uint64_t v) { h.append(reinterpret_cast<const char*>(&v), sizeof v); };
  put(key.size());
  h += key;
  put(sizes.size());
  for (size_t s : sizes) put(s);
  h.resize(align_up(h.size()), '\0');
  return h;
}

size_t file_bytes(size_t header, std::span<const size_t> sizes) {
  size_t n = header;
  for (size_t s : sizes) n += align_up(s);
  return n;
}

bool write_all(int fd, const void* p, size_t n, off_t at) {
  const auto* b = static_cast<const uint8_t*>(p);
  while (n > 0) {
    const ssize_t w = ::pwrite(fd, b, n, at);
    if (w < 0 && errno == EINTR) continue;
    if (w == 0) errno = ENOSPC;
    if (w <= 0) return false;
    b += w, n -= static_cast<size_t>(w), at += w;
  }
  return true;
}

std::string stat_key(const char* path, bool with_inode) {
  struct stat st {};
  if (::stat(path, &st) != 0) return {};
  const auto mtime = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
  return with_inode ? fmt::format("{}:{} {} {}", st.st_dev, st.st_ino, st.st_size, mtime)
                    : fmt::format("{} {}", st.st_size, mtime);
}

}  // namespace

RepackCache::RepackCache(std::string dir, const std::string& model_path, std::string_view settings)
    : dir_(std::move(dir)) {
  const std::string model = stat_key(model_path.c_str(), true);
  const std::string exe = stat_key("/proc/self/exe", false);
  if (model.empty() || exe.empty()) return;  // no identity, no cache
  key_ = fmt::format("model {} | {} | exe {}", model, settings, exe);
  // One file per model file and settings: a new key (the model or the binary
  // changed) replaces the old file instead of piling up beside it.
  const std::string inode = model.substr(0, model.find(' '));
  path_ = (std::filesystem::path(dir_) / fmt::format("{:016x}.repack", fnv1a(fmt::format("{} | {}", inode, settings))))
              .string();
}

RepackCache::~RepackCache() {
  if (mapping_) ::munmap(mapping_, mapped_bytes_);
}

std::vector<const uint8_t*> RepackCache::open(std::span<const size_t> sizes) {
  if (path_.empty() || mapping_) return {};
  const int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return {};
  const std::string want = header_bytes(key_, sizes);
  const size_t total = file_bytes(want.size(), sizes);
  struct stat st {};
  std::string have(want.size(), '\0');
  const bool match = ::fstat(fd, &st) == 0 && static_cast<uint64_t>(st.st_size) == total &&
                     ::pread(fd, have.data(), have.size(), 0) == static_cast<ssize_t>(have.size()) && have == want;
  void* m = match ? ::mmap(nullptr, total, PROT_READ, MAP_SHARED, fd, 0) : MAP_FAILED;
  ::close(fd);
  if (m == MAP_FAILED) return {};
  mapping_ = m;
  mapped_bytes_ = total;
  std::vector<const uint8_t*> out;
  size_t at = want.size();
  for (size_t s : sizes) {
    out.push_back(static_cast<const uint8_t*>(m) + at);
    at += align_up(s);
  }
  return out;
}

std::string RepackCache::write(std::span<const std::span<const uint8_t>> buffers) const {
  if (path_.empty()) return "the model file's identity is unknown (stat failed)";
  std::error_code ec;
  std::filesystem::create_directories(dir_, ec);
  if (ec) return fmt::format("cannot create {}: {}", dir_, ec.message());
  std::vector<size_t> sizes;
  for (const auto& b : buffers) sizes.push_back(b.size());
  const std::string header = header_bytes(key_, sizes);
  const std::string tmp = fmt::format("{}.tmp.{}", path_, ::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return fmt::format("cannot create {}: {}", tmp, std::strerror(errno));
  // Allocated up front, so that a full disk fails here rather than as a
  // fault when the file is mapped (the padding stays holes otherwise).
  int err = ::posix_fallocate(fd, 0, static_cast<off_t>(file_bytes(header.size(), sizes)));
  if (err == 0 && !write_all(fd, header.data(), header.size(), 0)) err = errno ? errno : EIO;
  off_t at = static_cast<off_t>(header.size());
  for (const auto& b : buffers) {
    if (err != 0) break;
    if (!write_all(fd, b.data(), b.size(), at)) err = errno ? errno : EIO;
    at += static_cast<off_t>(align_up(b.size()));
  }
  if (::close(fd) != 0 && err == 0) err = errno;
  if (err == 0 && ::rename(tmp.c_str(), path_.c_str()) != 0) err = errno;
  if (err == 0) return "";
  ::unlink(tmp.c_str());
  return fmt::format("cannot write {}: {}", path_, std::strerror(err));
}

}  // namespace tandem

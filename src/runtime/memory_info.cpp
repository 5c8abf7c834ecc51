#include "runtime/memory_info.h"

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <sstream>

namespace tandem {
namespace {

std::optional<std::string> read_text(const char* path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A cgroup file holding one number ("max" means no limit).
std::optional<uint64_t> read_cgroup_value(const char* path) {
  const auto text = read_text(path);
  if (!text) return std::nullopt;
  try {
    return static_cast<uint64_t>(std::stoull(*text));
  } catch (const std::exception&) {
    return std::nullopt;  // "max", or unreadable
  }
}

}  // namespace

std::optional<uint64_t> parse_mem_available(const std::string& meminfo) {
  std::istringstream in(meminfo);
  std::string key, unit;
  unsigned long long kb = 0;
  while (in >> key >> kb) {
    std::getline(in, unit);
    if (key == "MemAvailable:") return static_cast<uint64_t>(kb) * 1024;
  }
  return std::nullopt;
}

std::optional<uint64_t> available_memory_bytes(std::optional<uint64_t> stand_in) {
  if (stand_in) return stand_in;
  std::optional<uint64_t> avail;
  if (const auto meminfo = read_text("/proc/meminfo")) avail = parse_mem_available(*meminfo);
  const auto limit = read_cgroup_value("/sys/fs/cgroup/memory.max");
  const auto current = read_cgroup_value("/sys/fs/cgroup/memory.current");
  if (limit && current) {
    const uint64_t room = *limit > *current ? *limit - *current : 0;
    avail = avail ? std::min(*avail, room) : room;
  }
  return avail;
}

}  // namespace tandem

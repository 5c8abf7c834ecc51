// How much memory this process can still take: what sizing checks compare a
// large allocation against before making it. Memory committed lazily (a KV
// pool from calloc, swap space filled on demand) is accepted by the kernel
// far beyond what exists, and the overrun shows up later as the OOM killer.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace tandem {

// The smaller of /proc/meminfo's MemAvailable and, inside a cgroup v2 with a
// memory limit, that limit less the group's current use. nullopt when neither
// can be read (not Linux, /proc not mounted). A `stand_in` (RuntimeOptions::
// memory_available: to try the checks on small sizes) is returned as it is.
std::optional<uint64_t> available_memory_bytes(std::optional<uint64_t> stand_in = std::nullopt);

// Parses MemAvailable (kB) out of /proc/meminfo's text; nullopt when absent.
std::optional<uint64_t> parse_mem_available(const std::string& meminfo);

}  // namespace tandem

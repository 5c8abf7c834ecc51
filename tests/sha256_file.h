// SHA-256 of a file, for tests that pin synthesized models to the hashes
// recorded by scripts/gen_arch_refs.py.
#pragma once

#include <cstdio>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "runtime/sha256.h"

namespace tandem::test {

inline std::string hex_digest(const std::array<uint8_t, 32>& d) {
  std::string s;
  for (uint8_t b : d) s += fmt::format("{:02x}", b);
  return s;
}

inline std::string sha256_file(const std::string& path) {
  Sha256 h;
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) return "cannot open " + path;
  std::vector<uint8_t> buf(1 << 20);
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), f)) > 0) h.update({buf.data(), n});
  std::fclose(f);
  return hex_digest(h.finish());
}

}  // namespace tandem::test

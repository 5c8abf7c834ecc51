#include "kv/block_hash.h"

#include <algorithm>
#include <cstdint>
#include <string>

#include "runtime/sha256.h"

namespace tandem {
namespace {

// A CBOR head: major type and argument in its shortest form (RFC 8949 4.2.1).
void head(std::string& out, uint8_t major, uint64_t v) {
  const uint8_t m = uint8_t(major << 5);
  if (v < 24) {
    out.push_back(char(m | v));
    return;
  }
  int bytes = v <= 0xff ? 1 : v <= 0xffff ? 2 : v <= 0xffffffffULL ? 4 : 8;
  out.push_back(char(m | (bytes == 1 ? 24 : bytes == 2 ? 25 : bytes == 4 ? 26 : 27)));
  for (int i = bytes - 1; i >= 0; --i) out.push_back(char((v >> (8 * i)) & 0xff));
}

uint64_t low64(const std::string& cbor) {
  Sha256 h;
  h.update(cbor);
  const auto d = h.finish();
  uint64_t v = 0;
  for (size_t i = 24; i < 32; ++i) v = v << 8 | d[i];
  return v;
}

}  // namespace

uint64_t root_block_hash(std::string_view seed) {
  std::string cbor;
  head(cbor, 3, seed.size());  // text string
  cbor.append(seed);
  return low64(cbor);
}

uint64_t chained_block_hash(uint64_t parent, std::span<const int32_t> tokens, std::string_view salt) {
  std::string cbor;
  cbor.reserve(16 + 5 * tokens.size());
  head(cbor, 4, 3);  // [parent, tokens, null]
  head(cbor, 0, parent);
  head(cbor, 4, tokens.size());
  for (int32_t t : tokens) head(cbor, 0, uint32_t(t));
  if (salt.empty()) {
    cbor.push_back(char(0xf6));  // null: no extra keys
  } else {
    head(cbor, 4, 1);  // [salt]
    head(cbor, 3, salt.size());
    cbor.append(salt);
  }
  return low64(cbor);
}

std::vector<uint64_t> prompt_block_hashes(std::span<const int32_t> tokens, int32_t block_size, std::string_view salt,
                                          size_t most) {
  std::vector<uint64_t> out;
  const size_t n = std::min(most, tokens.size() / size_t(block_size));
  out.reserve(n);
  uint64_t parent = root_block_hash("");
  for (size_t i = 0; i < n; ++i) {
    parent = chained_block_hash(parent, tokens.subspan(i * size_t(block_size), size_t(block_size)),
                                i == 0 ? salt : std::string_view());
    out.push_back(parent);
  }
  return out;
}

}  // namespace tandem

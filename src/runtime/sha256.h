// SHA-256 (FIPS 180-4), for hashes other programs must compute alike: the
// KV event block hashes routers match against their own.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

namespace tandem {

class Sha256 {
 public:
  Sha256();
  void update(std::span<const uint8_t> data);
  void update(std::string_view s) { update({reinterpret_cast<const uint8_t*>(s.data()), s.size()}); }
  std::array<uint8_t, 32> finish();  // the digest; the object is spent

 private:
  void block(const uint8_t* p);
  std::array<uint32_t, 8> h_;
  std::array<uint8_t, 64> buf_{};
  size_t used_ = 0;
  uint64_t bytes_ = 0;
};

}  // namespace tandem

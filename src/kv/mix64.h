// MurmurHash3's 64-bit finalizer: a bijection on 64 bits with full
// avalanche. The block manager's in-process prefix keys and the block
// format's checksum are built from it.
#pragma once

#include <cstdint>

namespace tandem {

inline uint64_t fmix64(uint64_t k) {
  k ^= k >> 33;
  k *= 0xff51afd7ed558ccdULL;
  k ^= k >> 33;
  k *= 0xc4ceb9fe1a85ec53ULL;
  k ^= k >> 33;
  return k;
}

}  // namespace tandem

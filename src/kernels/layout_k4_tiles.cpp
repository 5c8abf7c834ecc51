#include "kernels/layout_k4_tiles.h"

#include <cstring>

#include "quant/quant_blocks.h"

namespace tandem::k4_tiles {

static_assert(sizeof(BlockQ4K) == 144);

void write_block(const uint8_t* const rows[kRows], int64_t b, uint8_t* out) {
  for (int n = 0; n < kRows; ++n) {
    const BlockQ4K& x = reinterpret_cast<const BlockQ4K*>(rows[n])[b];
    std::memcpy(out + kD + 2 * n, &x.d, 2);
    std::memcpy(out + kDmin + 2 * n, &x.dmin, 2);
    for (int j = 0; j < 8; ++j) {
      uint8_t sc, m;
      k4_scale_min(j, x.scales, &sc, &m);
      out[kSc + 16 * j + n] = sc;
      out[kMins + 32 * (j / 2) + 2 * n + j % 2] = m;
    }
    // File: qs[32c + l] holds element 64c + l (low nibble) and 64c + 32 + l (high).
    uint8_t e[256];
    for (int c = 0; c < 4; ++c)
      for (int l = 0; l < 32; ++l) {
        e[64 * c + l] = x.qs[32 * c + l] & 0xF;
        e[64 * c + 32 + l] = x.qs[32 * c + l] >> 4;
      }
    for (int p = 0; p < 32; ++p)
      for (int i = 0; i < 4; ++i)
        out[kQ + 64 * p + 4 * n + i] = static_cast<uint8_t>(e[4 * p + i] | (e[128 + 4 * p + i] << 4));
  }
}

void read_block(const uint8_t* t, int n, uint8_t out[144]) {
  BlockQ4K x{};
  std::memcpy(&x.d, t + kD + 2 * n, 2);
  std::memcpy(&x.dmin, t + kDmin + 2 * n, 2);
  uint8_t sc[8], m[8];
  for (int j = 0; j < 8; ++j) {
    sc[j] = t[kSc + 16 * j + n];
    m[j] = t[kMins + 32 * (j / 2) + 2 * n + j % 2];
  }
  // The 6-bit packing k4_scale_min reads.
  for (int j = 0; j < 4; ++j) {
    x.scales[j] = static_cast<uint8_t>(sc[j] | ((sc[j + 4] >> 4) << 6));
    x.scales[j + 4] = static_cast<uint8_t>(m[j] | ((m[j + 4] >> 4) << 6));
    x.scales[j + 8] = static_cast<uint8_t>((sc[j + 4] & 0xF) | ((m[j + 4] & 0xF) << 4));
  }
  for (int k = 0; k < 256; ++k) {
    const uint8_t byte = t[kQ + 64 * ((k % 128) / 4) + 4 * n + k % 4];
    const int v = k < 128 ? byte & 0xF : byte >> 4;
    x.qs[32 * (k / 64) + k % 32] |= static_cast<uint8_t>(v << (4 * ((k / 32) % 2)));
  }
  std::memcpy(out, &x, 144);
}

}  // namespace tandem::k4_tiles

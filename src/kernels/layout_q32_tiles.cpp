#include "kernels/layout_q32_tiles.h"

#include <cstring>

#include "quant/quant_blocks.h"

namespace tandem::q32_tiles {

static_assert(sizeof(BlockQ4_0) == 18 && sizeof(BlockQ5_0) == 22);

// File: qs[j] holds element j (low nibble) and j + 16 (high), as the tiles'
// vectors do for 4c + i and 16 + 4c + i: byte 4c + i of a row's qs is byte i
// of vector c. q5_0's qh word has the fifth bit of element j at bit j.
void write_tile(const uint8_t* const rows[kRows], int64_t nb, bool q5, uint8_t* out) {
  const size_t bb = q5 ? sizeof(BlockQ5_0) : sizeof(BlockQ4_0), qs = q5 ? offsetof(BlockQ5_0, qs) : 2;
  for (int64_t b = 0; b < nb; ++b) {
    uint64_t h[8] = {};
    for (int n = 0; n < kRows; ++n) {
      const uint8_t* x = rows[n] + b * bb;
      std::memcpy(out + d_offset(b, q5) + 2 * n, x, 2);
      for (int c = 0; c < 4; ++c) std::memcpy(out + q_offset(nb, b, q5) + 64 * c + 4 * n, x + qs + 4 * c, 4);
      if (q5) {
        uint32_t qh;
        std::memcpy(&qh, x + offsetof(BlockQ5_0, qh), 4);
        for (int g = 0; g < 8; ++g) h[g] |= static_cast<uint64_t>((qh >> (4 * g)) & 0xF) << (4 * n);
      }
    }
    if (q5) std::memcpy(out + h_offset(nb, b), h, sizeof(h));
  }
}

void read_block(const uint8_t* tile, int64_t nb, bool q5, int n, int64_t b, uint8_t* out) {
  const size_t qs = q5 ? offsetof(BlockQ5_0, qs) : 2;
  std::memcpy(out, tile + d_offset(b, q5) + 2 * n, 2);
  for (int c = 0; c < 4; ++c) std::memcpy(out + qs + 4 * c, tile + q_offset(nb, b, q5) + 64 * c + 4 * n, 4);
  if (q5) {
    uint64_t h[8];
    std::memcpy(h, tile + h_offset(nb, b), sizeof(h));
    uint32_t qh = 0;
    for (int g = 0; g < 8; ++g) qh |= static_cast<uint32_t>((h[g] >> (4 * n)) & 0xF) << (4 * g);
    std::memcpy(out + offsetof(BlockQ5_0, qh), &qh, 4);
  }
}

}  // namespace tandem::q32_tiles

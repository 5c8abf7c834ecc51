#include "kernels/q40_tiles.h"

#include <cstring>

#include "core/blocks.h"

namespace tandem::q40_tiles {

static_assert(sizeof(BlockQ4_0) == 18);

// File: qs[j] holds element j (low nibble) and j + 16 (high), as the tiles'
// vectors do for 4c + i and 16 + 4c + i: byte 4c + i of a row's block is
// byte i of vector c.
void write_tile(const uint8_t* const rows[kRows], int64_t nb, uint8_t* out) {
  for (int64_t b = 0; b < nb; ++b)
    for (int n = 0; n < kRows; ++n) {
      const BlockQ4_0& x = reinterpret_cast<const BlockQ4_0*>(rows[n])[b];
      std::memcpy(out + d_offset(b) + 2 * n, &x.d, 2);
      for (int c = 0; c < 4; ++c) std::memcpy(out + q_offset(nb, b) + 64 * c + 4 * n, x.qs + 4 * c, 4);
    }
}

void read_block(const uint8_t* tile, int64_t nb, int n, int64_t b, uint8_t out[18]) {
  BlockQ4_0 x;
  std::memcpy(&x.d, tile + d_offset(b) + 2 * n, 2);
  for (int c = 0; c < 4; ++c) std::memcpy(x.qs + 4 * c, tile + q_offset(nb, b) + 64 * c + 4 * n, 4);
  std::memcpy(out, &x, 18);
}

}  // namespace tandem::q40_tiles

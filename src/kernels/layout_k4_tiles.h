// The q4_K "tiles" layout: the file's q4_K bytes of 16 weight rows
// rearranged so that one SIMD lane holds one row (kernels/layouts.h says
// when and why).
//
// In the file each row is a string of 144-byte super-blocks, and a decode
// kernel reading it one row at a time does most of its work outside the
// dot products: each row's 16-lane sums must be reduced horizontally, its
// 6-bit scales unpacked and spread, and its float chain runs in scalar FMAs:
// q4_K decode was compute-bound, below memory speed. Here a tile block holds super-block b of 16 rows with
// lane n = row 16t + n throughout, so the products for 16 rows take the
// same dpbusd count as for one row did, with no reductions, one 16-lane
// multiply per sub-block for the scales and one 16-lane FMA chain per term.
//
// Tile t (rows 16t .. 16t + 15), block b at t * tile_bytes(nb) + b * kBlockBytes:
//   kD     f16   d[16]
//   kDmin  f16   dmin[16]
//   kSc    uint8 sc[8][16]          scale of sub-block j, lane n
//   kMins  uint8 m[4][16][2]        mins of sub-blocks 2e and 2e+1, lane n
//   kQ     uint8 q[32][16][4]       nibbles: byte i of group p, lane n holds
//                                   element 4p + i (low nibble) and
//                                   128 + 4p + i (high nibble) of row n
// 2368 bytes per 16 x 256 weights against 2304 in the file (+2.8%: the
// scales and mins as bytes instead of 6 bits). Only whole tiles are
// rearranged; rows past the last one stay in the file.
#pragma once

#include <cstddef>
#include <cstdint>

namespace tandem::k4_tiles {

inline constexpr int kRows = 16;
inline constexpr size_t kD = 0;
inline constexpr size_t kDmin = 32;
inline constexpr size_t kSc = 64;
inline constexpr size_t kMins = kSc + 8 * 16;      // 192
inline constexpr size_t kQ = kMins + 4 * 16 * 2;   // 320 (64-byte aligned)
inline constexpr size_t kBlockBytes = kQ + 32 * 64;  // 2368

inline size_t tile_bytes(int64_t nb) { return static_cast<size_t>(nb) * kBlockBytes; }

// Tile block b of the tile holding row r.
inline const uint8_t* block(const uint8_t* tiles, int64_t nb, int64_t r, int64_t b) {
  return tiles + (r / kRows) * tile_bytes(nb) + static_cast<size_t>(b) * kBlockBytes;
}

// Writes super-block b of rows[0..15] (file layout) as one tile block.
void write_block(const uint8_t* const rows[kRows], int64_t b, uint8_t* out);
// The file's 144 bytes of lane n's super-block from a tile block (the
// inverse of write_block, byte for byte).
void read_block(const uint8_t* tile_block, int n, uint8_t out[144]);

}  // namespace tandem::k4_tiles

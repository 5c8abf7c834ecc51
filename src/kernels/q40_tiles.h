// The q4_0 "tiles" layout: the file's q4_0 bytes of 16 weight rows
// rearranged so that one SIMD lane holds one row, in exactly the file's size
// (kernels/prepack.h says when and why; kernels/k4_tiles.h is the same idea
// for q4_K).
//
// Tile t (rows 16t .. 16t + 15) is a string of steps of 4 blocks (128
// elements; the last step of a row may hold fewer). Step s with n blocks, at
// t * tile_bytes(nb) + s * kStepBytes:
//   + 32k            f16   d[16] of block 4s + k, lane n = row 16t + n
//   + 32n + 256k     uint8 q[4][16][4] of block 4s + k: byte i of vector c,
//                    lane n holds element 4c + i (low nibble) and
//                    16 + 4c + i (high nibble) of the block
// A full step is 1152 bytes (16 x 72), so its quants stay 64-byte aligned.
// Only whole tiles are rearranged; the rows past the last one stay in the file.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

namespace tandem::q40_tiles {

inline constexpr int kRows = 16;
inline constexpr int64_t kStepBlocks = 4;
inline constexpr size_t kBlockD = 32;                                  // 16 f16 scales
inline constexpr size_t kBlockQ = 256;                                 // 16 rows x 16 bytes
inline constexpr size_t kStepBytes = kStepBlocks * (kBlockD + kBlockQ);  // 1152

inline size_t tile_bytes(int64_t nb) { return static_cast<size_t>(nb) * kRows * 18; }
inline int64_t whole_tiles(int64_t rows) { return rows / kRows; }

// Blocks in step s of a row of nb blocks.
inline int64_t step_blocks(int64_t nb, int64_t s) { return std::min(kStepBlocks, nb - kStepBlocks * s); }

// Where block b's scales and quants are in its tile.
inline size_t d_offset(int64_t b) { return static_cast<size_t>(b / kStepBlocks) * kStepBytes + kBlockD * (b % kStepBlocks); }
inline size_t q_offset(int64_t nb, int64_t b) {
  const int64_t s = b / kStepBlocks;
  return static_cast<size_t>(s) * kStepBytes + kBlockD * step_blocks(nb, s) + kBlockQ * (b % kStepBlocks);
}

// Writes the whole tile of rows[0..15] (file layout, nb blocks each) to out.
void write_tile(const uint8_t* const rows[kRows], int64_t nb, uint8_t* out);
// The file's 18 bytes of block b of lane n from a tile (the inverse of
// write_tile, byte for byte).
void read_block(const uint8_t* tile, int64_t nb, int n, int64_t b, uint8_t out[18]);

}  // namespace tandem::q40_tiles

// The q4_0 / q5_0 "tiles" layout: the file's bytes of 16 weight rows
// rearranged so that one SIMD lane holds one row, in exactly the file's size
// (kernels/layouts.h says when and why; kernels/layout_k4_tiles.h is the same idea
// for q4_K).
//
// Tile t (rows 16t .. 16t + 15) is a string of steps of 4 blocks (128
// elements; the last step of a row may hold fewer). Step s with n blocks, at
// t * tile_bytes(nb, q5) + s * step_bytes(q5), holds for its block k:
//   + 32k                 f16    d[16], lane n = row 16t + n
//   + 32n + 256k          uint8  q[4][16][4]: byte i of vector c, lane n holds
//                                element 4c + i (low nibble) and 16 + 4c + i
//                                (high nibble) of the block
//   + 288n + 64k (q5_0)   uint64 h[8]: bit 4n + i of h[g] is the fifth bit
//                                of element 4g + i of row n (a byte mask for
//                                the quants of k-group g)
// A full step is 1152 (q4_0) or 1408 (q5_0) bytes, 16 x 4 blocks, so every
// field of a full step stays 64-byte aligned. Only whole tiles are
// rearranged; the rows past the last one stay in the file.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

namespace tandem::q32_tiles {

inline constexpr int kRows = 16;
inline constexpr int64_t kStepBlocks = 4;
inline constexpr size_t kBlockD = 32;   // 16 f16 scales
inline constexpr size_t kBlockQ = 256;  // 16 rows x 16 bytes of nibbles
inline constexpr size_t kBlockH = 64;   // q5_0: 8 masks of 64 bits

inline size_t block_bytes(bool q5) { return kBlockD + kBlockQ + (q5 ? kBlockH : 0); }  // 288, 352
inline size_t step_bytes(bool q5) { return kStepBlocks * block_bytes(q5); }
inline size_t tile_bytes(int64_t nb, bool q5) { return static_cast<size_t>(nb) * block_bytes(q5); }

// Blocks in step s of a row of nb blocks.
inline int64_t step_blocks(int64_t nb, int64_t s) { return std::min(kStepBlocks, nb - kStepBlocks * s); }

// Where block b's fields are in its tile.
inline size_t d_offset(int64_t b, bool q5) {
  return static_cast<size_t>(b / kStepBlocks) * step_bytes(q5) + kBlockD * (b % kStepBlocks);
}
inline size_t q_offset(int64_t nb, int64_t b, bool q5) {
  const int64_t s = b / kStepBlocks;
  return static_cast<size_t>(s) * step_bytes(q5) + kBlockD * step_blocks(nb, s) + kBlockQ * (b % kStepBlocks);
}
inline size_t h_offset(int64_t nb, int64_t b) {
  const int64_t s = b / kStepBlocks;
  return static_cast<size_t>(s) * step_bytes(true) + (kBlockD + kBlockQ) * step_blocks(nb, s) +
         kBlockH * (b % kStepBlocks);
}

// Writes the whole tile of rows[0..15] (file layout, nb blocks of q4_0, or of
// q5_0 when q5) to out.
void write_tile(const uint8_t* const rows[kRows], int64_t nb, bool q5, uint8_t* out);
// The file's bytes of block b of lane n from a tile (the inverse of
// write_tile, byte for byte; 18 or 22 bytes).
void read_block(const uint8_t* tile, int64_t nb, bool q5, int n, int64_t b, uint8_t* out);

}  // namespace tandem::q32_tiles

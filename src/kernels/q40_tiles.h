// The q4_0 "tiles" layout: the file's bytes of a q4_0 matrix in another
// order, same size (kernels/prepack.h says when and why).
//
// The AVX-512 q4_0 kernel reads 16 weight rows side by side, 4 blocks (72
// bytes) of each per step. In the file's row-major order that is 16 streams
// 1-3 KB apart; here each step's 16 x 72 bytes lie together, the steps of a
// tile in order and the tiles in order, so a thread reads one stream:
//
//   tile t (weight rows 16t .. 16t + 15), step s (blocks 4s .. 4s + 3):
//     at t * tile_bytes(nb) + s * kStepBytes, row j's 72 bytes at + 72 j
//
// A last step of n < 4 blocks keeps its rows n * 18 bytes apart. Only whole
// tiles are rearranged; the rows past the last one stay in the file.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "core/blocks.h"

namespace tandem::q40_tiles {

inline constexpr int kRows = 16;
inline constexpr int64_t kStepBlocks = 4;
inline constexpr size_t kRowStepBytes = kStepBlocks * sizeof(BlockQ4_0);  // 72
inline constexpr size_t kStepBytes = kRows * kRowStepBytes;               // 1152

inline size_t tile_bytes(int64_t nb) { return static_cast<size_t>(nb) * kRows * sizeof(BlockQ4_0); }
inline int64_t whole_tiles(int64_t rows) { return rows / kRows; }

// Blocks in step s of a row of nb blocks.
inline int64_t step_blocks(int64_t nb, int64_t s) { return std::min(kStepBlocks, nb - kStepBlocks * s); }

// Row j's first block of step s: the step's start plus j * step_row_bytes.
inline size_t step_offset(int64_t s) { return static_cast<size_t>(s) * kStepBytes; }
inline size_t step_row_bytes(int64_t nb, int64_t s) {
  return static_cast<size_t>(step_blocks(nb, s)) * sizeof(BlockQ4_0);
}

// Block b of weight row r (r in a whole tile) of a matrix of nb blocks per row.
inline const uint8_t* block(const uint8_t* tiles, int64_t nb, int64_t r, int64_t b) {
  const int64_t s = b / kStepBlocks;
  return tiles + (r / kRows) * tile_bytes(nb) + step_offset(s) + (r % kRows) * step_row_bytes(nb, s) +
         (b % kStepBlocks) * sizeof(BlockQ4_0);
}

}  // namespace tandem::q40_tiles

// The f16 / bf16 "tiles" layout: the file's rows interleaved four at a time
// in 16-element chunks, so that one sequential stream feeds four
// independent FMA chains (kernels/layouts.h says when it is used).
//
// Every float product keeps one 16-lane accumulator per (weight row,
// activation row), stepping through K in chunks of 16 and reduced by
// product_kernels.h's tree at the end: that order is what makes a row's result the
// same in decode and prefill. With one activation row, one weight row's
// chain advances once per FMA latency, which holds a core's decode below
// memory speed; four rows side by side hide the latency but read four
// streams, which a hardware prefetcher follows worse than one. Here the
// four rows' chunks alternate in memory: one stream, four chains, the same
// arithmetic (docs/performance.md has the measurements).
//
// Whole 16-row tiles of a matrix whose width is a multiple of 16, from
// W.tiles() (rows past the last whole tile stay in the file): the group of
// rows 4g .. 4g + 3 starts at g * 4 * row_bytes, and in it chunk c of row
// 4g + i (elements 16c .. 16c + 15, the file's bytes) is at
// (4c + i) * chunk_bytes. Exactly the file's size.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace tandem::float_tiles {

inline constexpr int kGroupRows = 4;
inline constexpr int64_t kChunk = 16;  // elements

// Bytes of one chunk of one row, and of one chunk of a group (what one
// step of a 4-row product reads).
inline constexpr size_t chunk_bytes(size_t elem_bytes) { return kChunk * elem_bytes; }
inline constexpr size_t group_step(size_t elem_bytes) { return kGroupRows * chunk_bytes(elem_bytes); }

// Where row r's first chunk is: its later chunks follow every group_step bytes.
inline const uint8_t* row_start(const uint8_t* tiles, int64_t cols, size_t elem_bytes, int64_t r) {
  const int64_t g = r / kGroupRows, i = r % kGroupRows;
  return tiles + static_cast<size_t>(g) * kGroupRows * cols * elem_bytes +
         static_cast<size_t>(i) * chunk_bytes(elem_bytes);
}

// Writes group g (rows 4g .. 4g + 3 of rows, in file layout) to its place.
template <size_t kElemBytes>
void write_group(const uint8_t* const rows[kGroupRows], int64_t cols, uint8_t* tiles, int64_t g) {
  constexpr size_t cb = chunk_bytes(kElemBytes);  // a constant: the copies inline
  uint8_t* out = tiles + static_cast<size_t>(g) * kGroupRows * cols * kElemBytes;
  for (int64_t c = 0; c < cols / kChunk; ++c)
    for (int i = 0; i < kGroupRows; ++i, out += cb) std::memcpy(out, rows[i] + c * cb, cb);
}

}  // namespace tandem::float_tiles

// A view of a 2-D matrix stored row by row in any tensor type (the layout of
// a GGUF weight: ne0 = cols is contiguous, ne1 = rows).
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/ggml_type.h"

namespace tandem {

struct WeightMatrix {
  GgmlType type = GgmlType::F32;
  const uint8_t* data = nullptr;
  int64_t cols = 0;
  int64_t rows = 0;
  size_t row_stride = 0;  // bytes
  // The same weights already in the tiled kernels' panel layout (see
  // kernels/layouts.h), or null. When set, products read only these.
  const uint8_t* packed = nullptr;
  // The same q4_0 / q5_0 / q4_K weights rearranged in 16-row tiles for the decode
  // kernels (kernels/layout_q32_tiles.h, kernels/layout_k4_tiles.h), or null. When set,
  // products read the whole 16-row tiles from here and only the rows past
  // them from data.
  const uint8_t* tiles = nullptr;
  const uint8_t* row(int64_t r) const { return data + r * row_stride; }
  explicit operator bool() const { return data != nullptr; }
};

}  // namespace tandem

// A view of a 2-D weight matrix: the file's rows (a GGUF weight: ne0 = cols
// is contiguous, ne1 = rows, in any tensor type), and the layout the products
// read it in, chosen once at load (kernels/products.h).
#pragma once

#include <cstddef>
#include <cstdint>

#include "quant/ggml_type.h"

namespace tandem {

enum class WeightLayout : uint8_t {
  kFileRows,  // the file's rows, read in place
  kPanels,    // every row in the products' panels (kernels/layout_panels.h)
  kTiles,     // the whole 16-row tiles rearranged one lane per row (kernels/layout_*_tiles.h);
              // the rows past the last whole tile stay in the file's rows
};

struct WeightMatrix {
  GgmlType type = GgmlType::F32;
  const uint8_t* data = nullptr;  // the file's rows
  int64_t cols = 0;
  int64_t rows = 0;
  size_t row_stride = 0;  // bytes
  WeightLayout layout = WeightLayout::kFileRows;
  const uint8_t* repacked = nullptr;  // the buffer of a kPanels or kTiles layout

  const uint8_t* row(int64_t r) const { return data + r * row_stride; }
  // The panels or the tiles; null in any other layout.
  const uint8_t* panels() const { return layout == WeightLayout::kPanels ? repacked : nullptr; }
  const uint8_t* tiles() const { return layout == WeightLayout::kTiles ? repacked : nullptr; }
  void set_layout(WeightLayout l, const uint8_t* buf) {
    layout = l;
    repacked = l == WeightLayout::kFileRows ? nullptr : buf;
  }
  explicit operator bool() const { return data != nullptr; }
};

}  // namespace tandem

// Which kernel computes a linear layer, decided in one place.
//
// A weight matrix's layout is data, chosen once at load (choose_layout): the
// file's rows, panels (16 weight rows with one SIMD lane per row, quants
// unpacked to bytes: product_kernels.h, layout_panels.h) or tiles (16 rows
// with one lane per row at the file's width: layout_*_tiles.h). For each
// product, select_product() picks how it runs from the weight type, that
// layout, the number of activation rows and the instruction-set level. Both
// read one table of the weight types (products.cpp): their product class,
// which layouts they have at which level, and up to how many activation rows
// the row kernels stay ahead of panels. `tandem inspect FILE --plan` prints
// the choices for every matrix of a model (model/plan.h).
//
// Every route gives the same bits (product_kernels.h): only speed and
// memory depend on the choice.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "runtime/cpu_features.h"
#include "runtime/options.h"
#include "quant/tensor.h"
#include "kernels/product_kernels.h"
#include "kernels/stream_tuning.h"
#include "kernels/vec_dot.h"

namespace tandem {

enum class ProductRoute {
  kVecDot,  // one vec_dot per output: weight types without product kernels
  kRows,    // row kernels reading the weights where they are (the file's rows,
            // or the tiles): each weight byte streamed once for all rows, the
            // decode shape
  kPanels,  // 16-row panels, each used by every activation row while it is in
            // L1: packed per call, or read as repacked at load (the prefill
            // shape)
};

struct Product {
  ProductRoute route = ProductRoute::kVecDot;
  KernelLevel level = KernelLevel::kScalar;
  WeightLayout layout = WeightLayout::kFileRows;
  GemmKernel kernel;       // the level's functions (kRows, kPanels)
  VecDotFn dot = nullptr;  // kVecDot
  bool pairs = false;      // kPanels: two panels (32 weight rows) per kernel call
  // Read as repacked at load (true) or packed by every call (kPanels only).
  bool prepacked() const { return route == ProductRoute::kPanels && layout == WeightLayout::kPanels; }
  // "rows", "tile rows", "panels", "packed panels", "panel pairs", "vec_dot", with the level.
  std::string name() const;
};

// The product of a `type` matrix stored in `layout` with `rows` activation
// rows at `level` (which the CPU must run; throws kInvalidArgument
// otherwise, and for a layout the level's kernels do not read).
Product select_product(GgmlType type, WeightLayout layout, int64_t rows, KernelLevel level,
                       const StreamTuning& tuning);

// The layout `mode` gives W at load for the kernels of `level`, and the bytes
// of its buffer (0 for the file's rows): panels for every row (q8_0 under
// kAuto, every quantized type under kAll), else tiles for the whole 16-row
// tiles where that level's kernels read them (q4_0, q5_0, q4_K, f16 and bf16
// at AVX-512 VNNI), else the file's rows.
struct LayoutChoice {
  WeightLayout layout = WeightLayout::kFileRows;
  size_t bytes = 0;
};
LayoutChoice choose_layout(const WeightMatrix& W, KernelLevel level, PrepackMode mode);

const char* weight_layout_name(WeightLayout layout);  // "rows", "panels", "tiles"

}  // namespace tandem

// The table of the weight types' products, and the two functions that read
// it: choose_layout at load, select_product for every product.
#include "kernels/products.h"

#include <fmt/format.h>

#include "core/error.h"
#include "kernels/layouts.h"

namespace tandem {
namespace {

// Row kernels for any number of rows (the float class has no panels).
constexpr int64_t kAnyRows = INT64_MAX;

struct TypeRow {
  GgmlType type;
  GemmClass cls;
  // Up to this many activation rows the row kernels stay ahead of packing
  // panels, reading the file's rows / the tiles (0: no tiles layout).
  // Measured with kernels_bench; docs/performance.md has the numbers.
  int64_t rows_max;
  int64_t tile_rows_max;
  // --prepack auto gives it panels: they are the file's size, so decode
  // reads no more bytes and the file's pages go.
  bool panels_in_auto;
};

constexpr TypeRow kTable[] = {
    // type          class               rows      tile rows  panels in auto
    {GgmlType::Q4_0, GemmClass::kQ32,    2,        16,        false},
    {GgmlType::Q5_0, GemmClass::kQ32,    2,        8,         false},
    {GgmlType::Q8_0, GemmClass::kQ32,    2,        0,         true},
    {GgmlType::Q4_K, GemmClass::kK4,     5,        64,        false},
    {GgmlType::Q5_K, GemmClass::kK4,     5,        0,         false},
    {GgmlType::Q6_K, GemmClass::kK6,     5,        0,         false},
    {GgmlType::F32,  GemmClass::kFloat,  kAnyRows, 0,         false},
    {GgmlType::F16,  GemmClass::kFloat,  kAnyRows, kAnyRows,  false},
    {GgmlType::BF16, GemmClass::kFloat,  kAnyRows, kAnyRows,  false},
};

// The tiles' kernels are AVX-512 VNNI ones.
constexpr KernelLevel kTilesLevel = KernelLevel::kAvx512Vnni;

const TypeRow* row_of(GgmlType t) {
  for (const TypeRow& r : kTable)
    if (r.type == t) return &r;
  return nullptr;
}

bool has_tiles(const TypeRow* r, KernelLevel level) { return r && r->tile_rows_max > 0 && level >= kTilesLevel; }

}  // namespace

GemmClass gemm_class(GgmlType w) {
  const TypeRow* r = row_of(w);
  return r ? r->cls : GemmClass::kNone;
}

GemmKernel gemm_kernel(GgmlType w, KernelLevel level) {
  const TypeRow* row = row_of(w);
  if (!row) return {};
  if (!cpu_supports_level(level))
    fail(ErrorKind::kInvalidArgument, "kernel level {} is not supported by this CPU", kernel_level_name(level));
  // The best level that has kernels for the type, at or below `level`.
  GemmKernel k;
  if (level >= KernelLevel::kAvx512Vnni) k = gemm_detail::avx512_kernel(w);
  if (!k && level >= KernelLevel::kAvx2)
    k = gemm_detail::avx2_kernel(w, cpu_supports_level(KernelLevel::kAvx2Vnni) && level != KernelLevel::kAvx2 &&
                                        level != KernelLevel::kAvx512);
  if (!k) k = gemm_detail::ref_kernel(w);
  k.reads_tiles = has_tiles(row, level);
  return k;
}

Product select_product(GgmlType type, WeightLayout layout, int64_t rows, KernelLevel level,
                       const StreamTuning& tuning) {
  Product p;
  p.level = level;
  p.layout = layout;
  p.kernel = gemm_kernel(type, level);
  const TypeRow* row = row_of(type);
  if (layout == WeightLayout::kTiles && !p.kernel.reads_tiles)
    fail(ErrorKind::kInvalidArgument, "matmul: {} weights in the tiles layout need the AVX-512 kernels, not {}",
         type_traits(type).name, kernel_level_name(level));
  if (!p.kernel) {
    p.dot = vec_dot_fn_for_level(type, level);
    return p;
  }
  const bool panels = p.kernel.run != nullptr;
  if (layout == WeightLayout::kPanels && panels) {
    p.route = ProductRoute::kPanels;
  } else {
    const int64_t rows_max = layout == WeightLayout::kTiles ? row->tile_rows_max : row->rows_max;
    p.route = panels && rows > rows_max ? ProductRoute::kPanels : ProductRoute::kRows;
  }
  p.pairs = p.route == ProductRoute::kPanels && p.kernel.run2 != nullptr && tuning.panel_pair_min_rows > 0 &&
            rows >= tuning.panel_pair_min_rows;
  return p;
}

LayoutChoice choose_layout(const WeightMatrix& W, KernelLevel level, PrepackMode mode) {
  const TypeRow* row = row_of(W.type);
  if (mode == PrepackMode::kOff || !row || W.rows <= 0) return {};
  if (mode == PrepackMode::kAll || row->panels_in_auto)
    if (const size_t b = layout_bytes(W, WeightLayout::kPanels)) return {WeightLayout::kPanels, b};
  if (has_tiles(row, level))
    if (const size_t b = layout_bytes(W, WeightLayout::kTiles)) return {WeightLayout::kTiles, b};
  return {};
}

const char* weight_layout_name(WeightLayout layout) {
  static constexpr const char* kNames[] = {"rows", "panels", "tiles"};  // in WeightLayout's order
  return kNames[static_cast<int>(layout)];
}

std::string Product::name() const {
  const char* what = "vec_dot";
  switch (route) {
    case ProductRoute::kVecDot: break;
    case ProductRoute::kRows: what = layout == WeightLayout::kTiles ? "tile rows" : "rows"; break;
    case ProductRoute::kPanels:
      what = layout == WeightLayout::kPanels ? (pairs ? "panel pairs" : "panels")
                                             : (pairs ? "packed panel pairs" : "packed panels");
      break;
  }
  return fmt::format("{} {}", what, kernel_level_name(level));
}

}  // namespace tandem

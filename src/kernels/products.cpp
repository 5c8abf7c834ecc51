// The table of the weight types' products: what each type is, which
// functions run it at each instruction-set level (from the builds,
// kernels/kernel_builds.h), and the functions that read it: choose_layout at
// load, select_product for every product, gemm_kernel, vec_dot_fn_for_level
// and gemm_prepare_acts for their slots.
#include "kernels/products.h"

#include <array>

#include <fmt/format.h>

#include "core/error.h"
#include "quant/quant_blocks.h"
#include "kernels/kernel_builds.h"
#include "kernels/layout_panels.h"
#include "kernels/layouts.h"
#include "kernels/vec_dot_impl.h"

namespace tandem {
namespace {

// Row kernels for any number of rows (the float class has no panels).
constexpr int64_t kAnyRows = INT64_MAX;

struct TypeRow {
  GgmlType type;
  GemmClass cls;  // kNone: vec_dot only
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
    {GgmlType::Q4_1, GemmClass::kNone,   0,        0,         false},
    {GgmlType::Q5_1, GemmClass::kNone,   0,        0,         false},
    {GgmlType::Q2_K, GemmClass::kNone,   0,        0,         false},
    {GgmlType::Q3_K, GemmClass::kNone,   0,        0,         false},
    {GgmlType::MXFP4, GemmClass::kQ32,   2,        0,         false},
};
constexpr size_t kTypes = std::size(kTable);

// The tiles' kernels are AVX-512 VNNI ones.
constexpr KernelLevel kTilesLevel = KernelLevel::kAvx512Vnni;

const TypeRow* row_of(GgmlType t) {
  for (const TypeRow& r : kTable)
    if (r.type == t) return &r;
  return nullptr;
}

bool has_tiles(const TypeRow* r, KernelLevel level) { return r && r->tile_rows_max > 0 && level >= kTilesLevel; }

constexpr size_t kLevels = std::size(kAllKernelLevels);

// The functions of every (type, level), resolved once.
const TypeFns& fns_of(const TypeRow& row, KernelLevel level) {
  static const auto table = [] {
    std::array<std::array<TypeFns, kLevels>, kTypes> t{};
    for (size_t i = 0; i < kTypes; ++i)
      for (size_t l = 0; l < kLevels; ++l) t[i][l] = type_fns(kTable[i].type, kAllKernelLevels[l]);
    return t;
  }();
  return table[static_cast<size_t>(&row - kTable)][static_cast<size_t>(level)];
}

void check_level(KernelLevel level) {
  if (!cpu_supports_level(level))
    fail(ErrorKind::kInvalidArgument, "kernel level {} is not supported by this CPU", kernel_level_name(level));
}

}  // namespace

GemmClass gemm_class(GgmlType w) {
  const TypeRow* r = row_of(w);
  return r ? r->cls : GemmClass::kNone;
}

GemmKernel gemm_kernel(GgmlType w, KernelLevel level) {
  const TypeRow* row = row_of(w);
  if (!row || row->cls == GemmClass::kNone) return {};
  check_level(level);
  const TypeFns& f = fns_of(*row, level);
  GemmKernel k;
  k.cls = row->cls;
  k.block_elems = k.cls == GemmClass::kQ32 ? kQK : k.cls == GemmClass::kFloat ? 1 : kQKK;
  k.panel_block_bytes = gemm_detail::panel_block_bytes(k.cls);
  k.pack = f.pack;
  k.run = f.run;
  k.run2 = f.run2;
  k.rows = f.rows;
  k.reads_tiles = has_tiles(row, level);
  return k;
}

VecDotFn vec_dot_fn_for_level(GgmlType w, KernelLevel level) {
  const TypeRow* row = row_of(w);
  if (!row) fail(ErrorKind::kUnsupported, "no dot product for weight type id {}", static_cast<uint32_t>(w));
  check_level(level);
  return fns_of(*row, level).dot;
}

void gemm_prepare_acts(const float* x, int64_t ldx, int64_t g0, int64_t g1, GemmActs& acts, KernelLevel level) {
  // Types without product kernels have no activations layout: nothing to do.
  if (const TypeRow* row = row_of(acts.wtype))
    if (const GemmPrepareFn prepare = fns_of(*row, level).prepare) prepare(x, ldx, g0, g1, acts);
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
  if (mode == PrepackMode::kOff || !row || row->cls == GemmClass::kNone || W.rows <= 0) return {};
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

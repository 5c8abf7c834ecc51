// The layouts weights are rearranged into once at load, and how to write and
// read them (which matrix gets which: kernels/products.h, choose_layout).
//
// Panels (kernels/layout_panels.h): 16 weight rows with one SIMD lane per
// row and the quants unpacked to bytes, what the products' panel kernels
// read. Matmul packs them on every call of a prefill-shaped product; with a
// handful of rows (a serving step of a few decoding sequences) that packing
// is most of the work. q8_0 panels are the file's size (f16 scales), so they
// can replace the file's bytes for every product, decode included. For the 4-
// and 5-bit types a panel is 1.5-2x the file (quants as bytes), which would
// raise what decode reads; only --prepack all makes those.
//
// Tiles: 16 rows with one lane per row at the file's width (q4_0, q5_0:
// kernels/layout_q32_tiles.h; q4_K: layout_k4_tiles.h, +2.8%; f16 / bf16:
// layout_float_tiles.h, four rows interleaved in 16-element chunks), read by
// the AVX-512 VNNI kernels. A decode thread then reads one stream that feeds
// 16 rows' dot products (4 FMA chains for the floats) without horizontal
// reductions, and prefill packs its panels from the tiles as from the rows.
//
// Every layout gives the file layout's bits: the arithmetic is the same.
#pragma once

#include <cstddef>
#include <cstdint>

#include "runtime/cpu_features.h"
#include "quant/tensor.h"

namespace tandem {

class ThreadPool;

// Bytes of W's buffer in `layout`: panels for every row (rows past the last
// are zeros in its last tile), tiles for the whole 16-row tiles; 0 where the
// type has no such layout (no panels for the float types and the vec_dot-only
// ones; tiles only for q4_0, q5_0, q4_K, and f16 / bf16 of a width that is a
// multiple of 16; no tiles for fewer than 16 rows), and for kFileRows.
size_t layout_bytes(const WeightMatrix& W, WeightLayout layout);
// The 16-row tiles of that buffer: panels ceil(rows / 16), tiles floor(rows / 16).
int64_t layout_tile_count(const WeightMatrix& W, WeightLayout layout);
// Writes tiles [t0, t1) of W's buffer in `layout` (tile t: weight rows 16t ..
// 16t + 15, at out + t * (layout_bytes / tile count)) from W's file rows, with
// the packers of `level`: a large matrix can then be written a slice at a
// time and its file pages released as it goes.
void write_layout(const WeightMatrix& W, WeightLayout layout, KernelLevel level, uint8_t* out, int64_t t0,
                  int64_t t1, ThreadPool& pool);
// Row r of W as floats, read from its layout where that holds it (q4_0 / q5_0
// / q8_0 panels, tiles) and from the file's rows otherwise; equal to
// dequantize_row of the file's row, so an embedding lookup need not touch
// released pages. `file_row`: the row's bytes where the caller has read them
// itself (a lookup reads scattered rows rather than faulting them in); used
// only where the layout holds no copy of the row.
void dequantize_weight_row(const WeightMatrix& W, int64_t r, float* out, const uint8_t* file_row = nullptr);

}  // namespace tandem

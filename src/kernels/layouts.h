// Weights repacked once at load into the tiled kernels' panel layout.
//
// The packed path of Matmul converts each 16-row tile of a quantized matrix
// into a panel (one SIMD lane per weight row) on every call. With many
// activation rows (prefill) that is a few percent of the work; with a handful
// (a serving step of 3-30 decoding sequences) it is most of it: the panel is
// built, used for a few rows, and thrown away. For q8_0 a panel is 544 bytes
// per 16 x 32 weights, as in the file (f16 scales, layout_panels.h), so the panels can
// simply replace the file's bytes: every product, decode included, then reads
// the panels, and the file's pages are dropped from memory. For the 4- and
// 5-bit types a panel is twice their file size (quants unpacked to bytes),
// which would double what decode reads; they stay in the file.
//
// q4_0, q5_0 and q4_K get a cheaper rearrangement instead where the kernels
// read it (AVX-512), the "tiles" layouts (kernels/layout_q32_tiles.h, layout_k4_tiles.h):
// 16 rows with one SIMD lane per row, quants kept at their width (the
// file's size; q4_K +2.8%), one stream per thread as from the q8_0 panels.
// Decode then does 16 rows' work per dot product instead of one row's plus
// a reduction (the row-wise q4_K kernel was compute-bound at ~14 GB/s a
// core), and batched steps of up to 16-64 rows need no panels packed.
// Prefill packs its panels from the tiles as it did from the rows.
//
// f16 and bf16 matrices get tiles too (kernels/layout_float_tiles.h): four rows
// interleaved in 16-element chunks, the file's size, so a decode thread
// reads one stream into four FMA chains instead of one row's single chain,
// which the FMA latency held below memory speed. The arithmetic is the
// file layout's, so products are bit-identical either way.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "core/tensor.h"
#include "kernels/vec_dot_impl.h"

namespace tandem {

class ThreadPool;

// Which matrices a model repacks at load:
//   kOff:  none (every weight read from the file);
//   kAuto: those whose new layout is no larger than the file, or barely
//          (q8_0 panels; q4_0, q5_0, q4_K, f16, bf16 tiles): faster, no
//          more memory, but a longer load (fresh memory is written);
//   kAll:  also every other type with panels (q4_0/q5_0 at twice/1.5x their
//          file size, the K-quants at 1.5-2.2x): batched decode (serving)
//          stops packing on every step, for more memory and more bytes per
//          decoded token. Pays off where the row kernels, not memory, are the
//          limit: small models (Gemma 3 270M: 16-row steps +24%, one stream
//          +7%, +43 MiB), not large K-quant ones (1.1B Q4_K_M: one stream -44%).
enum class PrepackMode { kOff, kAuto, kAll };
PrepackMode parse_prepack_mode(std::string_view name);  // "off", "auto", "all"; throws otherwise

// Bytes of W's panels when `mode` repacks W at `level`; 0 otherwise.
size_t prepacked_bytes(const WeightMatrix& W, KernelLevel level, PrepackMode mode = PrepackMode::kAuto);

// Writes every panel of W to out (prepacked_bytes(W, level) bytes, 64-byte
// aligned): tile t's block b at out + (t * blocks_per_row + b) * panel bytes.
void prepack(const WeightMatrix& W, KernelLevel level, uint8_t* out, ThreadPool& pool);
// Row r of a prepacked (q4_0 / q5_0 / q8_0 panels) or tiled W as floats,
// equal to dequantize_row of the file's row (so an embedding lookup need not
// touch the released pages).
void dequantize_prepacked_row(const WeightMatrix& W, KernelLevel level, int64_t r, float* out);
// The same for tiles [t0, t1) only (tile t = weight rows 16t .. 16t + 15), so
// a caller can release the file's pages of a large matrix as it goes.
void prepack_tiles(const WeightMatrix& W, KernelLevel level, uint8_t* out, int64_t t0, int64_t t1, ThreadPool& pool);

// Bytes of W's whole 16-row tiles in its tiles layout (q4_0, q5_0:
// kernels/layout_q32_tiles.h, q4_K: kernels/layout_k4_tiles.h, f16 / bf16 of a width
// that is a multiple of 16: kernels/layout_float_tiles.h) when the kernels at
// `level` read it; 0 otherwise (other types, fewer than 16 rows).
size_t tiles_bytes(const WeightMatrix& W, KernelLevel level);
// Writes tiles [t0, t1) of W (whole tiles only) in that layout to out.
void write_tiles(const WeightMatrix& W, uint8_t* out, int64_t t0, int64_t t1, ThreadPool& pool);

}  // namespace tandem

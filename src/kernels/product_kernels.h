// Matrix products for the linear layers (used by Matmul), in two shapes that
// give bit-identical results.
//
// Quantized weights (q4_0, q5_0, q8_0, mxfp4 with q8_0 activations; q4_K,
// q5_K, q6_K with q8_K activations): every output is a single chain of float
// operations over the blocks of its row, in block order, fed with exact
// integer block sums:
//   q4_0, q5_0, q8_0, mxfp4, per 32-block b:
//     S = sum w_q * a_q (int32);  acc = fma(float(S), dw_b * da_b, acc)
//     (mxfp4: w_q its code's value doubled, kMxfp4Values; dw_b = 2^(e - 128))
//   q4_K, q5_K, per 256-superblock b, 8 sub-blocks j of 32:
//     I = sum_j sc_j * S_j;  M = sum_j m_j * (bsum_2j + bsum_2j+1)
//     acc = fma(float(I), dw * da, acc);  acc = fma(-float(M), dminw * da, acc)
//   q6_K, 16 groups j of 16:  I = sum_j sc_j * S_j (signed quants)
//     acc = fma(float(I), dw * da, acc)
// with acc starting at +0. Many activation rows (prefill) take the packed
// path: tiles of kGemmTile = 16 weight rows are packed into panels with one
// SIMD lane per weight row, and a kernel multiplies a panel by up to 8
// activation rows (broadcast), each weight vector loaded once for all of
// them, no horizontal sums. A few rows (decode) take the row-wise path, which
// streams each weight row once in file order, gets the same block sums with
// lanes along the row, and runs the same chain in scalar code.
//
// Float weights (f32, f16, bf16; activations rounded to the weight type):
// 16 interleaved partial sums, p_j = fma(w_k, a_k, p_j) for k = j (mod 16) in
// increasing k, then a fixed halving tree: q_j = p_j + p_j+8, r_j = q_j +
// q_j+4, s_j = r_j + r_j+2, result s_0 + s_1 (a 16-lane FMA accumulator and
// its usual reduction). These take the row-wise path for any number of rows,
// with tiles of activation rows x weight rows in registers.
//
// Either way a result does not depend on how many rows are in the batch,
// which tile or lane a row lands in, how K is chunked, the thread count or
// the instruction-set level (the scalar reference spells the chains out with
// std::fma): prefill and decode agree bit for bit.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "quant/ggml_type.h"
#include "quant/tensor.h"
#include "kernels/vec_dot_impl.h"

namespace tandem {

inline constexpr int kGemmTile = 16;     // weight rows per panel (lanes)
inline constexpr int kGemmMaxRows = 8;   // activation rows per kernel call

enum class GemmClass {
  kNone,    // no tiled kernel: Matmul falls back to one vec_dot per output
  kQ32,     // q4_0, q5_0, q8_0, mxfp4 with q8_0 activations
  kK4,      // q4_K, q5_K with q8_K activations
  kK6,      // q6_K with q8_K activations
  kFloat,   // f32, f16, bf16 with float activations
};

GemmClass gemm_class(GgmlType w);

// The float class's reduction tree over 16 partial sums (see above).
inline float reduce16(const float p[16]) {
  float q[8], r[4];
  for (int j = 0; j < 8; ++j) q[j] = p[j] + p[j + 8];
  for (int j = 0; j < 4; ++j) r[j] = q[j] + q[j + 4];
  return (r[0] + r[2]) + (r[1] + r[3]);
}

// Activations of `rows` rows in the layout the kernels read, for one weight
// type. Rows are interleaved in groups of `slots` (up to 8) so that a
// kernel reaches all rows of a group from one pointer: within group G, the
// four quants of k-group g (elements 4g..4g+3) of block b of slot s sit at
//   q byte  G * group_q_bytes + ((b * groups_per_block + g) * slots + s) * 4
// (for the float class: float number G * cols * slots + k * slots + s), and
//   scale   [G][b][s],   extra  [G][b][e][s]  (e < extra_per_block).
// Buffers only grow, so a Matmul reuses them without allocating.
struct GemmActs {
  GgmlType wtype = GgmlType::F32;
  int64_t rows = 0, cols = 0;
  int64_t slots = 1;           // rows per group
  int64_t groups = 0;
  int64_t nb = 0;              // blocks per row (elements for the float class)
  int64_t block_elems = 1;
  int64_t extra_per_block = 0;
  int64_t group_q_bytes = 0;
  // How the row kernels stream the weights (the Matmul's StreamTuning):
  // software prefetch ahead of their loads; float weights one row at a time.
  bool prefetch = true;
  bool float_single_row = false;
  std::vector<uint8_t> q;      // int8 quants, or floats for the float class
  std::vector<float> scale;    // block scales (quantized classes)
  std::vector<int32_t> extra;  // see gemm_prepare_acts

  const int8_t* qgroup(int64_t g) const { return reinterpret_cast<const int8_t*>(q.data() + g * group_q_bytes); }
  const float* fgroup(int64_t g) const { return reinterpret_cast<const float*>(q.data() + g * group_q_bytes); }
  const float* sgroup(int64_t g) const { return scale.data() + g * nb * slots; }
  const int32_t* egroup(int64_t g) const { return extra.data() + g * nb * extra_per_block * slots; }
};

// Sizes acts for rows x cols activations of weight type w (no conversion),
// in groups of min(rows, max_slots) rows: kGemmMaxRows for the packed path,
// 1 (plain rows) for the row-wise path.
void gemm_acts_shape(GgmlType w, int64_t rows, int64_t cols, int64_t max_slots, GemmActs& acts);
// Converts the rows of groups [g0, g1) of x (row stride ldx floats); groups
// are the unit so threads never share one. The quants and scales
// equal what quantize_activations(vec_dot_type(w), ...) produces, bit for bit
// (float class: x rounded to f16 / bf16 for those weight types). Extras:
//   q32: -q32_offset(w) * (sum of the block's quants), the correction for
//        the offset the panel adds to the weight quants;
//   q4_K, q5_K: e = 0..3 holds two int16, the quant sums of sub-blocks 2e
//        (low half) and 2e+1 (high half), for the min terms;
//   q6_K: e = 0..15: -32 * (sum of group e's 16 quants), for the +32 offset.
void gemm_prepare_acts(const float* x, int64_t ldx, int64_t g0, int64_t g1, GemmActs& acts, KernelLevel level);

// Accumulators of a packed-kernel call, for slot 0 of the group (slot s is
// s rows further): in[s * kGemmTile + n] holds the chain so far (nullptr:
// start from +0), out[s * ld_out + n] receives it. in and out may alias when
// ld_out == kGemmTile, so a tile's K chunks run in place.
struct GemmAcc {
  const float* in = nullptr;
  float* out = nullptr;
  int64_t ld_out = kGemmTile;
  // > 0: the panel comes from memory (its first use) and the kernel
  // prefetches this many bytes ahead of its loads; 0 when an earlier row
  // group just read it into cache, or where prefetching does not pay
  // (kernels/stream_tuning.h).
  int32_t prefetch_bytes = 0;
  // The prefetches go to L2 rather than L1: they fetch the next panel chunk
  // while this call reads one already in L1, which they must not evict.
  bool prefetch_to_l2 = false;
  // Write `out` with streaming stores (64-byte aligned rows; a hint that
  // kernels without such stores ignore). The caller fences before the
  // outputs are read on another thread.
  bool stream_out = false;
};

// The signatures of a weight type's product functions (GemmKernel's slots).
using GemmPackFn = void (*)(const WeightMatrix& W, int64_t o0, int64_t b0, int64_t b1, uint8_t* panel);
using GemmRunFn = void (*)(const uint8_t* panel, int64_t nblk, const GemmActs& acts, int64_t G, int R, int64_t b0,
                           const GemmAcc& acc);
using GemmRun2Fn = void (*)(const uint8_t* const* panels, int64_t nblk, const GemmActs& acts, int64_t G, int R,
                            int64_t b0, const GemmAcc* acc);
using GemmRowsFn = void (*)(const WeightMatrix& W, int64_t o0, int64_t o1, const GemmActs& acts, int64_t r0,
                            int64_t r1, float* y, int64_t ldy);
// Converts groups [g0, g1) of x (see gemm_prepare_acts).
using GemmPrepareFn = void (*)(const float* x, int64_t ldx, int64_t g0, int64_t g1, GemmActs& acts);

// One instruction-set level's implementation of one weight type.
struct GemmKernel {
  GemmClass cls = GemmClass::kNone;
  int64_t block_elems = 0;    // elements per block (1 for the float class)
  // Packed path (quantized classes only; null for floats).
  size_t panel_block_bytes = 0;
  // Writes blocks [b0, b1) of weight rows [o0, o0 + kGemmTile) to panel;
  // rows at or past W.rows are packed as zeros.
  GemmPackFn pack = nullptr;
  // For the first R slots of activation group G (R <= acts.slots), continues
  // each output's chain over the nblk blocks of panel (activation blocks b0
  // ..), from acc.in (or from +0) to acc.out; see GemmAcc.
  GemmRunFn run = nullptr;
  // Optional: run over two panels (32 weight rows) at once, panel i with
  // acc[i]; the same results as two run calls, in less time where each
  // activation broadcast then feeds two dot products (AVX-512 q32).
  GemmRun2Fn run2 = nullptr;
  // Row-wise path (acts.slots == 1): y[r * ldy + o] for weight rows o in
  // [o0, o1) and activation rows r in [r0, r1), weights read in place.
  GemmRowsFn rows = nullptr;
  // pack and rows also read W.tiles() (kernels/layouts.h) when it is set;
  // then o0 must be a multiple of kGemmTile, as Matmul's ranges are. Set by
  // gemm_kernel from the table (products.cpp).
  bool reads_tiles = false;
  explicit operator bool() const { return rows != nullptr; }
};

// The functions of weight type w at `level` (which the CPU must support),
// from products.cpp's table (kernels/kernel_builds.h); an empty GemmKernel
// for types without product kernels.
GemmKernel gemm_kernel(GgmlType w, KernelLevel level);

namespace gemm_detail {
// The extras of a q8_K block for class kK4 or kK6 (see gemm_prepare_acts)
// from its 16 group sums.
void k_extras(GemmClass cls, const int32_t bsums[16], int32_t* extra);
// Writes one row's plain-order quants (or floats), scales and extras into
// the interleaved layout.
void scatter_row(const void* q, const float* scale, const int32_t* extra, int64_t r, GemmActs& acts);
// The unsigned offset a q32 panel adds to each quant (q = u - offset).
int32_t q32_offset(GgmlType w);
}  // namespace gemm_detail

}  // namespace tandem

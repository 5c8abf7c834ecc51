// AVX-512 row-wise kernels (product_kernels.h): decode-shaped products that stream each
// weight row once, in file order, at memory speed.
//
// Quantized types: vector lanes run along the row (dpbusd over 64 quants),
// the lane sums of each block are folded into exact block sums, and the
// per-block float chain of product_kernels.h runs in scalar FMAs, so the results equal
// the packed path's bit for bit. Two weight rows are interleaved so that two
// chains are in flight; q32 types take 8 rows at a time with the 8 chains in
// the lanes of one FMA, and q4_0 16 rows with a cheaper reduction (see there).
//
// Float types: tiles of up to 6 activation rows x 4 weight rows of 16-lane
// FMA accumulators, reduced by product_kernels.h's fixed tree; f16 / bf16 weight rows
// come four at a time from their tiles (kernels/layout_float_tiles.h) when loaded so.
//
// The kernels are split by class: product_rows_avx512_q32.cpp,
// product_rows_avx512_kquant.cpp and product_rows_avx512_float.cpp; what they share
// is in product_rows_avx512.h.
#include "kernels/product_rows_avx512.h"

#if defined(__x86_64__)

namespace tandem::gemm_detail {

GemmKernel avx512_rows_kernel(GgmlType w, GemmKernel k) {
  using namespace avx512_rows;
  for (RowsFn f : {q32_rows_for(w), kquant_rows_for(w), float_rows_for(w)})
    if (f) k.rows = f;
  return k;
}

}  // namespace tandem::gemm_detail

#endif

// AVX2 packers for the tiled kernels (layout_panels.h layouts), used by
// product_panels_avx2.cpp. Callable only where the CPU has AVX2, FMA and F16C.
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace tandem::gemm_detail {

void avx2_pack_q32(const WeightMatrix& W, int64_t o0, int64_t b0, int64_t b1, uint8_t* panel);
void avx2_pack_k4(const WeightMatrix& W, int64_t o0, int64_t b0, int64_t b1, uint8_t* panel);
void avx2_pack_k6(const WeightMatrix& W, int64_t o0, int64_t b0, int64_t b1, uint8_t* panel);

}  // namespace tandem::gemm_detail

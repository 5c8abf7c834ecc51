// AVX-512 packers for the tiled kernels (layout_panels.h layouts), shared by
// product_panels_avx512.cpp. Callable only where the CPU has AVX512-VNNI.
#pragma once

#include <cstdint>

#include "core/tensor.h"

// The target of every function in the AVX-512 GEMM files.
#define TD_GEMM_AVX512 "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni"

namespace tandem::gemm_detail {

void avx512_pack_q32(const WeightMatrix& W, int64_t o0, int64_t b0, int64_t b1, uint8_t* panel);
void avx512_pack_k4(const WeightMatrix& W, int64_t o0, int64_t b0, int64_t b1, uint8_t* panel);
void avx512_pack_k6(const WeightMatrix& W, int64_t o0, int64_t b0, int64_t b1, uint8_t* panel);

}  // namespace tandem::gemm_detail

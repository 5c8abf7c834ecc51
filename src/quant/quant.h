// Scalar reference conversions between float and every supported tensor type.
// These define the formats bit-exactly (they follow ggml's layouts); optimized
// kernels are tested against them.
#pragma once

#include <cstdint>

#include "quant/ggml_type.h"

namespace tandem {

// Half-precision helpers (IEEE binary16 and bfloat16), exact round-to-nearest-even.
float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);
float bf16_to_f32(uint16_t h);
uint16_t f32_to_bf16(float f);

// dst[0..n) = values of the first n elements stored at src in type t.
// n must be a multiple of the type's block size. Throws tandem::Error for a
// type that has no dequantizer.
void dequantize_row(GgmlType t, const void* src, float* dst, int64_t n);

// Reference quantizer: writes row_bytes(t, n) bytes to dst. Used to write
// files (convert, synth) and in tests; follows ggml's reference quantizers
// (quantize_row_*_ref) so files we write match what llama.cpp would write.
void quantize_row(GgmlType t, const float* src, void* dst, int64_t n);

}  // namespace tandem

// Dot products between one row of weights (in the file's format) and one row
// of activations, the innermost loop of every linear layer.
//
// Like llama.cpp, activations are first converted to the weight format's
// partner type (its "vec_dot type"): q8_0 for q4_0/q5_0/q8_0/mxfp4, q8_1 for
// q4_1/q5_1, q8_K for the K-quants, f16 for f16, bf16 for bf16, f32 for f32.
// The quantized formats then dot in integers, which is both what makes them
// fast and what keeps our results close to llama.cpp's.
#pragma once

#include <cstddef>
#include <cstdint>

#include "runtime/cpu_features.h"
#include "quant/ggml_type.h"

namespace tandem {

// The activation type that weight type `w` dots against. Throws kUnsupported.
GgmlType vec_dot_type(GgmlType w);

// Converts n floats to `act_type` (row_bytes(act_type, n) bytes at dst).
void quantize_activations(GgmlType act_type, const float* x, void* dst, int64_t n);

// Sum over n elements of w[i] * a[i]; `a` was made by quantize_activations
// with vec_dot_type(w_type). n is a multiple of the block size of both types.
using VecDotFn = float (*)(int64_t n, const void* w, const void* a);

// The fastest implementation this CPU supports (chosen once at start-up).
VecDotFn vec_dot_fn(GgmlType w_type);
// The plain scalar reference, for tests.
VecDotFn vec_dot_ref_fn(GgmlType w_type);

}  // namespace tandem

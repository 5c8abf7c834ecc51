// Internals of the vec_dot dispatcher, exposed for tests and benchmarks that
// need to run a specific instruction-set level rather than the fastest one.
#pragma once

#include "runtime/cpu_features.h"
#include "quant/ggml_type.h"
#include "kernels/vec_dot.h"

namespace tandem {

// The kernel for weight type w at `level`, which the CPU must support (throws
// kInvalidArgument otherwise), from products.cpp's table: types without a
// SIMD version at that level get the best lower one. Throws kUnsupported for
// a type with no dot product.
VecDotFn vec_dot_fn_for_level(GgmlType w, KernelLevel level);

}  // namespace tandem

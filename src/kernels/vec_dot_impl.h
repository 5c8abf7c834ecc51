// Internals of the vec_dot dispatcher, exposed for tests and benchmarks that
// need to run a specific instruction-set level rather than the fastest one.
#pragma once

#include "core/cpu_features.h"
#include "core/ggml_type.h"
#include "kernels/vec_dot.h"

namespace tandem {

// The kernel for weight type w at `level`, which the CPU must support (throws
// kInvalidArgument otherwise). Types without a SIMD version at that level get
// the best lower one. Throws kUnsupported for a type with no dot product.
VecDotFn vec_dot_fn_for_level(GgmlType w, KernelLevel level);

namespace dot_detail {
// Per-file tables; nullptr where that file has no kernel for the type.
VecDotFn ref_fn(GgmlType w);
VecDotFn avx2_fn(GgmlType w, bool vnni);
}  // namespace dot_detail

}  // namespace tandem

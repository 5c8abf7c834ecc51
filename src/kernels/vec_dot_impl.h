// Internals of the vec_dot dispatcher, exposed for tests and benchmarks that
// need to run a specific instruction-set level rather than the fastest one.
#pragma once

#include "core/ggml_type.h"
#include "kernels/vec_dot.h"

namespace tandem {

// Ordered: each level's CPU requirements include those of the levels before it.
enum class KernelLevel {
  kScalar,
  kAvx2,        // AVX2 + FMA + F16C
  kAvx2Vnni,    // ... + AVX-VNNI (256-bit dpbusd)
  kAvx512,      // ... + AVX-512 F/BW/VL (no AVX-VNNI needed)
  kAvx512Vnni,  // ... + AVX512-VNNI; uses AVX512-BF16 for bf16 when present
};

inline constexpr KernelLevel kAllKernelLevels[] = {KernelLevel::kScalar, KernelLevel::kAvx2,
                                                   KernelLevel::kAvx2Vnni, KernelLevel::kAvx512,
                                                   KernelLevel::kAvx512Vnni};

const char* kernel_level_name(KernelLevel level);
bool cpu_supports_level(KernelLevel level);
// The best level this CPU supports, ignoring TANDEM_KERNELS.
KernelLevel best_kernel_level();
// The level vec_dot_fn uses: best_kernel_level(), lowered by TANDEM_KERNELS.
KernelLevel active_kernel_level();
// Parses a TANDEM_KERNELS value ("scalar", "avx2", "avx512", or an exact level
// name) against the given best level; nullptr/empty means `best`. An unknown
// value or one above `best` yields `best` and writes a warning to stderr.
KernelLevel choose_kernel_level(const char* request, KernelLevel best);

// The kernel for weight type w at `level`, which the CPU must support (throws
// kInvalidArgument otherwise). Types without a SIMD version at that level get
// the best lower one. Throws kUnsupported for a type with no dot product.
VecDotFn vec_dot_fn_for_level(GgmlType w, KernelLevel level);

namespace dot_detail {
// Per-file tables; nullptr where that file has no kernel for the type.
VecDotFn ref_fn(GgmlType w);
VecDotFn avx2_fn(GgmlType w, bool vnni);
VecDotFn avx512_fn(GgmlType w, bool vnni, bool bf16);
}  // namespace dot_detail

}  // namespace tandem

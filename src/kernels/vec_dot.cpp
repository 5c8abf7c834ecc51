// The weight -> activation type map, and vec_dot's functions from the
// products' table (products.cpp; the activations' quantizer is in
// product_acts.cpp).
#include "kernels/vec_dot.h"

#include "runtime/cpu_features.h"
#include "core/error.h"
#include "kernels/vec_dot_impl.h"

namespace tandem {

GgmlType vec_dot_type(GgmlType w) {
  switch (w) {
    case GgmlType::F32: return GgmlType::F32;
    case GgmlType::F16: return GgmlType::F16;
    case GgmlType::BF16: return GgmlType::BF16;
    case GgmlType::Q4_0:
    case GgmlType::Q5_0:
    case GgmlType::Q8_0:
    case GgmlType::MXFP4: return GgmlType::Q8_0;
    case GgmlType::Q4_1:
    case GgmlType::Q5_1: return GgmlType::Q8_1;
    case GgmlType::Q2_K:
    case GgmlType::Q3_K:
    case GgmlType::Q4_K:
    case GgmlType::Q5_K:
    case GgmlType::Q6_K: return GgmlType::Q8_K;
    default:
      fail(ErrorKind::kUnsupported, "no dot product for weight type id {}", static_cast<uint32_t>(w));
  }
}

VecDotFn vec_dot_fn(GgmlType w_type) { return vec_dot_fn_for_level(w_type, active_kernel_level()); }

VecDotFn vec_dot_ref_fn(GgmlType w_type) { return vec_dot_fn_for_level(w_type, KernelLevel::kScalar); }

}  // namespace tandem

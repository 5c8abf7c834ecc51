// The weight -> activation type map and the choice of vec_dot kernel per
// level (the activations' quantizer is in product_acts.cpp).
#include "kernels/vec_dot.h"

#include "core/cpu_features.h"
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
    case GgmlType::Q8_0: return GgmlType::Q8_0;
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

VecDotFn vec_dot_fn_for_level(GgmlType w, KernelLevel level) {
  const VecDotFn ref = dot_detail::ref_fn(w);
  if (ref == nullptr)
    fail(ErrorKind::kUnsupported, "no dot product for weight type id {}", static_cast<uint32_t>(w));
  if (!cpu_supports_level(level))
    fail(ErrorKind::kInvalidArgument, "kernel level {} is not supported by this CPU", kernel_level_name(level));
  // The AVX-512 levels take the AVX2 kernels: vec_dot computes the products
  // of the types without product kernels (products.cpp), and of the others
  // only in tests and benchmarks.
  VecDotFn fn = nullptr;
  if (level >= KernelLevel::kAvx2)
    fn = dot_detail::avx2_fn(w, cpu_supports_level(KernelLevel::kAvx2Vnni) && level != KernelLevel::kAvx2 &&
                                    level != KernelLevel::kAvx512);
  return fn != nullptr ? fn : ref;
}

VecDotFn vec_dot_fn(GgmlType w_type) { return vec_dot_fn_for_level(w_type, active_kernel_level()); }

VecDotFn vec_dot_ref_fn(GgmlType w_type) {
  const VecDotFn ref = dot_detail::ref_fn(w_type);
  if (ref == nullptr)
    fail(ErrorKind::kUnsupported, "no dot product for weight type id {}", static_cast<uint32_t>(w_type));
  return ref;
}

}  // namespace tandem

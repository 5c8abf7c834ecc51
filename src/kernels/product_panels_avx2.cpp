// AVX2 tiled kernels: the AVX-512 kernels' arithmetic on pairs of 256-bit
// registers (lanes 0-7 and 8-15 of a panel vector). With AVX-VNNI the integer
// steps are dpbusd; without it maddubs + madd, which saturates only when
// unsigned x signed byte pairs exceed 32767: q8_0 (offset quants up to 255)
// therefore takes the sign trick (|w| times a with w's sign) and skips the
// offset correction. Every other panel holds quants below 64 (mxfp4's
// values + 12: 0..24).
#include "kernels/kernel_builds.h"
#include "kernels/product_kernels.h"

#if defined(__x86_64__)

#include <immintrin.h>

#include <cstring>
#include <type_traits>

#include "quant/quant_blocks.h"
#include "kernels/layout_panels.h"

namespace tandem::gemm_detail {

#define TD_AVX2_VARIANTS_BODY "kernels/product_panels_avx2_body.h"
#include "kernels/simd_avx2_variants.h"
#undef TD_AVX2_VARIANTS_BODY

}  // namespace tandem::gemm_detail

namespace tandem::builds {

using namespace gemm_detail;

TypeFns avx2_panels(GgmlType w) {
  switch (gemm_class(w)) {
    case GemmClass::kQ32:
      if (q32_bf16_scales(w)) return {.pack = avx2::pack_q32, .run = avx2_plain::run_mx};
      return {.pack = avx2::pack_q32, .run = w == GgmlType::Q8_0 ? avx2_plain::run_q32_signed : avx2_plain::run_q32};
    case GemmClass::kK4: return {.pack = avx2::pack_k4, .run = avx2_plain::run_k4};
    case GemmClass::kK6: return {.pack = avx2::pack_k6, .run = avx2_plain::run_k6};
    case GemmClass::kFloat:
    case GemmClass::kNone: break;
  }
  return {};
}

// dpbusd takes q8_0's offset quants without the sign trick.
TypeFns avx2_vnni_panels(GgmlType w) {
  switch (gemm_class(w)) {
    case GemmClass::kQ32: return {.run = q32_bf16_scales(w) ? avx2_vnni::run_mx : avx2_vnni::run_q32};
    case GemmClass::kK4: return {.run = avx2_vnni::run_k4};
    case GemmClass::kK6: return {.run = avx2_vnni::run_k6};
    case GemmClass::kFloat:
    case GemmClass::kNone: break;
  }
  return {};
}

}  // namespace tandem::builds

#endif

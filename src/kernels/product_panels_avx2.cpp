// AVX2 tiled kernels: the AVX-512 kernels' arithmetic on pairs of 256-bit
// registers (lanes 0-7 and 8-15 of a panel vector). With AVX-VNNI the integer
// steps are dpbusd; without it maddubs + madd, which saturates only when
// unsigned x signed byte pairs exceed 32767: q8_0 (offset quants up to 255)
// therefore takes the sign trick (|w| times a with w's sign) and skips the
// offset correction. Every other panel holds quants below 64.
#include "kernels/product_kernels.h"

#if defined(__x86_64__)

#include <immintrin.h>

#include <cstring>
#include <type_traits>

#include "core/quant_blocks.h"
#include "kernels/layout_panels.h"

namespace tandem::gemm_detail {

#define TD_AVX2_VARIANTS_BODY "kernels/product_panels_avx2_body.h"
#include "kernels/simd_avx2_variants.h"
#undef TD_AVX2_VARIANTS_BODY

GemmKernel avx2_kernel(GgmlType w, bool vnni) {
  GemmKernel k = ref_kernel(w);  // block sizes and panel layout
  switch (k.cls) {
    case GemmClass::kQ32:
      k.pack = avx2::pack_q32;
      k.run = vnni ? avx2_vnni::run_q32 : w == GgmlType::Q8_0 ? avx2_plain::run_q32_signed : avx2_plain::run_q32;
      break;
    case GemmClass::kK4:
      k.pack = avx2::pack_k4;
      k.run = vnni ? avx2_vnni::run_k4 : avx2_plain::run_k4;
      break;
    case GemmClass::kK6:
      k.pack = avx2::pack_k6;
      k.run = vnni ? avx2_vnni::run_k6 : avx2_plain::run_k6;
      break;
    case GemmClass::kFloat:
    case GemmClass::kNone: break;
  }
  return avx2_rows_kernel(w, k);
}

}  // namespace tandem::gemm_detail

#else

namespace tandem::gemm_detail {
GemmKernel avx2_kernel(GgmlType, bool) { return {}; }
}  // namespace tandem::gemm_detail

#endif

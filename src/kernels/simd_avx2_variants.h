// Compiles one body of AVX2 kernels twice, into namespace avx2_plain (target
// AVX2 + FMA + F16C, TD_VNNI 0: u8 x s8 sums by maddubs + madd) and avx2_vnni
// (+ AVX-VNNI, TD_VNNI 1: dpbusd), TD_TARGET naming the target. Not a normal
// header: the includer names the body in TD_AVX2_VARIANTS_BODY and includes
// this inside its own namespace.

namespace avx2_plain {
#define TD_TARGET "avx2,fma,f16c"
#define TD_VNNI 0
#include TD_AVX2_VARIANTS_BODY
#undef TD_VNNI
#undef TD_TARGET
}  // namespace avx2_plain

namespace avx2_vnni {
#define TD_TARGET "avx2,fma,f16c,avxvnni"
#define TD_VNNI 1
#include TD_AVX2_VARIANTS_BODY
#undef TD_VNNI
#undef TD_TARGET
}  // namespace avx2_vnni

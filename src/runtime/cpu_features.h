// What the x86 CPU we run on can execute, read once from CPUID, and the
// instruction-set level the kernels run at. The build targets baseline x86-64,
// so faster kernels are chosen at run time from this.
#pragma once

#include <string>
#include <string_view>

namespace tandem {

enum class CpuVendor { kOther, kIntel, kAmd };

struct CpuFeatures {
  CpuVendor vendor = CpuVendor::kOther;
  unsigned family = 0;  // display family (base + extended), e.g. 0x19 for Zen 3/4
  bool avx2 = false;
  bool fma = false;
  bool f16c = false;
  bool avx512f = false;
  bool avx512bw = false;
  bool avx512vl = false;
  bool avx512vnni = false;
  bool avx512bf16 = false;
  bool avx_vnni = false;
};

// The features both the CPU and the OS support (an OS that does not save the
// wide registers on context switch makes them unusable, so XCR0 is checked).
// All false on non-x86 builds.
const CpuFeatures& cpu_features();

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

const char* kernel_level_name(KernelLevel level);  // "scalar", "avx2", "avx2-vnni", "avx512", "avx512-vnni"
bool cpu_supports_level(KernelLevel level);
// The best level this CPU supports.
KernelLevel best_kernel_level();
// The level a request names ("scalar", "avx2", "avx512": the best level of
// that family that is usable; or an exact level name), no higher than `best`.
// An empty request is `best`. An unknown request, or one this CPU cannot run,
// yields `best` and a sentence for the user in *warning (when given).
KernelLevel choose_kernel_level(std::string_view request, KernelLevel best, std::string* warning = nullptr);

// The process's level: what the kernels run at unless a caller names one
// (Matmul, Model, the *_at functions). best_kernel_level() until set, which
// the command line does once at start-up (--kernels).
KernelLevel active_kernel_level();
void set_active_kernel_level(KernelLevel level);  // throws kInvalidArgument if the CPU cannot run it
// kernel_level_name(active_kernel_level()), for reports.
const char* cpu_kernel_level();

}  // namespace tandem

// What the x86 CPU we run on can execute, read once from CPUID. The build
// targets baseline x86-64, so faster kernels are chosen at run time from this.
#pragma once

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

}  // namespace tandem

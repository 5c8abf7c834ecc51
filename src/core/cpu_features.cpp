#include "core/cpu_features.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#include <cstdint>
#include <cstring>

namespace tandem {
namespace {

#if defined(__x86_64__) || defined(__i386__)

struct Regs {
  unsigned a = 0, b = 0, c = 0, d = 0;
};

Regs cpuid(unsigned leaf, unsigned sub) {
  Regs r;
  __cpuid_count(leaf, sub, r.a, r.b, r.c, r.d);
  return r;
}

uint64_t xgetbv0() {
  uint32_t lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (static_cast<uint64_t>(hi) << 32) | lo;
}

bool bit(unsigned reg, int n) { return (reg >> n) & 1u; }

CpuFeatures detect() {
  CpuFeatures f;
  const unsigned max_leaf = __get_cpuid_max(0, nullptr);
  if (max_leaf < 1) return f;
  const Regs l0 = cpuid(0, 0);
  char vendor[13] = {};
  std::memcpy(vendor, &l0.b, 4);
  std::memcpy(vendor + 4, &l0.d, 4);
  std::memcpy(vendor + 8, &l0.c, 4);
  if (std::strcmp(vendor, "GenuineIntel") == 0) f.vendor = CpuVendor::kIntel;
  if (std::strcmp(vendor, "AuthenticAMD") == 0) f.vendor = CpuVendor::kAmd;
  const Regs l1 = cpuid(1, 0);
  const unsigned base_family = (l1.a >> 8) & 0xF;
  f.family = base_family == 0xF ? base_family + ((l1.a >> 20) & 0xFF) : base_family;
  // Without OSXSAVE we cannot ask the OS which register files it preserves.
  if (!bit(l1.c, 27)) return f;
  const uint64_t xcr0 = xgetbv0();
  const bool os_ymm = (xcr0 & 0x6) == 0x6;     // SSE and AVX state
  const bool os_zmm = (xcr0 & 0xE6) == 0xE6;   // plus opmask and both ZMM halves
  if (!os_ymm || !bit(l1.c, 28)) return f;     // no usable AVX at all

  f.fma = bit(l1.c, 12);
  f.f16c = bit(l1.c, 29);
  if (max_leaf < 7) return f;
  const Regs l7 = cpuid(7, 0);
  const Regs l7s1 = cpuid(7, 1);
  f.avx2 = bit(l7.b, 5);
  f.avx_vnni = bit(l7s1.a, 4);
  if (os_zmm) {
    f.avx512f = bit(l7.b, 16);
    f.avx512bw = bit(l7.b, 30);
    f.avx512vl = bit(l7.b, 31);
    f.avx512vnni = bit(l7.c, 11);
    f.avx512bf16 = bit(l7s1.a, 5);
  }
  return f;
}

#else

CpuFeatures detect() { return {}; }

#endif

}  // namespace

const CpuFeatures& cpu_features() {
  static const CpuFeatures f = detect();
  return f;
}

}  // namespace tandem

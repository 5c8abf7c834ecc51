#include "runtime/cpu_features.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#include <atomic>
#include <cstdint>
#include <cstring>

#include "core/error.h"

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

const char* kernel_level_name(KernelLevel level) {
  switch (level) {
    case KernelLevel::kScalar: return "scalar";
    case KernelLevel::kAvx2: return "avx2";
    case KernelLevel::kAvx2Vnni: return "avx2-vnni";
    case KernelLevel::kAvx512: return "avx512";
    case KernelLevel::kAvx512Vnni: return "avx512-vnni";
  }
  return "?";
}

bool cpu_supports_level(KernelLevel level) {
  const CpuFeatures& f = cpu_features();
  const bool avx2 = f.avx2 && f.fma && f.f16c;
  const bool avx512 = avx2 && f.avx512f && f.avx512bw && f.avx512vl;
  switch (level) {
    case KernelLevel::kScalar: return true;
    case KernelLevel::kAvx2: return avx2;
    case KernelLevel::kAvx2Vnni: return avx2 && f.avx_vnni;
    case KernelLevel::kAvx512: return avx512;
    case KernelLevel::kAvx512Vnni: return avx512 && f.avx512vnni;
  }
  return false;
}

KernelLevel best_kernel_level() {
  static const KernelLevel best = [] {
    KernelLevel b = KernelLevel::kScalar;
    for (KernelLevel l : kAllKernelLevels)
      if (cpu_supports_level(l)) b = l;
    return b;
  }();
  return best;
}

KernelLevel choose_kernel_level(std::string_view r, KernelLevel best, std::string* warning) {
  if (r.empty()) return best;
  auto usable = [&](KernelLevel l) { return l <= best && cpu_supports_level(l); };
  auto refuse = [&](const char* why) {
    if (warning)
      *warning = std::string("kernel level ") + std::string(r) + why + "; using " + kernel_level_name(best);
    return best;
  };
  // A family name picks the best level of that family that is usable.
  KernelLevel want = best;
  if (r == "scalar") {
    want = KernelLevel::kScalar;
  } else if (r == "avx2") {
    want = usable(KernelLevel::kAvx2Vnni) ? KernelLevel::kAvx2Vnni : KernelLevel::kAvx2;
  } else if (r == "avx512") {
    want = usable(KernelLevel::kAvx512Vnni) ? KernelLevel::kAvx512Vnni : KernelLevel::kAvx512;
  } else {
    bool found = false;
    for (KernelLevel l : kAllKernelLevels)
      if (r == kernel_level_name(l)) {
        want = l;
        found = true;
      }
    if (!found) return refuse(" is not one of scalar, avx2, avx512");
  }
  if (!usable(want)) return refuse(" is not supported by this CPU");
  return want;
}

namespace {
std::atomic<int> g_active_level{-1};  // -1: not set, best_kernel_level()
}  // namespace

KernelLevel active_kernel_level() {
  const int l = g_active_level.load(std::memory_order_relaxed);
  return l < 0 ? best_kernel_level() : static_cast<KernelLevel>(l);
}

void set_active_kernel_level(KernelLevel level) {
  if (!cpu_supports_level(level))
    fail(ErrorKind::kInvalidArgument, "kernel level {} is not supported by this CPU", kernel_level_name(level));
  g_active_level.store(static_cast<int>(level), std::memory_order_relaxed);
}

const char* cpu_kernel_level() { return kernel_level_name(active_kernel_level()); }

}  // namespace tandem

// Each kernel carries its own target attribute, like src/kernels/dot_*.cpp, so
// the library stays baseline x86-64; the level passed in decides which runs,
// and callers only pass levels that cpu_supports_level() allows.
#include "perf/microbench.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "runtime/cpu_features.h"
#include "core/error.h"
#include "runtime/thread_pool.h"

#if defined(__x86_64__)
// GCC 12's AVX-512 intrinsics trip -Wuninitialized once inlined (see kernels/simd_avx512.h).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#endif

namespace tandem {
namespace {

// Results are folded into this so the compiler cannot drop the loops.
volatile double g_sink = 0;

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void check_args(const char* what, int64_t count, int trials) {
  if (count <= 0) fail(ErrorKind::kInvalidArgument, "{}: the size must be positive, got {}", what, count);
  if (trials <= 0) fail(ErrorKind::kInvalidArgument, "{}: the number of passes must be positive, got {}", what, trials);
}

void check_level(KernelLevel level) {
  if (!cpu_supports_level(level))
    fail(ErrorKind::kInvalidArgument, "kernel level {} is not supported by this CPU", kernel_level_name(level));
}

bool is_avx512(KernelLevel l) { return l >= KernelLevel::kAvx512; }
bool is_avx2(KernelLevel l) { return l >= KernelLevel::kAvx2; }

// Runs body(iters) on every thread `trials` times; the fastest trial's time.
template <typename Body>
double best_parallel_seconds(ThreadPool& pool, int trials, Body body) {
  std::vector<double> sinks(pool.size(), 0.0);
  double best = 1e300;
  for (int t = 0; t < trials; ++t) {
    const auto t0 = std::chrono::steady_clock::now();
    pool.run([&](int i, int) { sinks[i] += body(i); });
    best = std::min(best, seconds_since(t0));
  }
  double s = 0;
  for (double v : sinks) s += v;
  g_sink = g_sink + s;
  return best;
}

// ---- memory read --------------------------------------------------------

uint64_t read_scalar(const uint8_t* p, size_t n) {
  const uint64_t* q = reinterpret_cast<const uint64_t*>(p);
  uint64_t a = 0, b = 0, c = 0, d = 0;
  for (size_t i = 0; i < n / 8; i += 4) {
    a += q[i];
    b += q[i + 1];
    c += q[i + 2];
    d += q[i + 3];
  }
  return a + b + c + d;
}

#if defined(__x86_64__)
__attribute__((target("avx2"))) uint64_t read_avx2(const uint8_t* p, size_t n) {
  __m256i a = _mm256_setzero_si256(), b = a, c = a, d = a;
  for (size_t i = 0; i < n; i += 128) {
    a = _mm256_add_epi64(a, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i)));
    b = _mm256_add_epi64(b, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 32)));
    c = _mm256_add_epi64(c, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 64)));
    d = _mm256_add_epi64(d, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 96)));
  }
  a = _mm256_add_epi64(_mm256_add_epi64(a, b), _mm256_add_epi64(c, d));
  alignas(32) uint64_t out[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(out), a);
  return out[0] + out[1] + out[2] + out[3];
}

__attribute__((target("avx512f"))) uint64_t read_avx512(const uint8_t* p, size_t n) {
  __m512i a = _mm512_setzero_si512(), b = a, c = a, d = a;
  for (size_t i = 0; i < n; i += 256) {
    a = _mm512_add_epi64(a, _mm512_load_si512(p + i));
    b = _mm512_add_epi64(b, _mm512_load_si512(p + i + 64));
    c = _mm512_add_epi64(c, _mm512_load_si512(p + i + 128));
    d = _mm512_add_epi64(d, _mm512_load_si512(p + i + 192));
  }
  // Wrapping sum: the intrinsic reduction adds as signed and overflows (UB).
  alignas(64) uint64_t out[8];
  _mm512_store_si512(out, _mm512_add_epi64(_mm512_add_epi64(a, b), _mm512_add_epi64(c, d)));
  uint64_t s = 0;
  for (uint64_t v : out) s += v;
  return s;
}
#endif

using ReadFn = uint64_t (*)(const uint8_t*, size_t);
// The widest read kernel of `level` (64-byte aligned data, lengths in 256-byte steps).
ReadFn reader(KernelLevel level, std::string& isa) {
#if defined(__x86_64__)
  if (is_avx512(level)) {
    isa = "avx512 512-bit loads";
    return read_avx512;
  }
  if (is_avx2(level)) {
    isa = "avx2 256-bit loads";
    return read_avx2;
  }
#endif
  isa = "scalar 64-bit loads";
  return read_scalar;
}

// ---- compute ------------------------------------------------------------
// Each loop iteration issues one instruction per accumulator; accumulators
// are independent so the loop runs at the units' throughput. Inputs depend on
// the accumulators (or are fused into them), so nothing is loop-invariant.

float fma_scalar(int64_t iters) {
  float acc[8];
  for (int k = 0; k < 8; ++k) acc[k] = 0.001f * k;
  const float a = 0.9999f, b = 1e-4f;
  for (int64_t i = 0; i < iters; ++i)
    for (int k = 0; k < 8; ++k) acc[k] = acc[k] * a + b;
  float s = 0;
  for (float v : acc) s += v;
  return s;
}

int32_t int8_scalar(int64_t iters) {
  uint32_t acc[8];  // wraps by design, as the SIMD lanes do
  for (int k = 0; k < 8; ++k) acc[k] = k;
  for (int64_t i = 0; i < iters; ++i)
    for (int k = 0; k < 8; ++k)
      acc[k] += static_cast<uint32_t>(static_cast<int32_t>(static_cast<int8_t>(acc[k] & 0xff)) * 3);
  uint32_t s = 0;
  for (uint32_t v : acc) s += v;
  return static_cast<int32_t>(s);
}

#if defined(__x86_64__)
constexpr int kChains256 = 12;  // 16 ymm registers: 12 chains + operands
constexpr int kChains512 = 16;

// The accumulators wrap by design (their value only keeps the loop alive);
// summing lanes as unsigned keeps that well-defined, unlike the signed
// reductions in the intrinsic headers.
template <typename V>
int32_t wrap_sum(V v) {
  uint32_t lanes[sizeof(V) / 4];
  std::memcpy(lanes, &v, sizeof(V));
  uint32_t s = 0;
  for (uint32_t x : lanes) s += x;
  return static_cast<int32_t>(s);
}

__attribute__((target("avx2,fma"))) float fma_avx2(int64_t iters) {
  const __m256 a = _mm256_set1_ps(0.9999f), b = _mm256_set1_ps(1e-4f);
  __m256 acc[kChains256];
  for (int k = 0; k < kChains256; ++k) acc[k] = _mm256_set1_ps(0.001f * k);
  for (int64_t i = 0; i < iters; ++i) {
#pragma GCC unroll 16
    for (int k = 0; k < kChains256; ++k) acc[k] = _mm256_fmadd_ps(acc[k], a, b);
  }
  __m256 s = acc[0];
  for (int k = 1; k < kChains256; ++k) s = _mm256_add_ps(s, acc[k]);
  alignas(32) float out[8];
  _mm256_store_ps(out, s);
  return out[0] + out[7];
}

__attribute__((target("avx512f"))) float fma_avx512(int64_t iters) {
  const __m512 a = _mm512_set1_ps(0.9999f), b = _mm512_set1_ps(1e-4f);
  __m512 acc[kChains512];
  for (int k = 0; k < kChains512; ++k) acc[k] = _mm512_set1_ps(0.001f * k);
  for (int64_t i = 0; i < iters; ++i) {
#pragma GCC unroll 16
    for (int k = 0; k < kChains512; ++k) acc[k] = _mm512_fmadd_ps(acc[k], a, b);
  }
  __m512 s = acc[0];
  for (int k = 1; k < kChains512; ++k) s = _mm512_add_ps(s, acc[k]);
  return _mm512_reduce_add_ps(s);
}

// Without VNNI an int8 dot is vpmaddubsw (u8*s8 pairs -> s16), vpmaddwd by
// ones (-> s32) and an add: 3 instructions for what vpdpbusd does in one.
__attribute__((target("avx2"))) int32_t int8_avx2(int64_t iters) {
  const __m256i a = _mm256_set1_epi8(3), ones = _mm256_set1_epi16(1);
  __m256i acc[kChains256];
  for (int k = 0; k < kChains256; ++k) acc[k] = _mm256_set1_epi32(k);
  for (int64_t i = 0; i < iters; ++i) {
#pragma GCC unroll 16
    for (int k = 0; k < kChains256; ++k)
      acc[k] = _mm256_add_epi32(acc[k], _mm256_madd_epi16(_mm256_maddubs_epi16(a, acc[k]), ones));
  }
  __m256i s = acc[0];
  for (int k = 1; k < kChains256; ++k) s = _mm256_add_epi32(s, acc[k]);
  return wrap_sum(s);
}

__attribute__((target("avx2,avxvnni"))) int32_t int8_avx2_vnni(int64_t iters) {
  const __m256i a = _mm256_set1_epi8(3), b = _mm256_set1_epi8(-5);
  __m256i acc[kChains256];
  for (int k = 0; k < kChains256; ++k) acc[k] = _mm256_set1_epi32(k);
  for (int64_t i = 0; i < iters; ++i) {
#pragma GCC unroll 16
    for (int k = 0; k < kChains256; ++k) acc[k] = _mm256_dpbusd_avx_epi32(acc[k], a, b);
  }
  __m256i s = acc[0];
  for (int k = 1; k < kChains256; ++k) s = _mm256_add_epi32(s, acc[k]);
  return wrap_sum(s);
}

__attribute__((target("avx512f,avx512bw"))) int32_t int8_avx512(int64_t iters) {
  const __m512i a = _mm512_set1_epi8(3), ones = _mm512_set1_epi16(1);
  __m512i acc[kChains512];
  for (int k = 0; k < kChains512; ++k) acc[k] = _mm512_set1_epi32(k);
  for (int64_t i = 0; i < iters; ++i) {
#pragma GCC unroll 16
    for (int k = 0; k < kChains512; ++k)
      acc[k] = _mm512_add_epi32(acc[k], _mm512_madd_epi16(_mm512_maddubs_epi16(a, acc[k]), ones));
  }
  __m512i s = acc[0];
  for (int k = 1; k < kChains512; ++k) s = _mm512_add_epi32(s, acc[k]);
  return wrap_sum(s);
}

__attribute__((target("avx512f,avx512vnni"))) int32_t int8_avx512_vnni(int64_t iters) {
  const __m512i a = _mm512_set1_epi8(3), b = _mm512_set1_epi8(-5);
  __m512i acc[kChains512];
  for (int k = 0; k < kChains512; ++k) acc[k] = _mm512_set1_epi32(k);
  for (int64_t i = 0; i < iters; ++i) {
#pragma GCC unroll 16
    for (int k = 0; k < kChains512; ++k) acc[k] = _mm512_dpbusd_epi32(acc[k], a, b);
  }
  __m512i s = acc[0];
  for (int k = 1; k < kChains512; ++k) s = _mm512_add_epi32(s, acc[k]);
  return wrap_sum(s);
}

__attribute__((target("avx512f,avx512bf16"))) float bf16_avx512(int64_t iters) {
  const __m512bh a = _mm512_cvtne2ps_pbh(_mm512_set1_ps(0.5f), _mm512_set1_ps(0.25f));
  const __m512bh b = _mm512_cvtne2ps_pbh(_mm512_set1_ps(1e-3f), _mm512_set1_ps(2e-3f));
  __m512 acc[kChains512];
  for (int k = 0; k < kChains512; ++k) acc[k] = _mm512_set1_ps(0.001f * k);
  for (int64_t i = 0; i < iters; ++i) {
#pragma GCC unroll 16
    for (int k = 0; k < kChains512; ++k) acc[k] = _mm512_dpbf16_ps(acc[k], a, b);
  }
  __m512 s = acc[0];
  for (int k = 1; k < kChains512; ++k) s = _mm512_add_ps(s, acc[k]);
  return _mm512_reduce_add_ps(s);
}
#endif

}  // namespace

PeakMeasure measure_read_bandwidth_of(ThreadPool& pool, std::span<const std::span<const uint8_t>> regions, int passes,
                                      KernelLevel level) {
  check_level(level);
  if (passes < 1) fail(ErrorKind::kInvalidArgument, "read bandwidth: passes must be at least 1, got {}", passes);
  // The read kernels want 64-byte aligned starts and lengths in 256-byte
  // steps: each region is trimmed to that (a few hundred bytes at most).
  constexpr size_t kStep = 256;
  struct Piece {
    const uint8_t* p;
    size_t n;
  };
  std::vector<Piece> pieces;
  size_t total = 0;
  for (std::span<const uint8_t> r : regions) {
    const uintptr_t b = reinterpret_cast<uintptr_t>(r.data()), e = b + r.size();
    const uintptr_t a = (b + 63) & ~uintptr_t{63};
    if (e <= a || (e - a) < kStep) continue;
    const size_t n = (e - a) / kStep * kStep;
    pieces.push_back({reinterpret_cast<const uint8_t*>(a), n});
    total += n;
  }
  if (total == 0) fail(ErrorKind::kInvalidArgument, "read bandwidth: no memory to read");
  PeakMeasure m;
  const ReadFn read = reader(level, m.isa);
  const int nt = pool.size();
  // Thread t reads bytes [start(t), start(t + 1)) of the pieces laid end to end.
  auto start = [&](int t) { return t == nt ? total : total / kStep * t / nt * kStep; };
  const double s = best_parallel_seconds(pool, passes, [&](int t) {
    const size_t b = start(t), e = start(t + 1);
    uint64_t sum = 0;
    size_t off = 0;
    for (const Piece& pc : pieces) {
      const size_t lo = std::max(b, off), hi = std::min(e, off + pc.n);
      if (lo < hi) sum += read(pc.p + (lo - off), hi - lo);
      off += pc.n;
      if (off >= e) break;
    }
    return static_cast<double>(sum);
  });
  m.value = static_cast<double>(total) / s / 1e9;
  return m;
}

PeakMeasure measure_read_bandwidth(ThreadPool& pool, size_t bytes, int passes, KernelLevel level) {
  check_args("read bandwidth", static_cast<int64_t>(bytes), passes);
  check_level(level);
  constexpr size_t kPage = 4096;
  bytes = (bytes + kPage - 1) / kPage * kPage;
  std::unique_ptr<uint8_t, decltype(&std::free)> buf(static_cast<uint8_t*>(std::aligned_alloc(kPage, bytes)),
                                                     &std::free);
  if (!buf) fail(ErrorKind::kResource, "read bandwidth: cannot allocate {} bytes", bytes);
  // Each thread faults in the pages it will read (about: the reads below
  // split the bytes evenly, in 256-byte steps rather than pages).
  const size_t pages = bytes / kPage;
  pool.run([&](int t, int n) {
    const size_t p0 = pages * t / n, p1 = pages * (t + 1) / n;
    std::memset(buf.get() + p0 * kPage, t + 1, (p1 - p0) * kPage);
  });
  const std::span<const uint8_t> all[] = {{buf.get(), bytes}};
  return measure_read_bandwidth_of(pool, all, passes, level);
}

PeakMeasure measure_fp32_fma_peak(ThreadPool& pool, int64_t iters, int trials, KernelLevel level) {
  check_args("fp32 peak", iters, trials);
  check_level(level);
  PeakMeasure m;
  double ops_per_iter = 8 * 2;
  float (*fn)(int64_t) = fma_scalar;
  m.isa = "scalar mul+add";
#if defined(__x86_64__)
  if (is_avx512(level)) {
    fn = fma_avx512;
    ops_per_iter = kChains512 * 16 * 2;
    m.isa = "avx512 vfmadd (fp32)";
  } else if (is_avx2(level)) {
    fn = fma_avx2;
    ops_per_iter = kChains256 * 8 * 2;
    m.isa = "avx2 vfmadd (fp32)";
  }
#endif
  const double s = best_parallel_seconds(pool, trials, [&](int) { return static_cast<double>(fn(iters)); });
  m.value = ops_per_iter * static_cast<double>(iters) * pool.size() / s / 1e9;
  return m;
}

PeakMeasure measure_int8_dot_peak(ThreadPool& pool, int64_t iters, int trials, KernelLevel level) {
  check_args("int8 peak", iters, trials);
  check_level(level);
  PeakMeasure m;
  double ops_per_iter = 8 * 2;
  int32_t (*fn)(int64_t) = int8_scalar;
  m.isa = "scalar int multiply-add";
#if defined(__x86_64__)
  switch (level) {
    case KernelLevel::kAvx512Vnni:
      fn = int8_avx512_vnni;
      ops_per_iter = kChains512 * 64 * 2;
      m.isa = "avx512 vpdpbusd (u8*s8)";
      break;
    case KernelLevel::kAvx512:
      fn = int8_avx512;
      ops_per_iter = kChains512 * 64 * 2;
      m.isa = "avx512 vpmaddubsw+vpmaddwd (u8*s8)";
      break;
    case KernelLevel::kAvx2Vnni:
      fn = int8_avx2_vnni;
      ops_per_iter = kChains256 * 32 * 2;
      m.isa = "avx-vnni vpdpbusd ymm (u8*s8)";
      break;
    case KernelLevel::kAvx2:
      fn = int8_avx2;
      ops_per_iter = kChains256 * 32 * 2;
      m.isa = "avx2 vpmaddubsw+vpmaddwd (u8*s8)";
      break;
    case KernelLevel::kScalar: break;
  }
#endif
  const double s = best_parallel_seconds(pool, trials, [&](int) { return static_cast<double>(fn(iters)); });
  m.value = ops_per_iter * static_cast<double>(iters) * pool.size() / s / 1e9;
  return m;
}

PeakMeasure measure_bf16_dot_peak(ThreadPool& pool, int64_t iters, int trials, KernelLevel level) {
#if defined(__x86_64__)
  if (level == KernelLevel::kAvx512Vnni && cpu_features().avx512bf16) {
    check_args("bf16 peak", iters, trials);
    PeakMeasure m;
    m.isa = "avx512 vdpbf16ps";
    const double s = best_parallel_seconds(pool, trials, [&](int) { return static_cast<double>(bf16_avx512(iters)); });
    m.value = double{kChains512} * 32 * 2 * static_cast<double>(iters) * pool.size() / s / 1e9;
    return m;
  }
#endif
  PeakMeasure m = measure_fp32_fma_peak(pool, iters, trials, level);
  m.isa = "bf16 widened to f32: " + m.isa;
  return m;
}

}  // namespace tandem

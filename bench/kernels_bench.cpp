// Microbenchmarks of the linear-layer kernels and the machine's ceilings.
//
//   ./build/kernels_bench --benchmark_filter=Gemm      # prefill GEMM, GOP/s
//   ./build/kernels_bench --benchmark_filter=Gemv      # decode GEMV, GB/s
//   ./build/kernels_bench --benchmark_filter=Ceiling   # read bandwidth, int8/fp32 peaks, q8_0's int8 ceiling
//   ./build/kernels_bench --benchmark_filter=Pool      # fork/join latency
//   ./build/kernels_bench --benchmark_filter=Attention # decode and prefill attention over a paged KV cache
//   ... --kernels=avx512-vnni                         # at another kernel level than the CPU's best
//
// Shapes are TinyLlama 1.1B's (2048 wide, 5632 FFN). "Old" rows are the
// per-output vec_dot loop Matmul used before the tiled kernels, kept here as
// the baseline. Thread count is the last argument of each benchmark.
#include <benchmark/benchmark.h>

// GCC 12's AVX-512 headers trip -Wuninitialized when inlined (see kernels/simd_avx512.h).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "runtime/cpu_features.h"
#include "quant/quant.h"
#include "quant/tensor.h"
#include "runtime/thread_pool.h"
#include "kernels/attention.h"
#include "kernels/sparse_select.h"
#include "kernels/vec_dot.h"
#include "kernels/vec_dot_impl.h"
#include "kernels/product_kernels.h"
#include "kernels/matmul.h"
#include "kernels/layouts.h"
#include "kernels/products.h"
#include "kv/kv_cache.h"

namespace tandem {
namespace {

ThreadPool& pool_of(int threads) {
  static std::map<int, std::unique_ptr<ThreadPool>> pools;
  auto& p = pools[threads];
  if (!p) p = std::make_unique<ThreadPool>(threads);
  return *p;
}

// A rows x cols matrix of type t quantized from normal values, in enough
// copies that cycling through them reads at least 96 MiB: three times the
// L3, so one-row products stream from memory as in decode, not from cache.
// Cached, since the large ones take a while to make.
struct Matrix {
  std::vector<uint8_t> data;
  size_t bytes = 0;  // one copy
  int copies = 1;
  WeightMatrix W(int i) const {
    const int64_t cols = w0.cols;
    return {w0.type, data.data() + (i % copies) * bytes, cols, w0.rows, w0.row_stride};
  }
  WeightMatrix w0;
  // The same copies repacked into panels (kernels/layouts.h), made on demand.
  std::unique_ptr<uint8_t, decltype(&std::free)> packed{nullptr, &std::free};
  size_t packed_bytes = 0;
  WeightLayout layout = WeightLayout::kFileRows;  // of `packed`
  WeightMatrix P(int i) const {
    WeightMatrix w = W(i);
    w.set_layout(layout, packed.get() + (i % copies) * packed_bytes);
    return w;
  }
};

// Repacks every copy of m once as a model load would: panels (q8_0) or
// tiles (q4_0, q5_0, q4_K); false when its type is neither.
bool ensure_packed(Matrix& m, ThreadPool& pool) {
  if (m.packed) return true;
  const KernelLevel level = active_kernel_level();
  const LayoutChoice c = choose_layout(m.w0, level, PrepackMode::kAuto);
  if (c.layout == WeightLayout::kFileRows) return false;
  const size_t stride = (c.bytes + 63) / 64 * 64;
  m.packed.reset(static_cast<uint8_t*>(std::aligned_alloc(64, stride * m.copies)));
  m.packed_bytes = stride;
  m.layout = c.layout;
  for (int i = 0; i < m.copies; ++i)
    write_layout(m.W(i), c.layout, level, m.packed.get() + i * stride, 0, layout_tile_count(m.w0, c.layout), pool);
  return true;
}

Matrix& matrix(GgmlType t, int64_t rows, int64_t cols) {
  static std::map<std::tuple<int, int64_t, int64_t>, std::unique_ptr<Matrix>> cache;
  auto& m = cache[{static_cast<int>(t), rows, cols}];
  if (m) return *m;
  m = std::make_unique<Matrix>();
  const size_t rb = row_bytes(t, cols);
  m->bytes = rb * rows;
  m->copies = static_cast<int>(std::max<size_t>(1, ((size_t{96} << 20) + m->bytes - 1) / m->bytes));
  m->data.resize(m->bytes * m->copies);
  std::mt19937 rng(static_cast<uint32_t>(rows * 31 + cols));
  std::normal_distribution<float> normal(0.0f, 0.02f);
  std::vector<float> src(cols);
  for (int64_t r = 0; r < rows; ++r) {
    for (auto& v : src) v = normal(rng);
    quantize_row(t, src.data(), m->data.data() + r * rb, cols);
  }
  for (int c = 1; c < m->copies; ++c) std::memcpy(m->data.data() + c * m->bytes, m->data.data(), m->bytes);
  m->w0 = {t, m->data.data(), cols, rows, rb};
  return *m;
}

std::vector<float> activations(int64_t rows, int64_t cols) {
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(rows * cols);
  for (auto& v : x) v = normal(rng);
  return x;
}

constexpr GgmlType kTypes[] = {GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q4_K, GgmlType::F16,
                               GgmlType::Q5_0, GgmlType::Q6_K, GgmlType::BF16, GgmlType::MXFP4};

// The per-output vec_dot loop of the previous Matmul (tiles of 16 weight rows
// meeting every activation row), for before/after numbers.
void old_matmul(const WeightMatrix& W, const float* x, int64_t n_rows, float* y, ThreadPool& pool,
                std::vector<uint8_t>& act_buf) {
  const GgmlType at = vec_dot_type(W.type);
  const size_t stride = row_bytes(at, W.cols);
  act_buf.resize(stride * n_rows);
  pool.parallel_for(n_rows, 1, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) quantize_activations(at, x + r * W.cols, act_buf.data() + r * stride, W.cols);
  });
  const VecDotFn dot = vec_dot_fn(W.type);
  const int64_t tiles = (W.rows + 15) / 16;
  pool.parallel_for(tiles, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t)
      for (int64_t r = 0; r < n_rows; ++r)
        for (int64_t o = t * 16; o < std::min(W.rows, t * 16 + 16); ++o)
          y[r * W.rows + o] = dot(W.cols, W.row(o), act_buf.data() + r * stride);
  });
}

// args: type index, N, K, M, threads, mode (0: file layout, 1: old, 2: as loaded
// (q8_0 panels, q4_0 / q5_0 / q4_K tiles),
// 3: file layout, always the same copy: from cache when it fits, the kernel's
// compute speed without the memory stream)
void BM_Gemm(benchmark::State& state) {
  const GgmlType t = kTypes[state.range(0)];
  const int64_t N = state.range(1), K = state.range(2), M = state.range(3);
  const int threads = static_cast<int>(state.range(4));
  const bool old = state.range(5) == 1;
  const bool pre = state.range(5) == 2;
  const bool cached = state.range(5) == 3;
  Matrix& m = matrix(t, N, K);
  const std::vector<float> x = activations(M, K);
  std::vector<float> y(M * N);
  ThreadPool& pool = pool_of(threads);
  Matmul mm;
  std::vector<uint8_t> act;
  if (pre && !ensure_packed(m, pool)) {
    state.SkipWithError("type not prepacked");
    return;
  }
  int copy = 0;
  for (auto _ : state) {
    const WeightMatrix W = pre ? m.P(copy++) : m.W(cached ? 0 : copy++);
    if (old) {
      old_matmul(W, x.data(), M, y.data(), pool, act);
    } else {
      mm.run(W, x.data(), K, M, y.data(), N, pool);
    }
    benchmark::DoNotOptimize(y.data());
  }
  state.SetLabel(std::string(type_traits(t).name) + (old ? " old" : pre ? " prepacked" : cached ? " cached" : ""));
  state.counters["GOP/s"] = benchmark::Counter(2.0 * M * N * K, benchmark::Counter::kIsIterationInvariantRate,
                                               benchmark::Counter::kIs1000);
  state.counters["weightGB/s"] = benchmark::Counter(static_cast<double>(m.bytes),
                                                    benchmark::Counter::kIsIterationInvariantRate,
                                                    benchmark::Counter::kIs1000);
}

void gemm_args(benchmark::internal::Benchmark* b) {
  const int64_t shapes[][2] = {{2048, 2048}, {5632, 2048}, {2048, 5632}};
  for (int ti = 0; ti < 4; ++ti)
    for (auto& s : shapes)
      for (int old : {0, 1}) b->Args({ti, s[0], s[1], 512, 2, old});
  for (int ti = 4; ti < 7; ++ti) b->Args({ti, 2048, 2048, 512, 2, 0});
  for (auto& s : shapes) b->Args({0, s[0], s[1], 512, 2, 2});  // q8_0 as loaded (prepacked)
  // The row counts a prefill's products run with (Model: feed-forward rows
  // in chunks of 128, attention in 256), one thread and two.
  for (auto& s : shapes)
    for (int m : {128, 256})
      for (int th : {1, 2}) b->Args({0, s[0], s[1], m, th, 2});
  // One thread: per-core rates.
  for (int ti = 0; ti < 7; ++ti) b->Args({ti, 2048, 2048, 512, 1, 0});
  for (int m : {48, 96, 192, 384}) b->Args({0, 2048, 2048, m, 1, 0});  // q8_0, one thread: acts in L1/L2 or not
}
BENCHMARK(BM_Gemm)->Apply(gemm_args)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(1.0);

// Activation preparation alone (quantize + interleave), M x K on one thread.
void BM_GemmPrepareActs(benchmark::State& state) {
  const GgmlType t = kTypes[state.range(0)];
  const int64_t M = state.range(1), K = state.range(2);
  const std::vector<float> x = activations(M, K);
  GemmActs A;
  for (auto _ : state) {
    gemm_acts_shape(t, M, K, kGemmMaxRows, A);
    gemm_prepare_acts(x.data(), K, 0, A.groups, A, active_kernel_level());
    benchmark::DoNotOptimize(A.q.data());
  }
  state.SetLabel(std::string(type_traits(t).name));
  state.counters["Melem/s"] = benchmark::Counter(static_cast<double>(M * K), benchmark::Counter::kIsIterationInvariantRate,
                                                 benchmark::Counter::kIs1000);
}
BENCHMARK(BM_GemmPrepareActs)->Args({0, 512, 2048})->Args({2, 512, 2048})->Args({3, 512, 2048})->Args({0, 1, 2048})
    ->Unit(benchmark::kMicrosecond);

// Decode: one activation row, every weight byte read once.
void gemv_args(benchmark::internal::Benchmark* b) {
  for (int ti = 0; ti < 7; ++ti)
    for (int threads : {1, 2})
      for (int old : {0, 1}) b->Args({ti, 5632, 2048, 1, threads, old});
  for (int m : {2, 3, 4, 6, 8, 12, 16, 32}) b->Args({0, 5632, 2048, m, 2, 0});
  // F16 in its float tiles (as loaded), decode: the widest and a k/v-sized matrix.
  for (int64_t n : {5632, 2048, 256}) b->Args({3, n, 2048, 1, 2, 2});
  // Serving steps: a few to a few dozen rows against weights repacked at load.
  for (int m : {1, 2, 4, 6, 8, 12, 16, 24, 32, 64, 128, 256}) b->Args({0, 5632, 2048, m, 2, 2});
  // Gemma 3's output matrix (its q8_0 embedding, 262144 x 640): K is 20 blocks.
  for (int m : {1, 8, 16}) b->Args({0, 262144, 640, m, 2, 2});
  for (int m : {8, 16}) b->Args({0, 16384, 640, m, 2, 2});
  for (int m : {8, 16}) b->Args({0, 2048, 640, m, 2, 2});
  for (int m : {8, 16}) b->Args({0, 2048, 2048, m, 2, 2});
  // K-quant row kernels with a few activation rows (decode of a few sequences).
  for (int ti : {1, 2, 4, 5})
    for (int m : {2, 3, 4, 6, 8, 16}) b->Args({ti, 5632, 2048, m, 2, 0});
  // q4_0, q5_0 and q4_K in their tiles, as a model loads them; q5_0 also in
  // Gemma 3's shapes (K = 640: 20 blocks).
  for (int ti : {1, 4, 2})
    for (int m : {1, 2, 3, 4, 6, 8, 16, 32, 64, 128}) b->Args({ti, 5632, 2048, m, 2, 2});
  for (int ti : {1, 4, 2}) b->Args({ti, 5632, 2048, 1, 1, 2});
  for (int m : {1, 16}) b->Args({4, 2048, 640, m, 2, 2});
  // Compute speed of the row kernels: 384 rows (1.5 MiB or less) read from L2.
  for (int ti = 0; ti < 7; ++ti) b->Args({ti, 384, 2048, 1, 1, 3});
  // mxfp4 beside q4_0's rows above, one thread: decode from memory,
  // Matmul's route (vec_dot for one row) and the per-output vec_dot loop
  // ("old", the same loop for both types); from L2; and 64 activation rows.
  for (int old : {0, 1}) b->Args({7, 5632, 2048, 1, 1, old});
  b->Args({7, 384, 2048, 1, 1, 3});
  for (int ti : {1, 7}) b->Args({ti, 2048, 2048, 64, 1, 0});
  // mxfp4's panels against its vec_dot loop ("old": the route it had before
  // its panels) and q4_0's panels, one thread: 2-8 rows (where the panels
  // take over from the dot), 64 and 512 rows of a 2048 x 2048 matrix, and a
  // Qwen3-30B-A3B expert's gate (768 x 2048) and down (2048 x 768) with the
  // 32 rows an expert gets on average in a 512-token prefill (8 of 128).
  for (int m : {2, 4, 8}) b->Args({7, 5632, 2048, m, 1, 0});
  // mxfp4's row kernels (decode) against its vec_dot loop: two threads (q4_0's
  // are above); and one expert's gate / up (768 x 2048) and down (2048 x 768)
  // of a Qwen3-30B-A3B shape, one row from memory, beside q4_0's.
  for (int old : {0, 1}) b->Args({7, 5632, 2048, 1, 2, old});
  for (int ti : {1, 7})
    for (int old : {0, 1}) {
      b->Args({ti, 768, 2048, 1, 1, old});
      b->Args({ti, 2048, 768, 1, 1, old});
    }
  for (int64_t m : {64, 512})
    for (int ti : {1, 7})
      for (int old : {0, 1}) b->Args({ti, 2048, 2048, m, 1, old});
  for (int ti : {1, 7})
    for (int old : {0, 1}) {
      b->Args({ti, 768, 2048, 32, 1, old});
      b->Args({ti, 2048, 768, 32, 1, old});
    }
}
void BM_Gemv(benchmark::State& state) { BM_Gemm(state); }
BENCHMARK(BM_Gemv)->Apply(gemv_args)->Unit(benchmark::kMicrosecond)->UseRealTime()->MinTime(0.5);

// Read bandwidth: every thread sums its own contiguous slice of a buffer far
// larger than the caches, with 512-bit loads.
__attribute__((target("avx512f"))) uint64_t sum_slice(const uint8_t* p, size_t n) {
  __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
  for (size_t i = 0; i + 256 <= n; i += 256) {
    a0 = _mm512_add_epi64(a0, _mm512_load_si512(p + i));
    a1 = _mm512_add_epi64(a1, _mm512_load_si512(p + i + 64));
    a2 = _mm512_add_epi64(a2, _mm512_load_si512(p + i + 128));
    a3 = _mm512_add_epi64(a3, _mm512_load_si512(p + i + 192));
  }
  return static_cast<uint64_t>(_mm512_reduce_add_epi64(_mm512_add_epi64(_mm512_add_epi64(a0, a1), _mm512_add_epi64(a2, a3))));
}

bool have_avx512_vnni(benchmark::State& state) {
  if (cpu_supports_level(KernelLevel::kAvx512Vnni)) return true;
  state.SkipWithError("needs AVX512-VNNI");
  return false;
}

void BM_CeilingReadBandwidth(benchmark::State& state) {
  if (!have_avx512_vnni(state)) return;
  const size_t bytes = size_t{1} << 30;
  const int threads = static_cast<int>(state.range(0));
  ThreadPool& pool = pool_of(threads);
  std::unique_ptr<uint8_t, decltype(&std::free)> buf(static_cast<uint8_t*>(std::aligned_alloc(4096, bytes)), &std::free);
  pool.run([&](int t, int nt) { std::memset(buf.get() + bytes / nt * t, t + 1, bytes / nt); });
  std::atomic<uint64_t> sink{0};
  for (auto _ : state)
    pool.run([&](int t, int nt) { sink += sum_slice(buf.get() + bytes / nt * t, bytes / nt); });
  benchmark::DoNotOptimize(sink.load());
  state.counters["GB/s"] = benchmark::Counter(static_cast<double>(bytes), benchmark::Counter::kIsIterationInvariantRate,
                                              benchmark::Counter::kIs1000);
}
BENCHMARK(BM_CeilingReadBandwidth)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(2.0);

// Instruction throughput: 12 independent chains per thread, long enough that
// only issue width limits them.
__attribute__((target("avx512f,avx512vnni"))) int64_t vnni_loop(int64_t iters) {
  __m512i acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm512_set1_epi32(i);
  const __m512i a = _mm512_set1_epi8(3), b = _mm512_set1_epi8(-2);
  for (int64_t it = 0; it < iters; ++it)
    for (int i = 0; i < 12; ++i) acc[i] = _mm512_dpbusd_epi32(acc[i], a, b);
  __m512i s = acc[0];
  for (int i = 1; i < 12; ++i) s = _mm512_add_epi32(s, acc[i]);
  return _mm512_reduce_add_epi32(s);
}
__attribute__((target("avx512f,fma"))) float fma_loop(int64_t iters) {
  __m512 acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm512_set1_ps(static_cast<float>(i));
  const __m512 a = _mm512_set1_ps(0.999f), b = _mm512_set1_ps(0.001f);
  for (int64_t it = 0; it < iters; ++it)
    for (int i = 0; i < 12; ++i) acc[i] = _mm512_fmadd_ps(acc[i], a, b);
  __m512 s = acc[0];
  for (int i = 1; i < 12; ++i) s = _mm512_add_ps(s, acc[i]);
  return _mm512_reduce_add_ps(s);
}

// Runs loop(iters) on each of the pool's threads per iteration and reports
// ops_per_iter x iters x threads per second as `counter`.
template <typename Loop>
void compute_ceiling(benchmark::State& state, int64_t iters, double ops_per_iter, const char* counter, Loop loop) {
  if (!have_avx512_vnni(state)) return;
  const int threads = static_cast<int>(state.range(0));
  ThreadPool& pool = pool_of(threads);
  std::atomic<int64_t> sink{0};
  for (auto _ : state) pool.run([&](int, int) { sink += static_cast<int64_t>(loop(iters)); });
  benchmark::DoNotOptimize(sink.load());
  state.counters[counter] = benchmark::Counter(ops_per_iter * static_cast<double>(iters) * threads,
                                               benchmark::Counter::kIsIterationInvariantRate, benchmark::Counter::kIs1000);
}

void BM_CeilingInt8Vnni(benchmark::State& state) {
  // 12 instructions of 64 multiply-adds = 128 ops each.
  compute_ceiling(state, 1 << 20, 128.0 * 12, "GOP/s", vnni_loop);
}
BENCHMARK(BM_CeilingInt8Vnni)->Arg(1)->Arg(2)->UseRealTime()->MinTime(1.0);

// The int8 peak as the q8_0 format allows it: each 32-element block of each
// output ends its 8 dpbusd with a float tail (convert, scale product, FMA;
// product_kernels.h), as in the panel kernels, but with every operand in L1 and only
// 4 activation rows x 2 panels of accumulators, so nothing waits on memory. The
// scale product and the FMA compete with dpbusd for the same two pipes on
// Zen 4, so this is what a q8_0 product can reach, below the plain dpbusd peak.
// SCALE = false drops the scale product (d * activation scale; the FMA then
// scales by d alone): not a correct q8_0 product, it shows what that one
// multiply per 8 dpbusd costs. The convert runs on other pipes and costs
// nothing (measured: convert + add, no multiply, ran at the plain peak).
template <bool SCALE>
__attribute__((target("avx512f,avx512vnni,f16c"))) float q8_0_block_loop(int64_t iters) {
  alignas(64) static uint8_t w[2][8][64];
  alignas(64) static int8_t a[16][8][16];  // 16 blocks of 8 k-groups x 4 rows x 4 quants
  alignas(64) static float ws[16][2][16], as[16][4];
  static const bool filled = [] {
    std::mt19937 rng(7);
    auto scale = [&] { return 1e-3f * static_cast<float>(rng() % 100 + 1); };
    for (uint8_t& x : std::span(&w[0][0][0], sizeof(w))) x = static_cast<uint8_t>(rng());
    for (int8_t& x : std::span(&a[0][0][0], sizeof(a))) x = static_cast<int8_t>(static_cast<int>(rng() % 255) - 127);
    for (float& x : std::span(&ws[0][0][0], sizeof(ws) / 4)) x = scale();
    for (float& x : std::span(&as[0][0], sizeof(as) / 4)) x = scale();
    return true;
  }();
  (void)filled;
  __m512 f[2][4];
  for (auto& v : f)
    for (__m512& x : v) x = _mm512_setzero_ps();
  for (int64_t it = 0; it < iters; ++it) {
    const int b = static_cast<int>(it & 15);  // scales and activations move each block: nothing hoists
    __m512i t[2][4];
    for (auto& v : t)
      for (__m512i& x : v) x = _mm512_setzero_si512();
    for (int g = 0; g < 8; ++g) {
      const __m512i w0 = _mm512_load_si512(w[0][g]), w1 = _mm512_load_si512(w[1][g]);
      for (int r = 0; r < 4; ++r) {
        int32_t q;
        std::memcpy(&q, &a[b][g][4 * r], 4);
        const __m512i ar = _mm512_set1_epi32(q);
        t[0][r] = _mm512_dpbusd_epi32(t[0][r], w0, ar);
        t[1][r] = _mm512_dpbusd_epi32(t[1][r], w1, ar);
      }
    }
    for (int v = 0; v < 2; ++v) {
      const __m512 d = _mm512_load_ps(ws[b][v]);
      for (int r = 0; r < 4; ++r)
        f[v][r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(t[v][r]), SCALE ? _mm512_mul_ps(d, _mm512_set1_ps(as[b][r])) : d,
                                  f[v][r]);
    }
  }
  __m512 s = _mm512_setzero_ps();
  for (auto& v : f)
    for (__m512& x : v) s = _mm512_add_ps(s, x);
  return _mm512_reduce_add_ps(s);
}

void BM_CeilingQ8_0Blocks(benchmark::State& state) {
  // 64 dpbusd of 64 multiply-adds (128 ops) per block.
  compute_ceiling(state, 1 << 18, 128.0 * 64, "GOP/s", q8_0_block_loop<true>);
}
BENCHMARK(BM_CeilingQ8_0Blocks)->Arg(1)->Arg(2)->UseRealTime()->MinTime(1.0);

void BM_CeilingQ8_0BlocksNoScaleProduct(benchmark::State& state) {
  compute_ceiling(state, 1 << 18, 128.0 * 64, "GOP/s", q8_0_block_loop<false>);
}
BENCHMARK(BM_CeilingQ8_0BlocksNoScaleProduct)->Arg(1)->Arg(2)->UseRealTime()->MinTime(1.0);

void BM_CeilingFp32Fma(benchmark::State& state) {
  // 12 FMAs of 16 lanes = 32 flops each.
  compute_ceiling(state, 1 << 20, 32.0 * 12, "GFLOP/s", fma_loop);
}
BENCHMARK(BM_CeilingFp32Fma)->Arg(1)->Arg(2)->UseRealTime()->MinTime(1.0);

// The attention benchmarks' cache: the 1.1B shape (32 query heads, 4 KV
// heads of 64) in all 22 layers, in 16-slot blocks (f16 unless `type` says),
// B sequences of N positions filled with N(0,1) keys and values from `rng`.
struct AttnBenchCache {
  static constexpr int32_t kLayers = 22, kHead = 64, kHeadsKv = 4, kBlock = 16;
  const AttnShape s{8 * kHeadsKv, kHeadsKv, kHead, kHead, 0};
  KvCache kv;
  std::vector<std::vector<int32_t>> tables;

  AttnBenchCache(int32_t N, int32_t B, std::mt19937& rng, KvType type = KvType::kF16)
      : kv({kLayers, kHeadsKv * kHead, kHeadsKv * kHead, kHeadsKv}, (N + kBlock - 1) / kBlock * B, kBlock, type),
        tables(B) {
    std::normal_distribution<float> normal;
    std::vector<float> k(kHeadsKv * kHead), v(kHeadsKv * kHead);
    for (auto& t : tables)
      for (int32_t i = 0; i < (N + kBlock - 1) / kBlock; ++i) t.push_back(kv.allocate());
    for (int32_t l = 0; l < kLayers; ++l)
      for (const auto& t : tables)
        for (int32_t p = 0; p < N; ++p) {
          for (float& x : k) x = normal(rng);
          for (float& x : v) x = normal(rng);
          kv.write(l, t[p / kBlock], p % kBlock, k.data(), v.data());
        }
  }
};

// Decode attention of one step: B sequences at position N - 1 (N cached
// positions each) through all 22 layers (AttnBenchCache). In a real step the
// weights' stream (1.1 GB) has evicted the K and V since the last one, so
// each iteration first reads 64 MiB (twice L3) outside the timing. Args: N,
// B, threads, the cache type of K and V (KvType: 0 f16, 2 q8_0, 3 q4_0), and
// 1 for a hot cache: layer 0 read 22 times with no eviction, the arithmetic
// alone where one layer fits in L2 (N * B * 288 bytes for q4_0, 544 for q8_0,
// 1024 for f16).
// KV GB/s counts the bytes the type stores.
void BM_AttentionDecode(benchmark::State& state) {
  const int32_t N = static_cast<int32_t>(state.range(0)), B = static_cast<int32_t>(state.range(1));
  const auto type = static_cast<KvType>(state.range(3));
  const bool hot = state.range(4) != 0;
  std::mt19937 rng(5);
  AttnBenchCache c(N, B, rng, type);
  const AttnShape& s = c.s;
  std::normal_distribution<float> normal;
  std::vector<float> q(size_t(B) * s.n_head * s.head_dim), out(q.size());
  for (float& x : q) x = normal(rng) * 0.125f;
  const std::vector<int32_t> positions(B, N - 1);
  std::vector<KvLayerView> views(B);
  ThreadPool& pool = pool_of(static_cast<int>(state.range(2)));
  std::vector<uint64_t> evict((size_t{64} << 20) / sizeof(uint64_t), 1);
  uint64_t sink = 0;
  for (auto _ : state) {
    if (!hot) {
      state.PauseTiming();
      for (size_t i = 0; i < evict.size(); i += 8) sink += evict[i];
      state.ResumeTiming();
    }
    for (int32_t l = 0; l < c.kLayers; ++l) {
      for (int32_t b = 0; b < B; ++b) views[b] = c.kv.layer_view(hot ? 0 : l, c.tables[b].data());
      attention_decode(s, views.data(), positions.data(), B, q.data(), s.n_head * s.head_dim, out.data(),
                       s.n_head * s.head_dim, pool);
    }
  }
  benchmark::DoNotOptimize(out.data());
  benchmark::DoNotOptimize(sink);
  const double bytes = double(c.kLayers) * B * N * 2 * s.n_head_kv * kv_bytes(type, s.head_dim);
  state.counters["KV GB/s"] = benchmark::Counter(bytes, benchmark::Counter::kIsIterationInvariantRate,
                                                 benchmark::Counter::kIs1000);
}
BENCHMARK(BM_AttentionDecode)->Args({512, 1, 2, 0, 0})->Args({1088, 1, 2, 0, 0})->Args({4096, 1, 2, 0, 0})
    ->Args({128, 16, 2, 0, 0})->Args({2048, 16, 2, 0, 0})->Args({2048, 16, 2, 2, 0})->Args({2048, 16, 2, 3, 0})
    ->Args({32768, 1, 2, 0, 0})->Args({32768, 1, 2, 2, 0})->Args({32768, 1, 2, 3, 0})
    ->Args({128, 16, 2, 0, 1})->Args({128, 16, 2, 2, 1})->Args({128, 16, 2, 3, 1})
    ->Args({2048, 1, 1, 0, 1})->Args({2048, 1, 1, 2, 1})->Args({2048, 1, 1, 3, 1})
    ->Unit(benchmark::kMicrosecond)->UseRealTime()->MinTime(1.0);

// The cache of the sparse cases, kept from one case to the next of the same
// N, B and type (filling 32k positions of 22 layers takes seconds), so that
// a shape's dense, sparse and selection-alone rows run one after another.
AttnBenchCache& sparse_bench_cache(int32_t N, int32_t B, KvType type) {
  static std::unique_ptr<AttnBenchCache> c;
  static std::tuple<int32_t, int32_t, KvType> key;
  if (!c || key != std::make_tuple(N, B, type)) {
    c.reset();  // two 32k caches need not fit together
    std::mt19937 rng(5);
    c = std::make_unique<AttnBenchCache>(N, B, rng, type);
    c->kv.keep_key_bounds(std::vector<bool>(AttnBenchCache::kLayers, true));
    for (const auto& t : c->tables)
      for (int32_t blk : t) c->kv.key_bounds()->update_all(c->kv, blk);
    key = std::make_tuple(N, B, type);
  }
  return *c;
}

// Sparse decode attention (Quest) of the same step: per layer, each
// (sequence, KV head) scores every block's key bounds and selects its
// blocks (on the pool, as Model::forward does), then attention reads those.
// Args: N, B, threads, type (as above), the budget (positions), and what is
// timed: 0 the whole step, 1 the selection alone. Budget 0 is dense attention
// through the same loop. The keys are random, so the selection's choice
// means nothing here; its cost and the reads are real. bench/sparse_speed.py
// runs the grid below in rounds and prints the speed-ups.
void BM_AttentionDecodeSparse(benchmark::State& state) {
  const int32_t N = static_cast<int32_t>(state.range(0)), B = static_cast<int32_t>(state.range(1));
  const auto type = static_cast<KvType>(state.range(3));
  SparseAttention o;
  o.budget = static_cast<int32_t>(state.range(4));
  const bool select_only = state.range(5) != 0;
  AttnBenchCache& c = sparse_bench_cache(N, B, type);
  const AttnShape& s = c.s;
  const int32_t bs = AttnBenchCache::kBlock, group = s.n_head / s.n_head_kv;
  const KeyBounds& kb = *c.kv.key_bounds();
  std::mt19937 rng(6);
  std::normal_distribution<float> normal;
  std::vector<float> q(size_t(B) * s.n_head * s.head_dim), out(q.size());
  for (float& x : q) x = normal(rng) * 0.125f;
  const int32_t n_table = sparse_table_blocks(o, N - 1, bs);
  std::vector<int32_t> positions(B, n_table > 0 ? (n_table - 1) * bs + (N - 1) % bs : N - 1);
  std::vector<int32_t> tables(size_t(B) * s.n_head_kv * std::max(n_table, 1));
  std::vector<KvLayerView> views(B);
  ThreadPool& pool = pool_of(static_cast<int>(state.range(2)));
  std::vector<uint64_t> evict((size_t{64} << 20) / sizeof(uint64_t), 1);
  uint64_t sink = 0;
  for (auto _ : state) {
    state.PauseTiming();
    for (size_t i = 0; i < evict.size(); i += 8) sink += evict[i];
    state.ResumeTiming();
    for (int32_t l = 0; l < c.kLayers; ++l) {
      if (n_table > 0) {
        pool.parallel_for(int64_t{B} * s.n_head_kv, 1, [&](int64_t u0, int64_t u1) {
          thread_local std::vector<float> scores;
          thread_local std::vector<int32_t> index;
          if (scores.size() < size_t(N / bs + 1)) {
            scores.resize(N / bs + 1);
            index.resize(N / bs + 1);
          }
          for (int64_t u = u0; u < u1; ++u) {
            const int32_t b = static_cast<int32_t>(u / s.n_head_kv), h = static_cast<int32_t>(u % s.n_head_kv);
            select_blocks(active_kernel_level(), o, N - 1, bs, c.tables[b].data(),
                          q.data() + (size_t(b) * s.n_head + size_t(h) * group) * s.head_dim, group, s.head_dim,
                          s.head_dim, kb.base(l, h), kb.block_stride(), scores.data(), index.data(),
                          tables.data() + (size_t(b) * s.n_head_kv + h) * n_table);
          }
        });
      }
      if (select_only) continue;
      for (int32_t b = 0; b < B; ++b) {
        if (n_table > 0) {
          views[b] = c.kv.layer_view(l, tables.data() + size_t(b) * s.n_head_kv * n_table);
          views[b].head_table_stride = n_table;
        } else {
          views[b] = c.kv.layer_view(l, c.tables[b].data());
        }
      }
      attention_decode(s, views.data(), positions.data(), B, q.data(), s.n_head * s.head_dim, out.data(),
                       s.n_head * s.head_dim, pool);
    }
  }
  benchmark::DoNotOptimize(out.data());
  benchmark::DoNotOptimize(sink);
  state.counters["bounds B/block"] = double(kb.bytes_per_block());
  state.counters["K/V B/block"] = double(c.kv.block_bytes());
}
// One sequence of 8k-32k at budget 4,096 and 16 of 4k at 1,024, f16 and
// q8_0: dense, sparse, the selection alone, in that order per shape.
void sparse_grid(benchmark::internal::Benchmark* b) {
  for (int64_t type : {0, 2}) {
    for (int64_t n : {8192, 16384, 32768})
      for (auto [budget, sel] : {std::pair{0, 0}, {4096, 0}, {4096, 1}}) b->Args({n, 1, 2, type, budget, sel});
    for (auto [budget, sel] : {std::pair{0, 0}, {1024, 0}, {1024, 1}}) b->Args({4096, 16, 2, type, budget, sel});
  }
}
BENCHMARK(BM_AttentionDecodeSparse)->Apply(sparse_grid)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(0.5);

// Prefill attention of one N-token prompt through the same 22 layers
// (causal, K/V written beforehand). Args: N, threads, and 1 for an f32
// cache instead of f16 (what the kernels' f16 -> f32 conversions cost).
// GFLOP/s counts the causal half: 2 * 2 * N(N+1)/2 * head_dim per query head.
void BM_AttentionPrefill(benchmark::State& state) {
  const int32_t N = static_cast<int32_t>(state.range(0));
  std::mt19937 rng(6);
  AttnBenchCache c(N, 1, rng, state.range(2) != 0 ? KvType::kF32 : KvType::kF16);
  const AttnShape& s = c.s;
  std::normal_distribution<float> normal;
  const int64_t QW = int64_t{s.n_head} * s.head_dim;
  std::vector<float> q(size_t(N) * QW), out(q.size());
  for (float& x : q) x = normal(rng) * 0.125f;
  ThreadPool& pool = pool_of(static_cast<int>(state.range(1)));
  for (auto _ : state)
    for (int32_t l = 0; l < c.kLayers; ++l)
      attention_prefill(s, c.kv.layer_view(l, c.tables[0].data()), q.data(), QW, 0, N, out.data(), QW, pool);
  benchmark::DoNotOptimize(out.data());
  const double flops = double(c.kLayers) * s.n_head * 4.0 * s.head_dim * (double(N) * (N + 1) / 2);
  state.counters["GFLOP/s"] = benchmark::Counter(flops, benchmark::Counter::kIsIterationInvariantRate,
                                                 benchmark::Counter::kIs1000);
}
BENCHMARK(BM_AttentionPrefill)->Args({512, 2, 0})->Args({512, 2, 1})->Args({2048, 2, 0})
    ->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(1.0);

// Fork/join latency of an empty job, and of a parallel_for over 64 items.
void BM_PoolEmptyRun(benchmark::State& state) {
  ThreadPool& pool = pool_of(static_cast<int>(state.range(0)));
  for (auto _ : state) pool.run([](int, int) {});
}
BENCHMARK(BM_PoolEmptyRun)->Arg(1)->Arg(2)->UseRealTime()->MinTime(0.5);

void BM_PoolParallelFor(benchmark::State& state) {
  ThreadPool& pool = pool_of(static_cast<int>(state.range(0)));
  std::vector<int64_t> out(64);
  for (auto _ : state) {
    pool.parallel_for(64, 1, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) out[i] += i;
    });
  }
  benchmark::DoNotOptimize(out.data());
}
BENCHMARK(BM_PoolParallelFor)->Arg(1)->Arg(2)->UseRealTime()->MinTime(0.5);

}  // namespace
}  // namespace tandem

// --kernels=LEVEL runs the kernels at that level (the CLI's --kernels names),
// so one binary compares levels on the same machine. Unlike the CLI, a level
// it cannot run is an error, not a fallback: a row measured at another level
// than asked would mislead.
int main(int argc, char** argv) {
  constexpr std::string_view kFlag = "--kernels=";
  std::vector<char*> args;
  for (int i = 0; i < argc; ++i) {
    const std::string_view a(argv[i]);
    if (a.rfind(kFlag, 0) != 0) {
      args.push_back(argv[i]);
      continue;
    }
    std::string warning;
    const tandem::KernelLevel level =
        tandem::choose_kernel_level(a.substr(kFlag.size()), tandem::best_kernel_level(), &warning);
    if (!warning.empty()) {
      std::string usable;
      for (tandem::KernelLevel l : tandem::kAllKernelLevels)
        if (tandem::cpu_supports_level(l)) usable += std::string(" ") + tandem::kernel_level_name(l);
      std::fprintf(stderr, "kernels_bench: %s is not a level this CPU runs (it runs:%s)\n", argv[i], usable.c_str());
      return 2;
    }
    tandem::set_active_kernel_level(level);
  }
  int n = static_cast<int>(args.size());
  benchmark::Initialize(&n, args.data());
  if (benchmark::ReportUnrecognizedArguments(n, args.data())) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}

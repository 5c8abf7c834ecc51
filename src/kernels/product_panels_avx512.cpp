// AVX-512 tiled kernels: AVX512-VNNI dpbusd for the quantized classes, FMA
// for the float class. A panel vector holds one value (or four quants) per
// weight row; activations come in as 32-bit broadcasts straight from memory,
// so each weight vector loaded is used by all R activation rows.
//
// dpbusd multiplies unsigned by signed bytes: the panel holds the weight
// quants as unsigned (q + offset) and the activations stay signed; the
// offset's contribution, offset * sum(activation quants), is precomputed per
// block (the "extra" of gemm_prepare_acts) and seeds the integer sum.
#include "kernels/simd_avx512.h"

#if defined(__x86_64__)

#include <type_traits>

#include "kernels/layout_panels.h"
#include "kernels/kernel_builds.h"
#include "kernels/product_kernels.h"

namespace tandem::gemm_detail {
namespace {

TD_FN __m512i bcast32(const void* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}

template <int R>
TD_FN void load_acc(const GemmAcc& acc, __m512 f[R]) {
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) f[r] = acc.in ? _mm512_loadu_ps(acc.in + r * kGemmTile) : _mm512_setzero_ps();
}
template <int R>
TD_FN void store_acc(const GemmAcc& acc, const __m512 f[R]) {
  if (acc.stream_out) {
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) _mm512_stream_ps(acc.out + r * acc.ld_out, f[r]);
    return;
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) _mm512_storeu_ps(acc.out + r * acc.ld_out, f[r]);
}

// Panels repacked at load stream from memory, used by only a few activation
// rows in a serving step; the hardware prefetcher alone can leave the stream
// idle while the dot products run, so the first row group of a chunk may
// prefetch each block's lines ahead (GemmAcc::prefetch_bytes; how far, and
// from how many rows, is per CPU: kernels/stream_tuning.h). Prefetches never
// fault, so running past the matrix's end is harmless.
TD_FN void prefetch_block(const uint8_t* panel, const GemmAcc& acc) {
  if (acc.prefetch_bytes <= 0) return;
  const char* ahead = reinterpret_cast<const char*>(panel + acc.prefetch_bytes);
  if (acc.prefetch_to_l2) {
#pragma GCC unroll 9
    for (size_t l = 0; l < Q32Panel::kBytes; l += 64) _mm_prefetch(ahead + l, _MM_HINT_T1);
  } else {
#pragma GCC unroll 9
    for (size_t l = 0; l < Q32Panel::kBytes; l += 64) _mm_prefetch(ahead + l, _MM_HINT_T0);
  }
}

// V panels (V x 16 weight rows) against R activation rows. With V = 2 each
// activation broadcast feeds two dpbusd, and the float tail of each block (a
// convert, a scale product and an FMA per 8 dpbusd) is nearly the only
// other vector work, which pays for the spills of the 32 accumulators. Every
// output keeps its own chain, so the results do not depend on V. kBf16: the
// panel's scales are bf16 (mxfp4, layout_panels.h), else f16.
template <int R, int V, bool kBf16>
TD_FN void q32_rows(const uint8_t* const* panels, int64_t nblk, const GemmActs& A, int64_t G, int64_t b0,
                    const GemmAcc* acc) {
  const int64_t S = A.slots;
  const int8_t* aq = A.qgroup(G) + b0 * kQK * S;
  const float* as = A.sgroup(G) + b0 * S;
  const int32_t* ae = A.egroup(G) + b0 * S;
  const uint8_t* panel[V];
  __m512 f[V][R];
#pragma GCC unroll 2
  for (int v = 0; v < V; ++v) {
    panel[v] = panels[v];
    load_acc<R>(acc[v], f[v]);
  }
  for (int64_t i = 0; i < nblk; ++i) {
#pragma GCC unroll 2
    for (int v = 0; v < V; ++v) prefetch_block(panel[v], acc[v]);
    // Integer sums are exact in any order: with few rows, C independent
    // chains per row hide dpbusd's latency.
    constexpr int C = V > 1 ? 1 : R == 1 ? 4 : R == 2 ? 2 : 1;
    __m512i t[V][R][C];
#pragma GCC unroll 2
    for (int v = 0; v < V; ++v)
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        t[v][r][0] = _mm512_set1_epi32(ae[r]);
        for (int c = 1; c < C; ++c) t[v][r][c] = _mm512_setzero_si512();
      }
#pragma GCC unroll 8
    for (int g = 0; g < 8; ++g) {
      __m512i w[V];
#pragma GCC unroll 2
      for (int v = 0; v < V; ++v) w[v] = _mm512_loadu_si512(panel[v] + Q32Panel::kQ + 64 * g);
      const int8_t* ag = aq + g * 4 * S;
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        const __m512i a = bcast32(ag + 4 * r);
#pragma GCC unroll 2
        for (int v = 0; v < V; ++v) t[v][r][g % C] = _mm512_dpbusd_epi32(t[v][r][g % C], w[v], a);
      }
    }
#pragma GCC unroll 2
    for (int v = 0; v < V; ++v) {
      const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(panel[v] + Q32Panel::kD));
      const __m512 d = kBf16 ? _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)) : _mm512_cvtph_ps(h);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        __m512i s = t[v][r][0];
        for (int c = 1; c < C; ++c) s = _mm512_add_epi32(s, t[v][r][c]);
        f[v][r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(d, _mm512_set1_ps(as[r])), f[v][r]);
      }
      panel[v] += Q32Panel::kBytes;
    }
    aq += kQK * S;
    as += S;
    ae += S;
  }
#pragma GCC unroll 2
  for (int v = 0; v < V; ++v) store_acc<R>(acc[v], f[v]);
}

// q32_rows for one panel (GemmKernel::run) and for two (run2); mx: mxfp4.
template <int R>
TD_FN void q32_rows1(const uint8_t* panel, int64_t nblk, const GemmActs& A, int64_t G, int64_t b0,
                     const GemmAcc& acc) {
  q32_rows<R, 1, false>(&panel, nblk, A, G, b0, &acc);
}
template <int R>
TD_FN void q32_rows2(const uint8_t* const* panels, int64_t nblk, const GemmActs& A, int64_t G, int64_t b0,
                     const GemmAcc* acc) {
  q32_rows<R, 2, false>(panels, nblk, A, G, b0, acc);
}
template <int R>
TD_FN void mx_rows1(const uint8_t* panel, int64_t nblk, const GemmActs& A, int64_t G, int64_t b0,
                    const GemmAcc& acc) {
  q32_rows<R, 1, true>(&panel, nblk, A, G, b0, &acc);
}
template <int R>
TD_FN void mx_rows2(const uint8_t* const* panels, int64_t nblk, const GemmActs& A, int64_t G, int64_t b0,
                    const GemmAcc* acc) {
  q32_rows<R, 2, true>(panels, nblk, A, G, b0, acc);
}

// The K-quant panels (q4_K / q5_K: kK6 false; q6_K: true): per sub-block j
// the dpbusd sums (q6_K's seeded with its -32 offset's extra), times the
// sub-block's scale, summed in integers; then the float chain of
// product_kernels.h, q4_K / q5_K with its mins term.
template <int R, bool kK6>
TD_FN void kq_rows(const uint8_t* panel, int64_t nblk, const GemmActs& A, int64_t G, int64_t b0, const GemmAcc& acc) {
  using P = std::conditional_t<kK6, K6Panel, K4Panel>;
  constexpr int kSub = kK6 ? 16 : 8, kGroups = 64 / kSub, kExtra = kK6 ? 16 : 4;
  const int64_t S = A.slots;
  const int8_t* aq = A.qgroup(G) + b0 * kQKK * S;
  const float* as = A.sgroup(G) + b0 * S;
  const int32_t* ae = A.egroup(G) + b0 * kExtra * S;
  __m512 f[R];
  load_acc<R>(acc, f);
  for (int64_t i = 0; i < nblk; ++i) {
    __m512i isum[R];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) isum[r] = _mm512_setzero_si512();
    for (int j = 0; j < kSub; ++j) {
      __m512i s[R];
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) s[r] = kK6 ? _mm512_set1_epi32(ae[j * S + r]) : _mm512_setzero_si512();
#pragma GCC unroll 8
      for (int g = 0; g < kGroups; ++g) {
        const __m512i w = _mm512_load_si512(panel + P::kQ + 64 * (kGroups * j + g));
        const int8_t* ag = aq + (kGroups * j + g) * 4 * S;
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) s[r] = _mm512_dpbusd_epi32(s[r], w, bcast32(ag + 4 * r));
      }
      const __m512i sc = _mm512_load_si512(panel + P::kSc + 64 * j);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) isum[r] = _mm512_add_epi32(isum[r], _mm512_mullo_epi32(s[r], sc));
    }
    const __m512 d = _mm512_load_ps(panel + P::kD);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m512 da = _mm512_set1_ps(as[r]);
      f[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[r]), _mm512_mul_ps(d, da), f[r]);
      if constexpr (!kK6) {
        __m512i m = _mm512_setzero_si512();
        for (int e = 0; e < 4; ++e)
          m = _mm512_dpwssd_epi32(m, _mm512_load_si512(panel + K4Panel::kMins + 64 * e), bcast32(ae + e * S + r));
        f[r] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(m), _mm512_mul_ps(_mm512_load_ps(panel + K4Panel::kDmin), da), f[r]);
      }
    }
    panel += P::kBytes;
    aq += kQKK * S;
    as += S;
    ae += kExtra * S;
  }
  store_acc<R>(acc, f);
}
template <int R>
TD_FN void k4_rows(const uint8_t* panel, int64_t nblk, const GemmActs& A, int64_t G, int64_t b0, const GemmAcc& acc) {
  kq_rows<R, false>(panel, nblk, A, G, b0, acc);
}
template <int R>
TD_FN void k6_rows(const uint8_t* panel, int64_t nblk, const GemmActs& A, int64_t G, int64_t b0, const GemmAcc& acc) {
  kq_rows<R, true>(panel, nblk, A, G, b0, acc);
}

// name(panel, ..., R, ..., acc) calls rows_fn<R>: one panel (Panel = const
// uint8_t*, Acc = const GemmAcc&) or two (const uint8_t* const*, const GemmAcc*).
#define TD_DISPATCH_ROWS(name, rows_fn, Panel, Acc)                                                             \
  TD_ATTR void name(Panel panel, int64_t nblk, const GemmActs& A, int64_t G, int R, int64_t b0, Acc acc) {     \
    switch (R) {                                                                                                \
      case 1: return rows_fn<1>(panel, nblk, A, G, b0, acc);                                                    \
      case 2: return rows_fn<2>(panel, nblk, A, G, b0, acc);                                                    \
      case 3: return rows_fn<3>(panel, nblk, A, G, b0, acc);                                                    \
      case 4: return rows_fn<4>(panel, nblk, A, G, b0, acc);                                                    \
      case 5: return rows_fn<5>(panel, nblk, A, G, b0, acc);                                                    \
      case 6: return rows_fn<6>(panel, nblk, A, G, b0, acc);                                                    \
      case 7: return rows_fn<7>(panel, nblk, A, G, b0, acc);                                                    \
      default: return rows_fn<8>(panel, nblk, A, G, b0, acc);                                                   \
    }                                                                                                           \
  }

TD_DISPATCH_ROWS(run_q32, q32_rows1, const uint8_t*, const GemmAcc&)
TD_DISPATCH_ROWS(run2_q32, q32_rows2, const uint8_t* const*, const GemmAcc*)
TD_DISPATCH_ROWS(run_mx, mx_rows1, const uint8_t*, const GemmAcc&)
TD_DISPATCH_ROWS(run2_mx, mx_rows2, const uint8_t* const*, const GemmAcc*)
TD_DISPATCH_ROWS(run_k4, k4_rows, const uint8_t*, const GemmAcc&)
TD_DISPATCH_ROWS(run_k6, k6_rows, const uint8_t*, const GemmAcc&)
#undef TD_DISPATCH_ROWS

}  // namespace

}  // namespace tandem::gemm_detail

namespace tandem::builds {

using namespace gemm_detail;

TypeFns avx512_panels(GgmlType w) {
  switch (gemm_class(w)) {
    case GemmClass::kQ32:
      if (q32_bf16_scales(w)) return {.pack = avx512::pack_q32, .run = run_mx, .run2 = run2_mx};
      return {.pack = avx512::pack_q32, .run = run_q32, .run2 = run2_q32};
    case GemmClass::kK4: return {.pack = avx512::pack_k4, .run = run_k4};
    case GemmClass::kK6: return {.pack = avx512::pack_k6, .run = run_k6};
    case GemmClass::kFloat:
    case GemmClass::kNone: break;
  }
  return {};
}

}  // namespace tandem::builds

#endif

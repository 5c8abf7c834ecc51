// AVX-512 (F/BW/VL) attention kernel: attention_chunk.h over 16-lane
// vectors, masked loads for row tails, F16C-style conversion of f16 K/V.
#include <cstddef>
#include <cstdint>

#include "kernels/attention_impl.h"
#include "kernels/exp_simd.h"

#if defined(__x86_64__)

// GCC 12's AVX-512 intrinsics build some results from a deliberately
// uninitialized vector; -Wuninitialized reports it once inlined here.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <immintrin.h>

namespace tandem::attn_detail {
namespace avx512 {

#define TD_FN __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl"))) inline

struct Ops {
  using V = __m512;
  static constexpr int W = 16, QR = 4, QK = 4, PR = 4, PD = 4;
  TD_FN static __mmask16 lanes_below(int32_t n) { return static_cast<__mmask16>((1u << n) - 1); }
  TD_FN static V zero() { return _mm512_setzero_ps(); }
  TD_FN static V bcast(float f) { return _mm512_set1_ps(f); }
  TD_FN static V load(const float* p) { return _mm512_loadu_ps(p); }
  TD_FN static V load(const uint16_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  TD_FN static V load_part(const float* p, int32_t n) { return _mm512_maskz_loadu_ps(lanes_below(n), p); }
  TD_FN static V load_part(const uint16_t* p, int32_t n) {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(lanes_below(n), p));
  }
  TD_FN static void store(float* p, V v) { _mm512_storeu_ps(p, v); }
  TD_FN static void store_part(float* p, V v, int32_t n) { _mm512_mask_storeu_ps(p, lanes_below(n), v); }
  TD_FN static V add(V a, V b) { return _mm512_add_ps(a, b); }
  TD_FN static V sub(V a, V b) { return _mm512_sub_ps(a, b); }
  TD_FN static V fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  TD_FN static float reduce(V v) { return _mm512_reduce_add_ps(v); }
  // reduce() adds lanes j + j+8, then j + j+4, then j + j+2, then 0 + 1 (any
  // operand order: float addition commutes exactly). Done for 16 vectors
  // side by side, each step halves their number with the same pairs, and the
  // last vector holds every sum; fed acc[r][j] as A[4j + r], 128-bit lane r
  // ends up with row r's four scores in key order.
  static constexpr bool kReduce4x4 = true;
  TD_FN static void reduce_4x4(const V acc[4][4], float* const* s, int32_t kn) {
    V a[16];
    for (int j = 0; j < 4; ++j)
      for (int r = 0; r < 4; ++r) a[4 * j + r] = acc[r][j];
    V t[8], u[4], v[2];
    for (int k = 0; k < 8; ++k)  // lanes j + j+8: [A_2k | A_2k+1]
      t[k] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * k], a[2 * k + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                           _mm512_shuffle_f32x4(a[2 * k], a[2 * k + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    for (int m = 0; m < 4; ++m)  // j + j+4: 128-bit lane L holds A_4m+L
      u[m] = _mm512_add_ps(_mm512_shuffle_f32x4(t[2 * m], t[2 * m + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                           _mm512_shuffle_f32x4(t[2 * m], t[2 * m + 1], _MM_SHUFFLE(3, 1, 3, 1)));
    for (int i = 0; i < 2; ++i)  // j + j+2, within each 128-bit lane
      v[i] = _mm512_add_ps(_mm512_shuffle_ps(u[2 * i], u[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                           _mm512_shuffle_ps(u[2 * i], u[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    // 0 + 1: lane L = [A_L, A_4+L, A_8+L, A_12+L] = row L, keys 0..3.
    const V w = _mm512_add_ps(_mm512_shuffle_ps(v[0], v[1], _MM_SHUFFLE(2, 0, 2, 0)),
                              _mm512_shuffle_ps(v[0], v[1], _MM_SHUFFLE(3, 1, 3, 1)));
    alignas(64) float out[16];
    _mm512_store_ps(out, w);
    for (int r = 0; r < 4; ++r)
      for (int j = 0; j < 4 && j < kn; ++j) s[r][j] = out[4 * r + j];
  }
  // maxps returns its second operand unless the first is greater (NaN: never).
  TD_FN static V max(V x, V m) { return _mm512_max_ps(x, m); }
  TD_FN static float reduce_max(V v) { return _mm512_reduce_max_ps(v); }
  TD_FN static V exp(V x) { return simd::exp_ps(x); }  // kernels/exp_simd.h
};

#include "kernels/attention_chunk.h"
#undef TD_FN

}  // namespace avx512

ChunkFn avx512_chunk_fn() { return &avx512::chunk_kernel; }

}  // namespace tandem::attn_detail

#else

namespace tandem::attn_detail {
ChunkFn avx512_chunk_fn() { return nullptr; }
}  // namespace tandem::attn_detail

#endif

// AVX-512 activation preparation for the tiled kernels: the q8_0 / q8_K
// quantizers and the f16 / bf16 rounding of gemm_prepare_acts, vectorized but
// bit-identical to the scalar ones (same amax, same per-block scalar scale
// arithmetic, the same rounding rules, NaN and inf included).
#include "kernels/simd_avx512.h"

#if defined(__x86_64__)

#include <algorithm>
#include <vector>

#include "quant/quant.h"
#include "kernels/kernel_builds.h"
#include "kernels/product_kernels.h"
#include "kernels/simd_transpose.h"

namespace tandem::gemm_detail {
namespace {

TD_FN __m512 abs_ps(__m512 v) { return _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(v), _mm512_set1_epi32(0x7fffffff))); }

// max over |x| ignoring NaN, folded into m (max_ps returns its second operand
// when the first is NaN, as fmax skips NaN).
TD_FN __m512 fold_amax(__m512 x, __m512 m) { return _mm512_max_ps(abs_ps(x), m); }

// round(v) half away from zero as std::round, NaN -> 0, clamped to +-127,
// as 16 int8 (product_acts.cpp's to_q8).
TD_FN __m128i to_q8(__m512 v) {
  const __m512 t = _mm512_roundscale_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
  const __m512 frac = _mm512_sub_ps(v, t);  // exact
  const __mmask16 up = _mm512_cmp_ps_mask(abs_ps(frac), _mm512_set1_ps(0.5f), _CMP_GE_OQ);
  const __m512 one = _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(_mm512_set1_ps(1.0f)),
                                                         _mm512_and_si512(_mm512_castps_si512(v), _mm512_set1_epi32(INT32_MIN))));
  __m512 r = _mm512_mask_add_ps(t, up, t, one);
  r = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(v, v, _CMP_ORD_Q), r);
  r = _mm512_min_ps(_mm512_max_ps(r, _mm512_set1_ps(-127.0f)), _mm512_set1_ps(127.0f));
  return _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(r));
}

TD_FN void q8_0_row(const float* x, int64_t nb, int32_t offset, int8_t* q, float* scale, int32_t* extra) {
  for (int64_t b = 0; b < nb; ++b, x += kQK, q += kQK) {
    const __m512 x0 = _mm512_loadu_ps(x), x1 = _mm512_loadu_ps(x + 16);
    const float amax = _mm512_reduce_max_ps(fold_amax(x1, fold_amax(x0, _mm512_setzero_ps())));
    const float d = amax / 127;
    const float id = d != 0 ? 1.0f / d : 0.0f;
    // F16C rounds to nearest even with overflow to inf, as f32_to_f16; d is
    // never NaN (amax skips NaN).
    scale[b] = _cvtsh_ss(_cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT));
    const __m512 vid = _mm512_set1_ps(id);
    const __m128i q0 = to_q8(_mm512_mul_ps(x0, vid)), q1 = to_q8(_mm512_mul_ps(x1, vid));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q), q0);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + 16), q1);
    const int32_t sum = _mm512_reduce_add_epi32(_mm512_add_epi32(_mm512_cvtepi8_epi32(q0), _mm512_cvtepi8_epi32(q1)));
    extra[b] = -offset * sum;
  }
}

TD_FN void q8_k_row(const float* x, int64_t nb, bool k4, int8_t* q, float* scale, int32_t* extra) {
  const int64_t epb = k4 ? 4 : 16;
  for (int64_t b = 0; b < nb; ++b, x += kQKK, q += kQKK, extra += epb) {
    __m512 m = _mm512_setzero_ps();
    for (int i = 0; i < 16; ++i) m = fold_amax(_mm512_loadu_ps(x + 16 * i), m);
    const float amax = _mm512_reduce_max_ps(m);
    int32_t bsums[16] = {};
    if (amax == 0) {
      scale[b] = 0;
      std::memset(q, 0, kQKK);
    } else {
      // The signed value at the first position of largest magnitude.
      float max = 0;
      for (int i = 0; i < 16; ++i) {
        const __mmask16 hit = _mm512_cmp_ps_mask(abs_ps(_mm512_loadu_ps(x + 16 * i)), _mm512_set1_ps(amax), _CMP_EQ_OQ);
        if (hit) {
          max = x[16 * i + __builtin_ctz(hit)];
          break;
        }
      }
      const float iscale = -127.f / max;
      const __m512 vs = _mm512_set1_ps(iscale);
      for (int i = 0; i < 16; ++i) {
        // Round to nearest even (the default mode) as nearest_int; NaN
        // converts to INT32_MIN, whose low byte 0 is nearest_int's answer too.
        const __m512i v = _mm512_min_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + 16 * i), vs)),
                                           _mm512_set1_epi32(127));
        const __m128i q16 = _mm512_cvtepi32_epi8(v);
        _mm_storeu_si128(reinterpret_cast<__m128i*>(q + 16 * i), q16);
        bsums[i] = _mm512_reduce_add_epi32(_mm512_cvtepi8_epi32(q16));
      }
      scale[b] = 1 / iscale;
    }
    k_extras(k4 ? GemmClass::kK4 : GemmClass::kK6, bsums, extra);
  }
}

// x rounded to f16 or bf16 and widened back, as f16_to_f32(f32_to_f16(x)) /
// bf16_to_f32(f32_to_bf16(x)), NaN payloads included.
TD_FN __m512 round_f16(__m512 x) {
  const __m512 r = _mm512_cvtph_ps(_mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  const __m512i nan = _mm512_or_si512(_mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32(INT32_MIN)),
                                      _mm512_set1_epi32(0x7FC00000));
  return _mm512_mask_mov_ps(r, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), _mm512_castsi512_ps(nan));
}

TD_FN __m512 round_bf16(__m512 x) {
  const __m512i bits = _mm512_castps_si512(x);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  const __m512i rne = _mm512_add_epi32(_mm512_add_epi32(bits, _mm512_set1_epi32(0x7fff)), lsb);
  const __m512i nan = _mm512_or_si512(bits, _mm512_set1_epi32(0x400000));
  const __m512i r = _mm512_mask_mov_epi32(rne, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), nan);
  return _mm512_castsi512_ps(_mm512_and_si512(r, _mm512_set1_epi32(static_cast<int32_t>(0xFFFF0000u))));
}

TD_FN void float_row(const float* x, int64_t n, GgmlType w, float* out) {
  int64_t i = 0;
  for (; i < n; i += 16) {
    const __mmask16 m = n - i >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << (n - i)) - 1);
    __m512 v = _mm512_maskz_loadu_ps(m, x + i);
    if (w == GgmlType::F16) v = round_f16(v);
    if (w == GgmlType::BF16) v = round_bf16(v);
    _mm512_mask_storeu_ps(out + i, m, v);
  }
}

// 8 rows of `units` 4-byte units (row s at src + s * stride) interleaved as
// [unit][row][4 bytes] at dst; 8 units at a time by an 8x8 dword transpose.
TD_FN void interleave8(const uint8_t* src, int64_t stride, int64_t units, uint8_t* dst) {
  int64_t u = 0;
  for (; u + 8 <= units; u += 8) {
    __m256i r[8];
    for (int s = 0; s < 8; ++s) r[s] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + s * stride + u * 4));
    simd::transpose_8x8_epi32(r);  // r[k]: unit u + k of the 8 rows
    for (int k = 0; k < 8; ++k) _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + (u + k) * 32), r[k]);
  }
  for (; u < units; ++u)
    for (int s = 0; s < 8; ++s) std::memcpy(dst + (u * 8 + s) * 4, src + s * stride + u * 4, 4);
}

// Per-thread buffers for one group's rows in plain order, so preparing a
// decode step's activations allocates nothing.
struct GroupBuffers {
  std::vector<uint8_t> q;  // [slot][row bytes]
  std::vector<float> scale;
  std::vector<int32_t> extra;
};

}  // namespace

TD_ATTR void prepare_acts(const float* x, int64_t ldx, int64_t g0, int64_t g1, GemmActs& A) {
  thread_local GroupBuffers buf;
  const GemmClass cls = gemm_class(A.wtype);
  const int64_t S = A.slots, epb = A.extra_per_block;
  const int64_t row_bytes = cls == GemmClass::kFloat ? A.cols * 4 : A.cols;
  if (buf.q.size() < static_cast<size_t>(S * row_bytes)) buf.q.resize(S * row_bytes);
  if (buf.scale.size() < static_cast<size_t>(S * A.nb)) buf.scale.resize(S * A.nb);
  if (buf.extra.size() < static_cast<size_t>(S * A.nb * epb)) buf.extra.resize(S * A.nb * epb);
  auto convert = [&](const float* xr, uint8_t* q, float* scale, int32_t* extra) {
    if (cls == GemmClass::kFloat)
      float_row(xr, A.cols, A.wtype, reinterpret_cast<float*>(q));
    else if (cls == GemmClass::kQ32)
      q8_0_row(xr, A.nb, q32_offset(A.wtype), reinterpret_cast<int8_t*>(q), scale, extra);
    else
      q8_k_row(xr, A.nb, cls == GemmClass::kK4, reinterpret_cast<int8_t*>(q), scale, extra);
  };
  for (int64_t G = g0; G < g1; ++G) {
    if (S == 1) {
      // One row per group is the plain layout: convert in place.
      convert(x + G * ldx, A.q.data() + G * A.group_q_bytes, A.scale.data() + G * A.nb,
              A.extra.data() + G * A.nb * epb);
      continue;
    }
    const int64_t n = std::min(S, A.rows - G * S);
    for (int64_t s = 0; s < n; ++s)
      convert(x + (G * S + s) * ldx, buf.q.data() + s * row_bytes, buf.scale.data() + s * A.nb,
              buf.extra.data() + s * A.nb * epb);
    if (S < 8) {
      // Fewer than 8 rows in the whole batch: plain stores are cheap enough.
      for (int64_t s = 0; s < n; ++s)
        scatter_row(buf.q.data() + s * row_bytes, buf.scale.data() + s * A.nb, buf.extra.data() + s * A.nb * epb,
                    G * S + s, A);
      continue;
    }
    // A partial last group interleaves stale rows into slots no kernel reads.
    interleave8(buf.q.data(), row_bytes, row_bytes / 4, A.q.data() + G * A.group_q_bytes);
    if (cls == GemmClass::kFloat) continue;
    float* ds = A.scale.data() + G * A.nb * 8;
    int32_t* de = A.extra.data() + G * A.nb * epb * 8;
    for (int64_t s = 0; s < n; ++s) {
      for (int64_t b = 0; b < A.nb; ++b) ds[b * 8 + s] = buf.scale[s * A.nb + b];
      for (int64_t i = 0; i < A.nb * epb; ++i) de[i * 8 + s] = buf.extra[s * A.nb * epb + i];
    }
  }
}

}  // namespace tandem::gemm_detail

namespace tandem::builds {

TypeFns avx512_acts(GgmlType w) {
  if (gemm_class(w) == GemmClass::kNone) return {};
  return {.prepare = gemm_detail::prepare_acts};
}

}  // namespace tandem::builds

#endif

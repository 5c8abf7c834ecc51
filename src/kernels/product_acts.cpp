// The activations' quantizer, in one place: ggml's reference q8_0 / q8_1 /
// q8_K for one block (quantize_row_q8_*), which quantize_activations (vec_dot's
// rows) and gemm_prepare_acts (the product kernels' interleaved groups) both
// call, so the two see the same quants bit for bit.
// product_acts_avx512.cpp vectorizes the same arithmetic.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "quant/quant.h"
#include "quant/quant_blocks.h"
#include "kernels/kernel_builds.h"
#include "kernels/product_kernels.h"
#include "kernels/vec_dot.h"

namespace tandem {
namespace {

// Round half to even via the 1.5*2^23 trick, as ggml's nearest_int, so q8_K
// levels match llama.cpp's bit for bit (valid for |f| < 2^22).
int nearest_int(float f) {
  const float v = f + 12582912.f;
  int32_t i;
  std::memcpy(&i, &v, sizeof(i));
  return (i & 0x007fffff) - 0x00400000;
}

// x * (1/d) rounded half away from zero, as ggml's roundf. For finite input
// it is already within +-127; the clamp only keeps NaN/inf activations (a
// diverged model) from becoming an undefined float-to-int conversion.
int8_t to_q8(float scaled) {
  const float r = std::round(scaled);
  if (std::isnan(r)) return 0;
  return static_cast<int8_t>(std::clamp(r, -127.0f, 127.0f));
}

// One q8_0 block: q = x / d rounded; returns d = amax / 127 (stored as f16).
float q8_0_block(const float* x, int8_t* q) {
  float amax = 0;
  for (int j = 0; j < kQK; ++j) amax = std::fmax(amax, std::fabs(x[j]));
  const float d = amax / 127;
  const float id = d != 0 ? 1.0f / d : 0.0f;
  for (int j = 0; j < kQK; ++j) q[j] = to_q8(x[j] * id);
  return d;
}

// One q8_K super-block: the signed value of largest magnitude maps to -127
// exactly, so every other value lands in [-127, 127] (the clamp guards float
// rounding); bsums are the sums of the 16 groups of 16 quants. Returns d (0
// for an all-zero block).
float q8_k_block(const float* x, int8_t* q, int32_t bsums[16]) {
  float max = 0, amax = 0;
  for (int j = 0; j < kQKK; ++j) {
    const float ax = std::fabs(x[j]);
    if (ax > amax) {
      amax = ax;
      max = x[j];
    }
  }
  if (amax == 0) {
    std::memset(q, 0, kQKK);
    std::fill_n(bsums, 16, 0);
    return 0;
  }
  const float iscale = -127.f / max;
  for (int j = 0; j < kQKK; ++j) {
    const int v = nearest_int(iscale * x[j]);
    q[j] = static_cast<int8_t>(v < 127 ? v : 127);
  }
  for (int g = 0; g < 16; ++g) {
    int sum = 0;
    for (int l = 0; l < 16; ++l) sum += q[g * 16 + l];
    bsums[g] = sum;
  }
  return 1 / iscale;
}

void quantize_q8_0(const float* x, BlockQ8_0* y, int64_t nb) {
  for (int64_t b = 0; b < nb; ++b, x += kQK) y[b].d = f32_to_f16(q8_0_block(x, y[b].qs));
}

void quantize_q8_1(const float* x, BlockQ8_1* y, int64_t nb) {
  for (int64_t b = 0; b < nb; ++b, x += kQK) {
    const float d = q8_0_block(x, y[b].qs);
    y[b].d = f32_to_f16(d);
    int sum = 0;
    for (int j = 0; j < kQK; ++j) sum += y[b].qs[j];
    // ggml scales the sum by the unrounded float d, not by the stored f16 one.
    y[b].s = f32_to_f16(static_cast<float>(sum) * d);
  }
}

void quantize_q8_k(const float* x, BlockQ8K* y, int64_t nb) {
  for (int64_t b = 0; b < nb; ++b, x += kQKK) {
    int32_t bsums[16];
    y[b].d = q8_k_block(x, y[b].qs, bsums);
    for (int g = 0; g < 16; ++g) y[b].bsums[g] = static_cast<int16_t>(bsums[g]);
  }
}

// One row's quants, scales and extras in plain order (scattered into the
// interleaved layout by the caller).
void prepare_q8_0_row(const float* x, int64_t nb, int32_t offset, int8_t* q, float* scale, int32_t* extra) {
  for (int64_t b = 0; b < nb; ++b, x += kQK, q += kQK) {
    scale[b] = f16_to_f32(f32_to_f16(q8_0_block(x, q)));
    int32_t sum = 0;
    for (int j = 0; j < kQK; ++j) sum += q[j];
    extra[b] = -offset * sum;
  }
}

void prepare_q8_k_row(const float* x, int64_t nb, GemmClass cls, int8_t* q, float* scale, int32_t* extra) {
  const int64_t epb = cls == GemmClass::kK4 ? 4 : 16;
  for (int64_t b = 0; b < nb; ++b, x += kQKK, q += kQKK, extra += epb) {
    int32_t bsums[16];
    scale[b] = q8_k_block(x, q, bsums);
    gemm_detail::k_extras(cls, bsums, extra);
  }
}

}  // namespace

void quantize_activations(GgmlType act_type, const float* x, void* dst, int64_t n) {
  // row_bytes validates n against the block size (and rejects unknown types).
  (void)row_bytes(act_type, n);
  switch (act_type) {
    case GgmlType::F32:
      std::memcpy(dst, x, static_cast<size_t>(n) * sizeof(float));
      return;
    case GgmlType::F16: {
      auto* y = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) y[i] = f32_to_f16(x[i]);
      return;
    }
    case GgmlType::BF16: {
      auto* y = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) y[i] = f32_to_bf16(x[i]);
      return;
    }
    case GgmlType::Q8_0: quantize_q8_0(x, static_cast<BlockQ8_0*>(dst), n / kQK); return;
    case GgmlType::Q8_1: quantize_q8_1(x, static_cast<BlockQ8_1*>(dst), n / kQK); return;
    case GgmlType::Q8_K: quantize_q8_k(x, static_cast<BlockQ8K*>(dst), n / kQKK); return;
    default:
      fail(ErrorKind::kUnsupported, "{} is not an activation type", type_traits(act_type).name);
  }
}

void gemm_acts_shape(GgmlType w, int64_t rows, int64_t cols, int64_t max_slots, GemmActs& a) {
  const GemmClass cls = gemm_class(w);
  if (cls == GemmClass::kNone)
    fail(ErrorKind::kUnsupported, "no tiled kernel for weight type {}", type_traits(w).name);
  const int64_t be = cls == GemmClass::kQ32 ? kQK : cls == GemmClass::kFloat ? 1 : kQKK;
  if (cols % be != 0)
    fail(ErrorKind::kInvalidArgument, "row of {} elements is not a whole number of {} blocks", cols,
         type_traits(w).name);
  a.wtype = w;
  a.rows = rows;
  a.cols = cols;
  a.slots = std::clamp<int64_t>(std::min(rows, max_slots), 1, kGemmMaxRows);
  a.groups = (rows + a.slots - 1) / a.slots;
  a.block_elems = be;
  a.nb = cols / be;
  a.extra_per_block = cls == GemmClass::kQ32 ? 1 : cls == GemmClass::kK4 ? 4 : cls == GemmClass::kK6 ? 16 : 0;
  a.group_q_bytes = cols * a.slots * (cls == GemmClass::kFloat ? 4 : 1);
  const size_t nq = static_cast<size_t>(a.groups * a.group_q_bytes);
  if (a.q.size() < nq) a.q.resize(nq);
  if (cls != GemmClass::kFloat) {
    const size_t ns = static_cast<size_t>(a.groups * a.slots * a.nb);
    if (a.scale.size() < ns) a.scale.resize(ns);
    if (a.extra.size() < ns * a.extra_per_block) a.extra.resize(ns * a.extra_per_block);
  }
}

namespace gemm_detail {

void k_extras(GemmClass cls, const int32_t bsums[16], int32_t* extra) {
  if (cls == GemmClass::kK4) {
    for (int e = 0; e < 4; ++e) {
      const int32_t lo = bsums[4 * e] + bsums[4 * e + 1], hi = bsums[4 * e + 2] + bsums[4 * e + 3];
      extra[e] = static_cast<int32_t>(static_cast<uint32_t>(static_cast<uint16_t>(lo)) |
                                      (static_cast<uint32_t>(static_cast<uint16_t>(hi)) << 16));
    }
  } else {
    for (int g = 0; g < 16; ++g) extra[g] = -32 * bsums[g];
  }
}

void scatter_row(const void* q, const float* scale, const int32_t* extra, int64_t r, GemmActs& A) {
  const int64_t S = A.slots, G = r / S, s = r % S;
  const auto* src = static_cast<const uint8_t*>(q);
  uint8_t* dq = A.q.data() + G * A.group_q_bytes + s * 4;
  // 4-byte units: four int8 quants, or one float.
  const int64_t units = gemm_class(A.wtype) == GemmClass::kFloat ? A.cols : A.cols / 4;
  for (int64_t u = 0; u < units; ++u) std::memcpy(dq + u * S * 4, src + u * 4, 4);
  if (gemm_class(A.wtype) == GemmClass::kFloat) return;
  float* ds = A.scale.data() + G * A.nb * S + s;
  int32_t* de = A.extra.data() + G * A.nb * A.extra_per_block * S + s;
  for (int64_t b = 0; b < A.nb; ++b) ds[b * S] = scale[b];
  for (int64_t i = 0; i < A.nb * A.extra_per_block; ++i) de[i * S] = extra[i];
}

void ref_prepare_acts(const float* x, int64_t ldx, int64_t g0, int64_t g1, GemmActs& A) {
  const GemmClass cls = gemm_class(A.wtype);
  std::vector<int8_t> q(static_cast<size_t>(A.cols));
  std::vector<float> f(cls == GemmClass::kFloat ? static_cast<size_t>(A.cols) : 0);
  std::vector<float> scale(static_cast<size_t>(A.nb));
  std::vector<int32_t> extra(static_cast<size_t>(A.nb * A.extra_per_block));
  const int64_t r1 = std::min(A.rows, g1 * A.slots);
  for (int64_t r = g0 * A.slots; r < r1; ++r) {
    const float* xr = x + r * ldx;
    switch (cls) {
      case GemmClass::kQ32: prepare_q8_0_row(xr, A.nb, q32_offset(A.wtype), q.data(), scale.data(), extra.data()); break;
      case GemmClass::kK4:
      case GemmClass::kK6: prepare_q8_k_row(xr, A.nb, cls, q.data(), scale.data(), extra.data()); break;
      case GemmClass::kFloat:
        for (int64_t i = 0; i < A.cols; ++i) {
          float v = xr[i];
          if (A.wtype == GgmlType::F16) v = f16_to_f32(f32_to_f16(v));
          if (A.wtype == GgmlType::BF16) v = bf16_to_f32(f32_to_bf16(v));
          f[i] = v;
        }
        scatter_row(f.data(), nullptr, nullptr, r, A);
        continue;
      case GemmClass::kNone: continue;
    }
    scatter_row(q.data(), scale.data(), extra.data(), r, A);
  }
}

}  // namespace gemm_detail

namespace builds {

TypeFns scalar_acts(GgmlType w) {
  if (gemm_class(w) == GemmClass::kNone) return {};
  return {.prepare = gemm_detail::ref_prepare_acts};
}

}  // namespace builds

}  // namespace tandem

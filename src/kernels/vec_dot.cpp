// Activation quantizers (ggml's reference quantize_row_q8_*), the weight ->
// activation type map, and the choice of vec_dot kernel per level.
#include "kernels/vec_dot.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/quant_blocks.h"
#include "core/cpu_features.h"
#include "core/error.h"
#include "core/quant.h"
#include "kernels/vec_dot_impl.h"

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

float block_amax(const float* x, int n) {
  float amax = 0;
  for (int j = 0; j < n; ++j) amax = std::fmax(amax, std::fabs(x[j]));
  return amax;
}

// x * (1/d) rounded half away from zero, as ggml's roundf. For finite input
// it is already within +-127; the clamp only keeps NaN/inf activations (a
// diverged model) from becoming an undefined float-to-int conversion.
int8_t to_q8(float scaled) {
  const float r = std::round(scaled);
  if (std::isnan(r)) return 0;
  return static_cast<int8_t>(std::clamp(r, -127.0f, 127.0f));
}

void quantize_q8_0(const float* x, BlockQ8_0* y, int64_t nb) {
  for (int64_t b = 0; b < nb; ++b, x += kQK) {
    const float d = block_amax(x, kQK) / 127;
    const float id = d != 0 ? 1.0f / d : 0.0f;
    y[b].d = f32_to_f16(d);
    for (int j = 0; j < kQK; ++j) y[b].qs[j] = to_q8(x[j] * id);
  }
}

void quantize_q8_1(const float* x, BlockQ8_1* y, int64_t nb) {
  for (int64_t b = 0; b < nb; ++b, x += kQK) {
    const float d = block_amax(x, kQK) / 127;
    const float id = d != 0 ? 1.0f / d : 0.0f;
    y[b].d = f32_to_f16(d);
    int sum = 0;
    for (int j = 0; j < kQK; ++j) {
      y[b].qs[j] = to_q8(x[j] * id);
      sum += y[b].qs[j];
    }
    // ggml scales the sum by the unrounded float d, not by the stored f16 one.
    y[b].s = f32_to_f16(static_cast<float>(sum) * d);
  }
}

void quantize_q8_k(const float* x, BlockQ8K* y, int64_t nb) {
  for (int64_t b = 0; b < nb; ++b, x += kQKK) {
    // The signed value of largest magnitude maps to -127 exactly, so every
    // other value lands in [-127, 127] (the clamp guards float rounding).
    float max = 0, amax = 0;
    for (int j = 0; j < kQKK; ++j) {
      const float ax = std::fabs(x[j]);
      if (ax > amax) {
        amax = ax;
        max = x[j];
      }
    }
    if (amax == 0) {
      y[b].d = 0;
      std::memset(y[b].qs, 0, sizeof(y[b].qs));
      std::memset(y[b].bsums, 0, sizeof(y[b].bsums));
      continue;
    }
    const float iscale = -127.f / max;
    for (int j = 0; j < kQKK; ++j) {
      const int v = nearest_int(iscale * x[j]);
      y[b].qs[j] = static_cast<int8_t>(v < 127 ? v : 127);
    }
    for (int g = 0; g < kQKK / 16; ++g) {
      int sum = 0;
      for (int l = 0; l < 16; ++l) sum += y[b].qs[g * 16 + l];
      y[b].bsums[g] = static_cast<int16_t>(sum);
    }
    y[b].d = 1 / iscale;
  }
}

}  // namespace

GgmlType vec_dot_type(GgmlType w) {
  switch (w) {
    case GgmlType::F32: return GgmlType::F32;
    case GgmlType::F16: return GgmlType::F16;
    case GgmlType::BF16: return GgmlType::BF16;
    case GgmlType::Q4_0:
    case GgmlType::Q5_0:
    case GgmlType::Q8_0: return GgmlType::Q8_0;
    case GgmlType::Q4_1:
    case GgmlType::Q5_1: return GgmlType::Q8_1;
    case GgmlType::Q2_K:
    case GgmlType::Q3_K:
    case GgmlType::Q4_K:
    case GgmlType::Q5_K:
    case GgmlType::Q6_K: return GgmlType::Q8_K;
    default:
      fail(ErrorKind::kUnsupported, "no dot product for weight type id {}", static_cast<uint32_t>(w));
  }
}

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

VecDotFn vec_dot_fn_for_level(GgmlType w, KernelLevel level) {
  const VecDotFn ref = dot_detail::ref_fn(w);
  if (ref == nullptr)
    fail(ErrorKind::kUnsupported, "no dot product for weight type id {}", static_cast<uint32_t>(w));
  if (!cpu_supports_level(level))
    fail(ErrorKind::kInvalidArgument, "kernel level {} is not supported by this CPU", kernel_level_name(level));
  const CpuFeatures& f = cpu_features();
  VecDotFn fn = nullptr;
  if (level >= KernelLevel::kAvx512)
    fn = dot_detail::avx512_fn(w, level >= KernelLevel::kAvx512Vnni,
                               level >= KernelLevel::kAvx512Vnni && f.avx512bf16);
  if (fn == nullptr && level >= KernelLevel::kAvx2)
    fn = dot_detail::avx2_fn(w, cpu_supports_level(KernelLevel::kAvx2Vnni) && level != KernelLevel::kAvx2 &&
                                    level != KernelLevel::kAvx512);
  return fn != nullptr ? fn : ref;
}

VecDotFn vec_dot_fn(GgmlType w_type) { return vec_dot_fn_for_level(w_type, active_kernel_level()); }

VecDotFn vec_dot_ref_fn(GgmlType w_type) {
  const VecDotFn ref = dot_detail::ref_fn(w_type);
  if (ref == nullptr)
    fail(ErrorKind::kUnsupported, "no dot product for weight type id {}", static_cast<uint32_t>(w_type));
  return ref;
}

}  // namespace tandem

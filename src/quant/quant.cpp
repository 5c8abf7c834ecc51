// Float formats, the 32-element block formats, and the type dispatch. The
// layouts and the quantizers' arithmetic follow ggml (ggml-common.h block
// structs, ggml-quants.c reference routines): every float operation is done
// in the same order and precision so our bytes match llama.cpp's. This file
// must be compiled without FP contraction (no -ffast-math); ISO C++ mode
// (CMAKE_CXX_EXTENSIONS OFF) already makes GCC default to -ffp-contract=off.
#include "quant/quant.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "quant/quant_blocks.h"
#include "quant/quant_internal.h"

namespace tandem {

using quant_detail::load_f16;
using quant_detail::load_u32;
using quant_detail::store_f16;
using quant_detail::store_u32;

float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  const uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ff;
  uint32_t bits;
  if (exp == 0x1f) {
    // inf, or NaN keeping its payload; a signalling NaN comes out quiet, as
    // from a hardware conversion (and ggml's C path).
    bits = sign | 0x7f800000u | (mant << 13) | (mant != 0 ? 0x400000u : 0u);
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (mant << 13);  // rebias 15 -> 127
  } else if (mant == 0) {
    bits = sign;
  } else {
    // Subnormal half = mant * 2^-24; normalize so the leading 1 is implicit.
    int e = 113;  // f32 biased exponent of 2^-14
    while ((mant & 0x400) == 0) {
      mant <<= 1;
      --e;
    }
    bits = sign | (static_cast<uint32_t>(e) << 23) | ((mant & 0x3ff) << 13);
  }
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

uint16_t f32_to_f16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000);
  const uint32_t abs = bits & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00);  // NaN -> quiet NaN, as ggml's C path
  // 65520 is halfway between 65504 (odd mantissa) and 2^16, so it and
  // everything above rounds to infinity.
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00);
  if (abs >= 0x38800000u) {  // normal half (>= 2^-14)
    uint32_t h = ((abs >> 23) - 112) << 10 | ((abs >> 13) & 0x3ff);
    const uint32_t rem = abs & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) ++h;  // a carry may bump the exponent: still right
    return static_cast<uint16_t>(sign | h);
  }
  // Subnormal half: count units of 2^-24. A float with biased exponent e and
  // 24-bit significand m is m * 2^(e-150) = m * 2^(e-126) units.
  const uint32_t e = abs >> 23;
  if (e < 102) return sign;  // < 2^-25: rounds to zero (2^-25 itself ties to even 0)
  const uint32_t m = (abs & 0x7fffff) | 0x800000;
  const uint32_t shift = 126 - e;  // 14..24
  uint32_t q = m >> shift;
  const uint32_t rem = m & ((1u << shift) - 1);
  const uint32_t half = 1u << (shift - 1);
  if (rem > half || (rem == half && (q & 1))) ++q;  // may reach 0x400, the smallest normal
  return static_cast<uint16_t>(sign | q);
}

float bf16_to_f32(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

uint16_t f32_to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  if ((bits & 0x7fffffffu) > 0x7f800000u)  // NaN: truncate, but set the quiet bit so it stays NaN
    return static_cast<uint16_t>((bits >> 16) | 0x40);
  // Round to nearest even; overflow carries into the exponent and yields inf.
  return static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1)) >> 16);
}

namespace {

// C's float -> int8_t conversion (truncation) for the in-range values the
// quantizers produce; non-finite input (which would be undefined behaviour in
// a plain cast) saturates instead.
int8_t trunc_i8(float v) {
  if (v >= 127.f) return 127;
  if (v > -128.f) return static_cast<int8_t>(static_cast<int>(v));
  return -128;  // also NaN
}

// ---- Q4_0: d (f16), qs[16]; element j in the low nibble of qs[j], j+16 in the high.
void dequant_q4_0(const uint8_t* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, b += 18, y += kQK) {
    const float d = load_f16(b);
    for (int j = 0; j < kQK / 2; ++j) {
      y[j] = static_cast<float>((b[2 + j] & 0x0f) - 8) * d;
      y[j + kQK / 2] = static_cast<float>((b[2 + j] >> 4) - 8) * d;
    }
  }
}

// Signed absmax scale: the element of largest magnitude maps exactly to -8
// (first one wins on ties), so its sign sets the sign of d.
void quant_q4_0(const float* x, uint8_t* b, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQK, b += 18) {
    float amax = 0.f, max = 0.f;
    for (int j = 0; j < kQK; ++j) {
      if (amax < std::fabs(x[j])) {
        amax = std::fabs(x[j]);
        max = x[j];
      }
    }
    const float d = max / -8;
    const float id = d != 0.f ? 1.0f / d : 0.0f;
    store_f16(b, d);
    for (int j = 0; j < kQK / 2; ++j) {
      const int lo = std::min<int>(15, trunc_i8(x[j] * id + 8.5f));
      const int hi = std::min<int>(15, trunc_i8(x[j + kQK / 2] * id + 8.5f));
      b[2 + j] = static_cast<uint8_t>(lo | (hi << 4));
    }
  }
}

// ---- Q4_1: d, m (f16), qs[16]; value = q*d + m.
void dequant_q4_1(const uint8_t* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, b += 20, y += kQK) {
    const float d = load_f16(b), m = load_f16(b + 2);
    for (int j = 0; j < kQK / 2; ++j) {
      y[j] = static_cast<float>(b[4 + j] & 0x0f) * d + m;
      y[j + kQK / 2] = static_cast<float>(b[4 + j] >> 4) * d + m;
    }
  }
}

void min_max(const float* x, float& min, float& max) {
  min = FLT_MAX;
  max = -FLT_MAX;
  for (int j = 0; j < kQK; ++j) {
    if (x[j] < min) min = x[j];
    if (x[j] > max) max = x[j];
  }
}

void quant_q4_1(const float* x, uint8_t* b, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQK, b += 20) {
    float min, max;
    min_max(x, min, max);
    const float d = (max - min) / 15;
    const float id = d != 0.f ? 1.0f / d : 0.0f;
    store_f16(b, d);
    store_f16(b + 2, min);
    for (int j = 0; j < kQK / 2; ++j) {
      const int lo = std::min<int>(15, trunc_i8((x[j] - min) * id + 0.5f));
      const int hi = std::min<int>(15, trunc_i8((x[j + kQK / 2] - min) * id + 0.5f));
      b[4 + j] = static_cast<uint8_t>(lo | (hi << 4));
    }
  }
}

// ---- Q5_0: d, qh (u32: bit j = 5th bit of element j), qs[16] as in Q4_0.
void dequant_q5_0(const uint8_t* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, b += 22, y += kQK) {
    const float d = load_f16(b);
    const uint32_t qh = load_u32(b + 2);
    for (int j = 0; j < kQK / 2; ++j) {
      const int lo = (b[6 + j] & 0x0f) | static_cast<int>(((qh >> j) & 1) << 4);
      const int hi = (b[6 + j] >> 4) | static_cast<int>(((qh >> (j + 16)) & 1) << 4);
      y[j] = static_cast<float>(lo - 16) * d;
      y[j + kQK / 2] = static_cast<float>(hi - 16) * d;
    }
  }
}

void quant_q5_0(const float* x, uint8_t* b, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQK, b += 22) {
    float amax = 0.f, max = 0.f;
    for (int j = 0; j < kQK; ++j) {
      if (amax < std::fabs(x[j])) {
        amax = std::fabs(x[j]);
        max = x[j];
      }
    }
    const float d = max / -16;
    const float id = d != 0.f ? 1.0f / d : 0.0f;
    store_f16(b, d);
    uint32_t qh = 0;
    for (int j = 0; j < kQK / 2; ++j) {
      const int lo = std::min<int>(31, trunc_i8(x[j] * id + 16.5f));
      const int hi = std::min<int>(31, trunc_i8(x[j + kQK / 2] * id + 16.5f));
      b[6 + j] = static_cast<uint8_t>((lo & 0x0f) | ((hi & 0x0f) << 4));
      qh |= static_cast<uint32_t>((lo >> 4) & 1) << j;
      qh |= static_cast<uint32_t>((hi >> 4) & 1) << (j + 16);
    }
    store_u32(b + 2, qh);
  }
}

// ---- Q5_1: d, m, qh, qs[16]; value = q*d + m.
void dequant_q5_1(const uint8_t* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, b += 24, y += kQK) {
    const float d = load_f16(b), m = load_f16(b + 2);
    const uint32_t qh = load_u32(b + 4);
    for (int j = 0; j < kQK / 2; ++j) {
      const int lo = (b[8 + j] & 0x0f) | static_cast<int>(((qh >> j) & 1) << 4);
      const int hi = (b[8 + j] >> 4) | static_cast<int>(((qh >> (j + 16)) & 1) << 4);
      y[j] = static_cast<float>(lo) * d + m;
      y[j + kQK / 2] = static_cast<float>(hi) * d + m;
    }
  }
}

// ggml converts (x + 0.5f) to uint8_t here without the MIN(31, .) clamp the
// other formats use; the value never exceeds 31.5 for finite input.
uint8_t trunc_u8(float v) {
  if (v >= 255.f) return 255;
  if (v > -1.f) return static_cast<uint8_t>(static_cast<int>(v));
  return 0;
}

void quant_q5_1(const float* x, uint8_t* b, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQK, b += 24) {
    float min, max;
    min_max(x, min, max);
    const float d = (max - min) / 31;
    const float id = d != 0.f ? 1.0f / d : 0.0f;
    store_f16(b, d);
    store_f16(b + 2, min);
    uint32_t qh = 0;
    for (int j = 0; j < kQK / 2; ++j) {
      const int lo = trunc_u8((x[j] - min) * id + 0.5f);
      const int hi = trunc_u8((x[j + kQK / 2] - min) * id + 0.5f);
      b[8 + j] = static_cast<uint8_t>((lo & 0x0f) | ((hi & 0x0f) << 4));
      qh |= static_cast<uint32_t>((lo >> 4) & 1) << j;
      qh |= static_cast<uint32_t>((hi >> 4) & 1) << (j + 16);
    }
    store_u32(b + 4, qh);
  }
}

// ---- Q8_0: d, qs[32] (int8).
void dequant_q8_0(const uint8_t* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, b += 34, y += kQK) {
    const float d = load_f16(b);
    for (int j = 0; j < kQK; ++j) y[j] = static_cast<float>(static_cast<int8_t>(b[2 + j])) * d;
  }
}

void quant_q8_0(const float* x, uint8_t* b, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQK, b += 34) {
    float amax = 0.f;
    for (int j = 0; j < kQK; ++j) amax = std::max(amax, std::fabs(x[j]));
    const float d = amax / 127;
    const float id = d != 0.f ? 1.0f / d : 0.0f;
    store_f16(b, d);
    for (int j = 0; j < kQK; ++j) b[2 + j] = static_cast<uint8_t>(trunc_i8(std::round(x[j] * id)));
  }
}

// ---- MXFP4: e (E8M0), qs[16] as in Q4_0; value = kMxfp4Values[code] * 2^(e-128).
void dequant_mxfp4(const uint8_t* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, b += 17, y += kQK) {
    const float d = e8m0_to_f32_half(b[0]);
    for (int j = 0; j < kQK / 2; ++j) {
      y[j] = static_cast<float>(kMxfp4Values[b[1 + j] & 0x0f]) * d;
      y[j + kQK / 2] = static_cast<float>(kMxfp4Values[b[1 + j] >> 4]) * d;
    }
  }
}

// The code nearest x / d; on a tie the lower code, as ggml's search.
uint8_t mxfp4_code(float x, float d) {
  uint8_t best = 0;
  float best_err = std::fabs(static_cast<float>(kMxfp4Values[0]) * d - x);
  for (uint8_t c = 1; c < 16; ++c) {
    const float err = std::fabs(static_cast<float>(kMxfp4Values[c]) * d - x);
    if (err < best_err) best = c, best_err = err;
  }
  return best;
}

// ggml's exponent: floor(log2(amax)) - 2 + 127, so amax lands in the codes'
// top range (12 * 2^(e-128) = 1.5 * 2^floor(log2 amax)). ggml converts it
// to a byte unchecked; here it is clamped to the valid exponents 0..254, a
// difference only for amax below 2^-125 or not finite.
void quant_mxfp4(const float* x, uint8_t* b, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQK, b += 17) {
    float amax = 0.f;
    for (int j = 0; j < kQK; ++j)
      if (amax < std::fabs(x[j])) amax = std::fabs(x[j]);
    uint8_t e = 0;
    if (amax > 0.f) {
      const float ef = std::floor(std::log2(amax)) - 2 + 127;
      e = static_cast<uint8_t>(std::clamp(ef, 0.0f, 254.0f));
    }
    const float d = e8m0_to_f32_half(e);
    b[0] = e;
    for (int j = 0; j < kQK / 2; ++j)
      b[1 + j] = static_cast<uint8_t>(mxfp4_code(x[j], d) | (mxfp4_code(x[j + kQK / 2], d) << 4));
  }
}

// ---- plain element types
void dequant_f32(const uint8_t* b, float* y, int64_t n) { std::memcpy(y, b, static_cast<size_t>(n) * 4); }
void quant_f32(const float* x, uint8_t* b, int64_t n) { std::memcpy(b, x, static_cast<size_t>(n) * 4); }
void dequant_f16(const uint8_t* b, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = load_f16(b + 2 * i);
}
void quant_f16(const float* x, uint8_t* b, int64_t n) {
  for (int64_t i = 0; i < n; ++i) store_f16(b + 2 * i, x[i]);
}
void dequant_bf16(const uint8_t* b, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = bf16_to_f32(quant_detail::load_u16(b + 2 * i));
}
void quant_bf16(const float* x, uint8_t* b, int64_t n) {
  for (int64_t i = 0; i < n; ++i) quant_detail::store_u16(b + 2 * i, f32_to_bf16(x[i]));
}

struct Codec {
  GgmlType type;
  void (*dequant)(const uint8_t*, float*, int64_t nblocks);
  void (*quant)(const float*, uint8_t*, int64_t nblocks);
};

constexpr Codec kCodecs[] = {
    {GgmlType::F32, dequant_f32, quant_f32},
    {GgmlType::F16, dequant_f16, quant_f16},
    {GgmlType::BF16, dequant_bf16, quant_bf16},
    {GgmlType::Q4_0, dequant_q4_0, quant_q4_0},
    {GgmlType::Q4_1, dequant_q4_1, quant_q4_1},
    {GgmlType::Q5_0, dequant_q5_0, quant_q5_0},
    {GgmlType::Q5_1, dequant_q5_1, quant_q5_1},
    {GgmlType::Q8_0, dequant_q8_0, quant_q8_0},
    {GgmlType::MXFP4, dequant_mxfp4, quant_mxfp4},
    {GgmlType::Q2_K, quant_detail::dequant_q2_k, quant_detail::quant_q2_k},
    {GgmlType::Q3_K, quant_detail::dequant_q3_k, quant_detail::quant_q3_k},
    {GgmlType::Q4_K, quant_detail::dequant_q4_k, quant_detail::quant_q4_k},
    {GgmlType::Q5_K, quant_detail::dequant_q5_k, quant_detail::quant_q5_k},
    {GgmlType::Q6_K, quant_detail::dequant_q6_k, quant_detail::quant_q6_k},
};

// Validates (t, n) and returns the codec and the number of blocks.
const Codec& codec_for(GgmlType t, int64_t n, const char* what, int64_t& nblocks) {
  const TypeTraits& tt = type_traits(t);  // throws kUnsupported for an unknown id
  const Codec* found = nullptr;
  for (const Codec& c : kCodecs)
    if (c.type == t) found = &c;
  if (found == nullptr) fail(ErrorKind::kUnsupported, "no {} for tensor type {}", what, tt.name);
  if (n < 0 || n % tt.block_elems != 0)
    fail(ErrorKind::kInvalidArgument, "{}: {} elements is not a whole number of {} blocks ({} each)", what,
         n, tt.name, tt.block_elems);
  nblocks = n / tt.block_elems;
  return *found;
}

}  // namespace

void dequantize_row(GgmlType t, const void* src, float* dst, int64_t n) {
  int64_t nb = 0;
  const Codec& c = codec_for(t, n, "dequantizer", nb);
  if (nb > 0) c.dequant(static_cast<const uint8_t*>(src), dst, nb);
}

void quantize_row(GgmlType t, const float* src, void* dst, int64_t n) {
  int64_t nb = 0;
  const Codec& c = codec_for(t, n, "quantizer", nb);
  if (nb > 0) c.quant(src, static_cast<uint8_t*>(dst), nb);
}

}  // namespace tandem

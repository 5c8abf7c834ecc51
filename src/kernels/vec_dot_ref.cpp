// Scalar reference dot products. The quantized ones follow ggml's integer
// formulation: per block (or sub-block) an exact int32 sum of products of the
// stored quants, scaled once by the float scales. SIMD kernels compute the same
// integers, so they differ from these only in float summation order.
#include <cmath>
#include <cstring>
#include <type_traits>

#include "quant/quant_blocks.h"
#include "quant/quant.h"
#include "kernels/kernel_builds.h"

namespace tandem {
namespace {

float f32_value(float v) { return v; }

// ggml's scalar path sums the float types in double.
template <typename T, float (*kValue)(T)>
float dot_float(int64_t n, const void* w, const void* a) {
  const T* x = static_cast<const T*>(w);
  const T* y = static_cast<const T*>(a);
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(kValue(x[i])) * kValue(y[i]);
  return static_cast<float>(sum);
}

uint32_t load_qh(const uint8_t* qh) {
  uint32_t v;
  std::memcpy(&v, qh, 4);  // little-endian, as everywhere on x86
  return v;
}

// The 32 quants of a 32-element block in element order, as stored (the
// offset of the formats without a min taken out): low nibbles, then high
// ones, with the fifth bit from qh for q5_0 / q5_1.
void block_quants(const BlockQ4_0& x, int q[kQK]) {
  for (int j = 0; j < kQK / 2; ++j) q[j] = (x.qs[j] & 0xF) - 8, q[j + kQK / 2] = (x.qs[j] >> 4) - 8;
}
void block_quants(const BlockQ4_1& x, int q[kQK]) {
  for (int j = 0; j < kQK / 2; ++j) q[j] = x.qs[j] & 0xF, q[j + kQK / 2] = x.qs[j] >> 4;
}
void block_quants(const BlockQ5_0& x, int q[kQK]) {
  const uint32_t qh = load_qh(x.qh);
  for (int j = 0; j < kQK / 2; ++j) {
    q[j] = static_cast<int>((x.qs[j] & 0xF) | (((qh >> j) & 1) << 4)) - 16;
    q[j + kQK / 2] = static_cast<int>((x.qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4)) - 16;
  }
}
void block_quants(const BlockQ5_1& x, int q[kQK]) {
  const uint32_t qh = load_qh(x.qh);
  for (int j = 0; j < kQK / 2; ++j) {
    q[j] = static_cast<int>((x.qs[j] & 0xF) | (((qh >> j) & 1) << 4));
    q[j + kQK / 2] = static_cast<int>((x.qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4));
  }
}
void block_quants(const BlockQ8_0& x, int q[kQK]) {
  for (int j = 0; j < kQK; ++j) q[j] = x.qs[j];
}
void block_quants(const BlockMXFP4& x, int q[kQK]) {
  for (int j = 0; j < kQK / 2; ++j) q[j] = kMxfp4Values[x.qs[j] & 0xF], q[j + kQK / 2] = kMxfp4Values[x.qs[j] >> 4];
}

// Per block, an exact int32 sum of the quants' products scaled by both d;
// the formats with a min (against q8_1) add m times q8_1's stored d * sum(q8).
template <typename Block, typename ActBlock>
float dot_q32(int64_t n, const void* w, const void* a) {
  const auto* x = static_cast<const Block*>(w);
  const auto* y = static_cast<const ActBlock*>(a);
  float sum = 0;
  for (int64_t b = 0; b < n / kQK; ++b) {
    int q[kQK];
    block_quants(x[b], q);
    int32_t isum = 0;
    for (int j = 0; j < kQK; ++j) isum += q[j] * y[b].qs[j];
    const float s = f16_to_f32(x[b].d) * f16_to_f32(y[b].d) * static_cast<float>(isum);
    if constexpr (std::is_same_v<ActBlock, BlockQ8_1>) sum += s + f16_to_f32(x[b].m) * f16_to_f32(y[b].s);
    else sum += s;
  }
  return sum;
}

// MXFP4 as llama.cpp computes it on x86 (its repacked mxfp4 kernels, which
// its CPU backend uses for every matrix of a multiple of 8 rows): one chain,
// acc = fma(float(S_b), dw_b * da_b, acc) over the blocks in order, S_b the
// block's exact integer sum. Every SIMD level gives these bits.
float dot_mxfp4(int64_t n, const void* w, const void* a) {
  const auto* x = static_cast<const BlockMXFP4*>(w);
  const auto* y = static_cast<const BlockQ8_0*>(a);
  float acc = 0;
  for (int64_t b = 0; b < n / kQK; ++b) {
    int q[kQK];
    block_quants(x[b], q);
    int32_t isum = 0;
    for (int j = 0; j < kQK; ++j) isum += q[j] * y[b].qs[j];
    acc = std::fma(static_cast<float>(isum), e8m0_to_f32_half(x[b].e) * f16_to_f32(y[b].d), acc);
  }
  return acc;
}

float dot_q2_k(int64_t n, const void* w, const void* a) {
  const auto* x = static_cast<const BlockQ2K*>(w);
  const auto* y = static_cast<const BlockQ8K*>(a);
  float sum = 0;
  for (int64_t b = 0; b < n / kQKK; ++b) {
    // Element e of the super-block: byte (e/128)*32 + e%32, bits 2*((e%128)/32).
    int32_t isum = 0;
    int32_t msum = 0;
    for (int s = 0; s < 16; ++s) {
      const int base = s * 16;
      const int shift = 2 * ((base % 128) / 32);
      const uint8_t* q = x[b].qs + (base / 128) * 32 + base % 32;
      int32_t sub = 0;
      for (int l = 0; l < 16; ++l) sub += ((q[l] >> shift) & 3) * y[b].qs[base + l];
      isum += (x[b].scales[s] & 0xF) * sub;
      msum += (x[b].scales[s] >> 4) * y[b].bsums[s];
    }
    sum += y[b].d * (f16_to_f32(x[b].d) * static_cast<float>(isum) -
                     f16_to_f32(x[b].dmin) * static_cast<float>(msum));
  }
  return sum;
}

float dot_q3_k(int64_t n, const void* w, const void* a) {
  const auto* x = static_cast<const BlockQ3K*>(w);
  const auto* y = static_cast<const BlockQ8K*>(a);
  float sum = 0;
  for (int64_t b = 0; b < n / kQKK; ++b) {
    int8_t scales[16];
    k3_scales(x[b].scales, scales);
    int32_t isum = 0;
    for (int s = 0; s < 16; ++s) {
      const int base = s * 16;
      const int shift = 2 * ((base % 128) / 32);
      // The high bit (weight 4) is stored inverted: set means "no -4".
      const int hbit = (base / 32);
      const uint8_t* q = x[b].qs + (base / 128) * 32 + base % 32;
      const uint8_t* hm = x[b].hmask + base % 32;
      int32_t sub = 0;
      for (int l = 0; l < 16; ++l) {
        const int v = ((q[l] >> shift) & 3) - (((hm[l] >> hbit) & 1) ? 0 : 4);
        sub += v * y[b].qs[base + l];
      }
      isum += scales[s] * sub;
    }
    sum += f16_to_f32(x[b].d) * y[b].d * static_cast<float>(isum);
  }
  return sum;
}

// q4_K and q5_K: 8 sub-blocks of 32; element e sits in byte (e/64)*32 + e%32,
// low nibble for (e%64) < 32, high nibble otherwise; q5_K's fifth bit of
// element 32s + l is bit s of qh[l].
template <typename Block>
float dot_q45_k(int64_t n, const void* w, const void* a) {
  const auto* x = static_cast<const Block*>(w);
  const auto* y = static_cast<const BlockQ8K*>(a);
  float sum = 0;
  for (int64_t b = 0; b < n / kQKK; ++b) {
    int32_t isum = 0;
    int32_t msum = 0;
    for (int s = 0; s < 8; ++s) {
      uint8_t sc, m;
      k4_scale_min(s, x[b].scales, &sc, &m);
      const uint8_t* q = x[b].qs + (s / 2) * 32;
      const int shift = (s % 2) * 4;
      int32_t sub = 0;
      for (int l = 0; l < 32; ++l) {
        int v = (q[l] >> shift) & 0xF;
        if constexpr (std::is_same_v<Block, BlockQ5K>) v |= ((x[b].qh[l] >> s) & 1) << 4;
        sub += v * y[b].qs[s * 32 + l];
      }
      isum += sc * sub;
      msum += m * (y[b].bsums[2 * s] + y[b].bsums[2 * s + 1]);
    }
    sum += y[b].d * (f16_to_f32(x[b].d) * static_cast<float>(isum) -
                     f16_to_f32(x[b].dmin) * static_cast<float>(msum));
  }
  return sum;
}

// q6_K: element e = 128*h + 32*k + l (h half, k quarter, l 0..31) has its low
// nibble in ql[64h + 32(k%2) + l] (low half for k<2), its top two bits at
// qh[32h + l] >> 2k, and scale scales[8h + 2k + l/16].
float dot_q6_k(int64_t n, const void* w, const void* a) {
  const auto* x = static_cast<const BlockQ6K*>(w);
  const auto* y = static_cast<const BlockQ8K*>(a);
  float sum = 0;
  for (int64_t b = 0; b < n / kQKK; ++b) {
    int32_t isum = 0;
    for (int h = 0; h < 2; ++h) {
      for (int k = 0; k < 4; ++k) {
        const uint8_t* ql = x[b].ql + 64 * h + 32 * (k % 2);
        const uint8_t* qh = x[b].qh + 32 * h;
        const int lshift = (k / 2) * 4;
        for (int half = 0; half < 2; ++half) {
          int32_t sub = 0;
          for (int l = half * 16; l < half * 16 + 16; ++l) {
            const int v = (((ql[l] >> lshift) & 0xF) | (((qh[l] >> (2 * k)) & 3) << 4)) - 32;
            sub += v * y[b].qs[128 * h + 32 * k + l];
          }
          isum += x[b].scales[8 * h + 2 * k + half] * sub;
        }
      }
    }
    sum += f16_to_f32(x[b].d) * y[b].d * static_cast<float>(isum);
  }
  return sum;
}

}  // namespace

namespace builds {

TypeFns scalar_dot(GgmlType w) {
  switch (w) {
    case GgmlType::F32: return {.dot = dot_float<float, f32_value>};
    case GgmlType::F16: return {.dot = dot_float<uint16_t, f16_to_f32>};
    case GgmlType::BF16: return {.dot = dot_float<uint16_t, bf16_to_f32>};
    case GgmlType::Q4_0: return {.dot = dot_q32<BlockQ4_0, BlockQ8_0>};
    case GgmlType::Q4_1: return {.dot = dot_q32<BlockQ4_1, BlockQ8_1>};
    case GgmlType::Q5_0: return {.dot = dot_q32<BlockQ5_0, BlockQ8_0>};
    case GgmlType::Q5_1: return {.dot = dot_q32<BlockQ5_1, BlockQ8_1>};
    case GgmlType::Q8_0: return {.dot = dot_q32<BlockQ8_0, BlockQ8_0>};
    case GgmlType::MXFP4: return {.dot = dot_mxfp4};
    case GgmlType::Q2_K: return {.dot = dot_q2_k};
    case GgmlType::Q3_K: return {.dot = dot_q3_k};
    case GgmlType::Q4_K: return {.dot = dot_q45_k<BlockQ4K>};
    case GgmlType::Q5_K: return {.dot = dot_q45_k<BlockQ5K>};
    case GgmlType::Q6_K: return {.dot = dot_q6_k};
    default: return {};
  }
}

}  // namespace builds
}  // namespace tandem

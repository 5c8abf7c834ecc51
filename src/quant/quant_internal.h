// Block-level codecs shared by quant.cpp (dispatch, float formats, 32-element
// formats) and quant_kquants.cpp (256-element K-quant super-blocks). Not part
// of the public interface: callers use quant.h.
#pragma once

#include <cstdint>
#include <cstring>

#include "quant/quant.h"

namespace tandem::quant_detail {

// GGUF data is little-endian; assembling bytes keeps this host-independent and
// free of alignment assumptions (blocks are 2-byte aligned at best).
inline uint16_t load_u16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }
inline uint32_t load_u32(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) |
         (static_cast<uint32_t>(p[2]) << 16) | (static_cast<uint32_t>(p[3]) << 24);
}
inline void store_u16(uint8_t* p, uint16_t v) {
  p[0] = static_cast<uint8_t>(v);
  p[1] = static_cast<uint8_t>(v >> 8);
}
inline void store_u32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
inline float load_f16(const uint8_t* p) { return f16_to_f32(load_u16(p)); }
inline void store_f16(uint8_t* p, float f) { store_u16(p, f32_to_f16(f)); }

// ggml's round-half-to-even via the 1.5*2^23 trick. Reproduced bit for bit
// (rather than std::lrint) so quantizers pick the same level as llama.cpp, and
// so NaN input yields some integer instead of undefined behaviour.
inline int nearest_int(float fval) {
  float val = fval + 12582912.f;
  int32_t i;
  std::memcpy(&i, &val, sizeof(i));
  return (i & 0x007fffff) - 0x00400000;
}

// A group whose largest magnitude is below this is treated as all zero.
inline constexpr float kGroupMaxEps = 1e-15f;

// Scale searches (quant_search.cpp). L receives levels offset to be >= 0.
float make_qx_quants(int n, int nmax, const float* x, int8_t* L);
float make_q3_quants(int n, int nmax, const float* x, int8_t* L);
float make_qkx2_quants(int n, int nmax, const float* x, const float* weights, uint8_t* L, float* the_min,
                       uint8_t* Laux, float rmin, float rdelta, int nstep, bool use_mad);

// Each function handles `nb` consecutive blocks.
void dequant_q2_k(const uint8_t* src, float* dst, int64_t nb);
void dequant_q3_k(const uint8_t* src, float* dst, int64_t nb);
void dequant_q4_k(const uint8_t* src, float* dst, int64_t nb);
void dequant_q5_k(const uint8_t* src, float* dst, int64_t nb);
void dequant_q6_k(const uint8_t* src, float* dst, int64_t nb);

void quant_q2_k(const float* src, uint8_t* dst, int64_t nb);
void quant_q3_k(const float* src, uint8_t* dst, int64_t nb);
void quant_q4_k(const float* src, uint8_t* dst, int64_t nb);
void quant_q5_k(const float* src, uint8_t* dst, int64_t nb);
void quant_q6_k(const float* src, uint8_t* dst, int64_t nb);

}  // namespace tandem::quant_detail

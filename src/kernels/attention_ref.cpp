// The portable attention kernel: attention_chunk.h over plain floats (one
// lane), with the library's exact f16 conversion and libm's exp. It is the
// scalar level and the baseline the SIMD levels are tested against.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "core/quant.h"
#include "kernels/attention_impl.h"

namespace tandem::attn_detail {
namespace ref {

struct Ops {
  using V = float;
  static constexpr int W = 1, QR = 2, QK = 4, QKQ = 2, PR = 2, PD = 4;
  static V zero() { return 0.0f; }
  static V bcast(float f) { return f; }
  static V bcast_h(uint16_t h) { return f16_to_f32(h); }
  static V load_i8(const int8_t* p) { return static_cast<float>(*p); }
  static V load_q4_lo(const uint8_t* p) { return static_cast<float>((*p & 15) - 8); }
  static V load_q4_hi(const uint8_t* p) { return static_cast<float>((*p >> 4) - 8); }
  static V load(const float* p) { return *p; }
  static V load(const uint16_t* p) { return f16_to_f32(*p); }
  // W == 1 leaves no partial vectors; these exist for the template.
  static V load_part(const float* p, int32_t) { return *p; }
  static V load_part(const uint16_t* p, int32_t) { return f16_to_f32(*p); }
  static void store(float* p, V v) { *p = v; }
  static void store_part(float* p, V v, int32_t) { *p = v; }
  static V add(V a, V b) { return a + b; }
  static V sub(V a, V b) { return a - b; }
  static V mul(V a, V b) { return a * b; }
  // Whether the compiler fuses this (it cannot for baseline x86-64) does
  // not matter for the invariants: every schedule runs this same code.
  static V fma(V a, V b, V c) { return a * b + c; }
  static float reduce(V v) { return v; }
  static V max(V x, V m) { return x > m ? x : m; }
  static float reduce_max(V v) { return v; }
  static V exp(V x) { return std::exp(x); }
};

#define TD_FN inline
#include "kernels/attention_chunk.h"
#undef TD_FN

}  // namespace ref

ChunkFn ref_chunk_fn() { return &ref::chunk_kernel; }

}  // namespace tandem::attn_detail

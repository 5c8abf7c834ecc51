// The portable attention kernel: attention_chunk.h over plain floats (one
// lane), with the library's exact f16 conversion and libm's exp. It is the
// scalar level and the baseline the SIMD levels are tested against.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "quant/quant.h"
#include "kernels/attention_impl.h"
#include "kernels/kernel_builds.h"

namespace tandem::attn_detail {
namespace ref {

struct Ops {
  using V = float;
  static constexpr int W = 1, QR = 2, QK = 4, QKQ = 2, PR = 2, PD = 4, PRQ = 2, PDQ = 4;
  static V zero() { return 0.0f; }
  static V bcast(float f) { return f; }
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
  static V abs(V a) { return std::fabs(a); }
  // Whether the compiler fuses this (it cannot for baseline x86-64) does
  // not matter for the invariants: every schedule runs this same code.
  static V fma(V a, V b, V c) { return a * b + c; }
  static float reduce(V v) { return v; }
  static V max(V x, V m) { return x > m ? x : m; }
  static float reduce_max(V v) { return v; }
  static V exp(V x) { return std::exp(x); }
  // Quantized K/V: one word, byte by byte.
  using I = int32_t;
  using KW = uint32_t;
  using KS = uint32_t;
  static constexpr int32_t kS8Bias = 0;
  static I ibcast(int32_t x) { return x; }
  static I iadd(I a, I b) { return a + b; }
  static int32_t ireduce(I x) { return x; }
  static V to_float(I x) { return static_cast<float>(x); }
  // The default rounding mode: to nearest, ties to even, as cvtps2dq.
  static I round_int(V x) { return static_cast<int32_t>(std::nearbyint(x)); }
  static void store_i8(int8_t* p, I x) { *p = static_cast<int8_t>(x); }
  static KW load_words(const uint8_t* p) {
    KW w;
    std::memcpy(&w, p, 4);
    return w;
  }
  static KW nibbles_lo(KW w) { return w & 0x0F0F0F0Fu; }
  static KW nibbles_hi(KW w) { return (w >> 4) & 0x0F0F0F0Fu; }
  static KS signed_words(KW w) { return w; }
  static int32_t qbyte(int32_t q, int b) { return static_cast<int8_t>(static_cast<uint32_t>(q) >> (8 * b)); }
  static I dot_u8(I acc, KW k, int32_t q) {
    for (int b = 0; b < 4; ++b) acc += int32_t((k >> (8 * b)) & 0xFF) * qbyte(q, b);
    return acc;
  }
  static I dot_s8(I acc, KS k, int32_t q) {
    for (int b = 0; b < 4; ++b) acc += int32_t(static_cast<int8_t>(k >> (8 * b))) * qbyte(q, b);
    return acc;
  }
};

#define TD_FN inline
#include "kernels/attention_chunk.h"
#undef TD_FN

}  // namespace ref

}  // namespace tandem::attn_detail

namespace tandem::builds {
LevelFns scalar_attention() { return {.attention_chunk = attn_detail::ref::chunk_kernel}; }
}  // namespace tandem::builds

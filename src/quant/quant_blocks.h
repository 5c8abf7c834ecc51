// Block structs of the quantized formats. They mirror ggml's block_* structs
// (ggml-common.h) field for field, so a pointer into a GGUF tensor can be read
// through them directly; the static_asserts pin the byte counts that
// ggml_type.cpp also states. Half-precision fields are raw IEEE binary16 bits.
//
// Alignment: every struct but BlockQ8K needs only 2-byte alignment, which GGUF
// tensor data (32-byte aligned, blocks of even size) always has. BlockQ8K holds
// a float and so needs 4; it only ever lives in buffers we allocate.
#pragma once

#include <cstdint>
#include <cstring>

namespace tandem {

inline constexpr int kQK = 32;    // elements per block of the 32-element formats
inline constexpr int kQKK = 256;  // elements per K-quant super-block
inline constexpr int kKScaleBytes = 12;

struct BlockQ4_0 {
  uint16_t d;            // scale
  uint8_t qs[kQK / 2];   // element j in the low nibble of qs[j], j+16 in the high one
};

struct BlockQ4_1 {
  uint16_t d;            // scale
  uint16_t m;            // min
  uint8_t qs[kQK / 2];
};

struct BlockQ5_0 {
  uint16_t d;
  uint8_t qh[4];         // fifth bit of element j is bit j of this little-endian word
  uint8_t qs[kQK / 2];
};

struct BlockQ5_1 {
  uint16_t d;
  uint16_t m;
  uint8_t qh[4];
  uint8_t qs[kQK / 2];
};

struct BlockQ8_0 {
  uint16_t d;
  int8_t qs[kQK];
};

struct BlockQ8_1 {
  uint16_t d;
  uint16_t s;            // d * sum(qs), so x = d*q + m dots need no pass over qs
  int8_t qs[kQK];
};

// MXFP4 (OCP microscaling): 32 E2M1 codes sharing one E8M0 exponent. Code
// c stands for kMxfp4Values[c] * 2^(e - 128): the table holds the E2M1
// values doubled (so they are integers), and the scale halves them back.
struct BlockMXFP4 {
  uint8_t e;             // E8M0: the block's power of two, biased by 127
  uint8_t qs[kQK / 2];   // element j in the low nibble of qs[j], j+16 in the high one
};

inline constexpr int8_t kMxfp4Values[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

// 2^(e - 128), the scale of kMxfp4Values (ggml's GGML_E8M0_TO_FP32_HALF):
// e = 0 and 1 give the subnormals 2^-128 and 2^-127.
inline float e8m0_to_f32_half(uint8_t e) {
  const uint32_t bits = e < 2 ? 0x00200000u << e : static_cast<uint32_t>(e - 1) << 23;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

struct BlockQ2K {
  uint8_t scales[kQKK / 16];  // low nibble scale, high nibble min, per 16 elements
  uint8_t qs[kQKK / 4];
  uint16_t d;
  uint16_t dmin;
};

struct BlockQ3K {
  uint8_t hmask[kQKK / 8];
  uint8_t qs[kQKK / 4];
  uint8_t scales[12];         // 16 six-bit scales, offset by 32
  uint16_t d;
};

struct BlockQ4K {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[kKScaleBytes];  // 8 six-bit scales and 8 six-bit mins
  uint8_t qs[kQKK / 2];
};

struct BlockQ5K {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[kKScaleBytes];
  uint8_t qh[kQKK / 8];
  uint8_t qs[kQKK / 2];
};

struct BlockQ6K {
  uint8_t ql[kQKK / 2];
  uint8_t qh[kQKK / 4];
  int8_t scales[kQKK / 16];
  uint16_t d;
};

struct BlockQ8K {
  float d;
  int8_t qs[kQKK];
  int16_t bsums[kQKK / 16];   // sums of qs in groups of 16, for the K-quants' min terms
};

static_assert(sizeof(BlockQ4_0) == 18);
static_assert(sizeof(BlockQ4_1) == 20);
static_assert(sizeof(BlockQ5_0) == 22);
static_assert(sizeof(BlockQ5_1) == 24);
static_assert(sizeof(BlockQ8_0) == 34);
static_assert(sizeof(BlockQ8_1) == 36);
static_assert(sizeof(BlockMXFP4) == 17);
static_assert(sizeof(BlockQ2K) == 84);
static_assert(sizeof(BlockQ3K) == 110);
static_assert(sizeof(BlockQ4K) == 144);
static_assert(sizeof(BlockQ5K) == 176);
static_assert(sizeof(BlockQ6K) == 210);
static_assert(sizeof(BlockQ8K) == 292);

// The 6-bit scale and min of sub-block j (0..7) of a q4_K/q5_K super-block:
// the first four sit in the low 6 bits of bytes 0..3 / 4..7, the last four
// are split between the nibbles of bytes 8..11 and the top 2 bits of 0..7.
inline void k4_scale_min(int j, const uint8_t* q, uint8_t* sc, uint8_t* m) {
  if (j < 4) {
    *sc = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *sc = static_cast<uint8_t>((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
    *m = static_cast<uint8_t>((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

// All 8 scales (bytes 0..7) and 8 mins (bytes 8..15) of a q4_K/q5_K
// super-block at once, as k4_scale_min gives them one by one, computed on
// 32-bit words (word w of `packed` holds bytes 4w..4w+3, little-endian).
// Returned as words so SIMD callers can move them straight into a register.
inline void k4_unpack_words(const uint8_t* packed, uint32_t r[4]) {
  uint32_t w[3];
  std::memcpy(w, packed, 12);
  const uint32_t lo6 = 0x3f3f3f3f, lo4 = 0x0f0f0f0f, lo2 = 0x03030303;
  r[0] = w[0] & lo6;
  r[1] = (w[2] & lo4) | (((w[0] >> 6) & lo2) << 4);
  r[2] = w[1] & lo6;
  r[3] = ((w[2] >> 4) & lo4) | (((w[1] >> 6) & lo2) << 4);
}

// The 16 scales of a q3_K super-block, each as an unsigned byte 0..63 that
// stands for the signed scale byte - 32. Scale j has its low nibble in byte
// j%8 (low half for j < 8) and its top 2 bits in byte 8 + j%4 at bit
// 2*(j/4); done here four scales at a time in 32-bit words.
inline void k3_scale_words(const uint8_t* packed, uint32_t r[4]) {
  uint32_t w[3];
  std::memcpy(w, packed, 12);
  const uint32_t lo4 = 0x0f0f0f0f, lo2 = 0x03030303;
  r[0] = (w[0] & lo4) | ((w[2] & lo2) << 4);
  r[1] = (w[1] & lo4) | (((w[2] >> 2) & lo2) << 4);
  r[2] = ((w[0] >> 4) & lo4) | (((w[2] >> 4) & lo2) << 4);
  r[3] = ((w[1] >> 4) & lo4) | (((w[2] >> 6) & lo2) << 4);
}

// The 16 signed scales (-32..31) of a q3_K super-block.
inline void k3_scales(const uint8_t* packed, int8_t out[16]) {
  uint32_t r[4];
  k3_scale_words(packed, r);
  uint8_t u[16];
  std::memcpy(u, r, 16);
  for (int j = 0; j < 16; ++j) out[j] = static_cast<int8_t>(u[j] - 32);
}

}  // namespace tandem

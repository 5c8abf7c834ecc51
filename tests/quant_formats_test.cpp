// Hand-built blocks with chosen bytes. The expected values are worked out by
// hand from ggml's block layouts (ggml-common.h) and written down as numbers,
// so a layout mistake (nibble order, scale packing, byte offsets) shows up
// as a wrong element rather than being reproduced by the test.
#include <array>
#include <cstdint>
#include <vector>

#include <gtest/gtest.h>

#include "quant/ggml_type.h"
#include "quant/quant.h"

namespace tandem {
namespace {

std::vector<float> dequant(GgmlType t, const std::vector<uint8_t>& bytes) {
  const TypeTraits& tt = type_traits(t);
  EXPECT_EQ(bytes.size() % tt.block_bytes, 0u);
  const int64_t n = static_cast<int64_t>(bytes.size() / tt.block_bytes) * tt.block_elems;
  std::vector<float> out(static_cast<size_t>(n), -12345.f);
  dequantize_row(t, bytes.data(), out.data(), n);
  return out;
}

void put16(std::vector<uint8_t>& b, size_t off, uint16_t v) {
  b[off] = static_cast<uint8_t>(v);
  b[off + 1] = static_cast<uint8_t>(v >> 8);
}

// f16 constants used below.
constexpr uint16_t kHalfQuarter = 0x3400, kHalfHalf = 0x3800, kHalfOne = 0x3c00, kHalfTwo = 0x4000,
                   kHalfMinusOne = 0xbc00;

TEST(QuantFormats, PlainTypes) {
  const std::vector<uint8_t> f32 = {0x00, 0x00, 0x80, 0x3f, 0x00, 0x00, 0x00, 0xc0};  // 1.0f, -2.0f
  EXPECT_EQ(dequant(GgmlType::F32, f32), (std::vector<float>{1.0f, -2.0f}));
  const std::vector<uint8_t> f16 = {0x00, 0x3c, 0x00, 0xc0, 0xff, 0x7b, 0x01, 0x00};
  EXPECT_EQ(dequant(GgmlType::F16, f16), (std::vector<float>{1.0f, -2.0f, 65504.0f, 0x1p-24f}));
  const std::vector<uint8_t> bf16 = {0x80, 0x3f, 0x00, 0xc0, 0x49, 0x40};
  EXPECT_EQ(dequant(GgmlType::BF16, bf16), (std::vector<float>{1.0f, -2.0f, 3.140625f}));
}

TEST(QuantFormats, Q8_0) {
  std::vector<uint8_t> b(34);
  put16(b, 0, kHalfHalf);  // d = 0.5
  for (int j = 0; j < 32; ++j) b[2 + j] = static_cast<uint8_t>(j * 8 - 128);  // as int8: -128, -120, ..., 120
  const auto y = dequant(GgmlType::Q8_0, b);
  EXPECT_EQ(y[0], -64.0f);
  EXPECT_EQ(y[1], -60.0f);
  EXPECT_EQ(y[16], 0.0f);
  EXPECT_EQ(y[17], 4.0f);
  EXPECT_EQ(y[31], 60.0f);
}

TEST(QuantFormats, Q4_0LowNibblesAreTheFirstHalf) {
  std::vector<uint8_t> b(18 * 2, 0x88);  // every nibble 8 -> value 0
  put16(b, 0, kHalfTwo);                 // block 0: d = 2
  b[2 + 0] = 0x93;                       // element 0 <- 3, element 16 <- 9
  b[2 + 15] = 0x0f;                      // element 15 <- 15, element 31 <- 0
  put16(b, 18, kHalfMinusOne);           // block 1: d = -1
  b[18 + 2 + 1] = 0x1a;                  // element 32+1 <- 10, element 32+17 <- 1
  const auto y = dequant(GgmlType::Q4_0, b);
  EXPECT_EQ(y[0], -10.0f);  // (3-8)*2
  EXPECT_EQ(y[16], 2.0f);   // (9-8)*2
  EXPECT_EQ(y[15], 14.0f);  // (15-8)*2
  EXPECT_EQ(y[31], -16.0f);  // (0-8)*2
  EXPECT_EQ(y[1], 0.0f);
  EXPECT_EQ(y[33], -2.0f);  // (10-8)*-1
  EXPECT_EQ(y[49], 7.0f);   // (1-8)*-1
  EXPECT_EQ(y[32], -0.0f);
}

TEST(QuantFormats, Q4_1) {
  std::vector<uint8_t> b(20, 0);
  put16(b, 0, kHalfQuarter);   // d = 0.25
  put16(b, 2, kHalfMinusOne);  // m = -1
  b[4 + 5] = 0xf0;             // element 5 <- 0, element 21 <- 15
  b[4 + 0] = 0x06;             // element 0 <- 6
  const auto y = dequant(GgmlType::Q4_1, b);
  EXPECT_EQ(y[5], -1.0f);
  EXPECT_EQ(y[21], 2.75f);  // 15*0.25 - 1
  EXPECT_EQ(y[0], 0.5f);    // 6*0.25 - 1
  EXPECT_EQ(y[31], -1.0f);
}

TEST(QuantFormats, Q5_0HighBitsComeFromLittleEndianQh) {
  std::vector<uint8_t> b(22, 0);
  put16(b, 0, kHalfOne);
  // qh = 0x00020001: bit 0 (element 0) and bit 17 (element 17).
  b[2] = 0x01;
  b[4] = 0x02;
  b[6 + 0] = 0x21;  // element 0 low 1, element 16 low 2
  b[6 + 1] = 0x43;  // element 1 low 3, element 17 low 4
  const auto y = dequant(GgmlType::Q5_0, b);
  EXPECT_EQ(y[0], 1.0f);     // (1|16) - 16
  EXPECT_EQ(y[16], -14.0f);  // 2 - 16
  EXPECT_EQ(y[1], -13.0f);   // 3 - 16
  EXPECT_EQ(y[17], 4.0f);    // (4|16) - 16
  EXPECT_EQ(y[2], -16.0f);
}

TEST(QuantFormats, Q5_1) {
  std::vector<uint8_t> b(24, 0);
  put16(b, 0, kHalfHalf);  // d = 0.5
  put16(b, 2, kHalfOne);   // m = 1
  b[4 + 3] = 0x80;         // qh bit 31 -> element 31
  b[8 + 15] = 0x7f;        // element 15 low 15, element 31 low 7
  const auto y = dequant(GgmlType::Q5_1, b);
  EXPECT_EQ(y[15], 8.5f);   // 15*0.5 + 1
  EXPECT_EQ(y[31], 12.5f);  // (7|16)*0.5 + 1
  EXPECT_EQ(y[0], 1.0f);
}

// Q2_K: scales[16] (low nibble scale, high nibble min) | qs[64] | d | dmin.
// Element e: sub-block e/16; 2-bit field in qs[32*(e/128) + e%32], bit pair (e%128)/32.
TEST(QuantFormats, Q2_K) {
  std::vector<uint8_t> b(84, 0);
  put16(b, 80, kHalfHalf);  // d = 0.5
  put16(b, 82, kHalfTwo);   // dmin = 2
  b[0] = 0x13;              // sub-block 0: scale 3, min 1
  b[6] = 0x2f;              // sub-block 6: scale 15, min 2
  b[15] = 0xf1;             // sub-block 15: scale 1, min 15
  b[16 + 0] = 0x02;         // element 0: q = 2
  b[16 + 4] = 0xc0;         // element 100 (pair 3, l = 4): q = 3
  b[16 + 49] = 0x40;        // element 241 (half 1, pair 3, l = 17): q = 1
  std::array<float, 256> want{};
  for (int e = 0; e < 16; ++e) want[e] = -2.0f;        // 0.5*3*0 - 2*1
  for (int e = 96; e < 112; ++e) want[e] = -4.0f;      // - 2*2
  for (int e = 240; e < 256; ++e) want[e] = -30.0f;    // - 2*15
  want[0] = 1.0f;                                      // 0.5*3*2 - 2
  want[100] = 18.5f;                                   // 0.5*15*3 - 4
  want[241] = -29.5f;                                  // 0.5*1*1 - 30
  const auto y = dequant(GgmlType::Q2_K, b);
  for (int e = 0; e < 256; ++e) EXPECT_EQ(y[e], want[e]) << "element " << e;
}

// Q3_K: hmask[32] | qs[64] | scales[12] | d. Scales are 6-bit, stored +32:
// low nibbles in bytes 0..7 (scale j<8: low half of byte j, j>=8: high half of
// byte j-8), top bits in byte 8 + j%4 at bit pair j/4. Element e: 2 low bits as
// in Q2_K, high bit = hmask[e%32] bit e/32; q = low2 - (high ? 0 : 4).
TEST(QuantFormats, Q3_K) {
  std::vector<uint8_t> b(110, 0);
  // Raw scales: s0 = 33 (+1), s5 = 0 (-32), s9 = 63 (+31), s15 = 30 (-2), all others 32 (0).
  const uint8_t scales[12] = {0x01, 0xf0, 0x00, 0x00, 0x00, 0x00, 0x00, 0xe0, 0xaa, 0xb2, 0xaa, 0x6a};
  for (int i = 0; i < 12; ++i) b[96 + i] = scales[i];
  put16(b, 108, kHalfHalf);  // d = 0.5
  b[32 + 0] = 0x03;          // element 0: low bits 3
  b[0] |= 0x01;              //            high bit set -> q = 3
  b[32 + 16] = 0x20;         // element 80 (pair 2, l = 16): low bits 2
  b[16] |= 0x04;             //            hmask[16] bit 2 -> q = 2
  b[32 + 48] = 0x01;         // element 144 (half 1, pair 0, l = 16): low 1, no high bit -> q = -3
  b[32 + 63] = 0xc0;         // element 255 (half 1, pair 3, l = 31): low 3
  b[31] |= 0x80;             //            hmask[31] bit 7 -> q = 3
  std::array<float, 256> want{};
  for (int e = 0; e < 16; ++e) want[e] = -2.0f;       // 0.5*1*(-4)
  for (int e = 80; e < 96; ++e) want[e] = 64.0f;      // 0.5*(-32)*(-4)
  for (int e = 144; e < 160; ++e) want[e] = -62.0f;   // 0.5*31*(-4)
  for (int e = 240; e < 256; ++e) want[e] = 4.0f;     // 0.5*(-2)*(-4)
  want[0] = 1.5f;                                     // 0.5*1*3
  want[80] = -32.0f;                                  // 0.5*(-32)*2
  want[144] = -46.5f;                                 // 0.5*31*(-3)
  want[255] = -3.0f;                                  // 0.5*(-2)*3
  const auto y = dequant(GgmlType::Q3_K, b);
  for (int e = 0; e < 256; ++e) EXPECT_EQ(y[e], want[e]) << "element " << e;
}

// Q4_K: d | dmin | scales[12] | qs[128]. Sub-block j (32 elements): for j < 4
// scale = byte j & 63, min = byte j+4 & 63; for j >= 4 the low nibbles are in
// byte j+4 (scale low, min high) and the top two bits are the top bits of
// bytes j-4 (scale) and j (min). qs byte 32*(j/2) + l holds sub-block j's
// element l in its low nibble for even j, high nibble for odd j.
TEST(QuantFormats, Q4_KPackedScalesOfUpperSubBlocks) {
  std::vector<uint8_t> b(144, 0);
  put16(b, 0, kHalfOne);      // d = 1
  put16(b, 2, kHalfQuarter);  // dmin = 0.25
  // Sub-block 1: scale 2, min 4. Sub-block 6: scale 45 = 0b10'1101, min 50 = 0b11'0010.
  const uint8_t scales[12] = {0x00, 0x02, 0x80, 0x00, 0x00, 0x04, 0xc0, 0x00, 0x00, 0x00, 0x2d, 0x00};
  for (int i = 0; i < 12; ++i) b[4 + i] = scales[i];
  b[16 + 0] = 0x70;   // element 32 (sub-block 1, high nibble of qs[0]): q = 7
  b[16 + 96] = 0x0b;  // element 192 (sub-block 6, low nibble of qs[96]): q = 11
  std::array<float, 256> want{};
  for (int e = 32; e < 64; ++e) want[e] = -1.0f;       // 2*0 - 0.25*4
  for (int e = 192; e < 224; ++e) want[e] = -12.5f;    // 45*0 - 0.25*50
  want[32] = 13.0f;                                    // 2*7 - 1
  want[192] = 482.5f;                                  // 45*11 - 12.5
  const auto y = dequant(GgmlType::Q4_K, b);
  for (int e = 0; e < 256; ++e) EXPECT_EQ(y[e], want[e]) << "element " << e;
}

// Q5_K: d | dmin | scales[12] (as Q4_K) | qh[32] | qs[128]. The fifth bit of
// sub-block j's element l is bit j of qh[l].
TEST(QuantFormats, Q5_KPackedScalesAndHighBits) {
  std::vector<uint8_t> b(176, 0);
  put16(b, 0, kHalfHalf);  // d = 0.5
  put16(b, 2, kHalfOne);   // dmin = 1
  // Sub-block 0: scale 1, min 0. Sub-block 5: scale 17 = 0b01'0001, min 33 = 0b10'0001.
  const uint8_t scales[12] = {0x01, 0x40, 0x00, 0x00, 0x00, 0x80, 0x00, 0x00, 0x00, 0x11, 0x00, 0x00};
  for (int i = 0; i < 12; ++i) b[4 + i] = scales[i];
  b[48 + 0] = 0x0f;   // element 0: low 15
  b[16 + 0] = 0x01;   //   qh[0] bit 0 -> q = 31
  b[48 + 65] = 0x30;  // element 161 (sub-block 5, high nibble of qs[65]): low 3
  b[16 + 1] = 0x20;   //   qh[1] bit 5 -> q = 19
  std::array<float, 256> want{};
  for (int e = 160; e < 192; ++e) want[e] = -33.0f;  // 0 - 1*33
  want[0] = 15.5f;                                   // 0.5*1*31
  want[161] = 128.5f;                                // 0.5*17*19 - 33
  const auto y = dequant(GgmlType::Q5_K, b);
  for (int e = 0; e < 256; ++e) EXPECT_EQ(y[e], want[e]) << "element " << e;
}

// Q6_K: ql[128] | qh[64] | int8 scales[16] | d. Element e = 128h + 32k + l:
// low 4 bits in ql[64h + l + 32*(k&1)], low nibble for k < 2, high for k >= 2;
// top 2 bits in qh[32h + l] at bit pair k; scale = scales[e/16]; q - 32.
TEST(QuantFormats, Q6_K) {
  std::vector<uint8_t> b(210, 0);
  put16(b, 208, kHalfHalf);  // d = 0.5
  b[192 + 0] = 2;
  b[192 + 3] = static_cast<uint8_t>(-3);
  b[192 + 13] = 100;
  b[0] = 0x05;         // element 0: low 5
  b[128 + 0] = 0x02;   //   top bits 2 -> q = 37 - 32 = 5
  b[50] = 0x0a;        // element 50 (k = 1, l = 18): low 10
  b[128 + 18] = 0x0c;  //   top bits 3 at pair 1 -> q = 58 - 32 = 26
  b[95] = 0xf0;        // element 223 (h = 1, k = 2, l = 31): high nibble of ql[64+31] = 15
  b[128 + 63] = 0x10;  //   top bits 1 at pair 2 -> q = 31 - 32 = -1
  std::array<float, 256> want{};
  for (int e = 0; e < 16; ++e) want[e] = -32.0f;       // 0.5*2*(-32)
  for (int e = 48; e < 64; ++e) want[e] = 48.0f;       // 0.5*(-3)*(-32)
  for (int e = 208; e < 224; ++e) want[e] = -1600.0f;  // 0.5*100*(-32)
  want[0] = 5.0f;      // 0.5*2*5
  want[50] = -39.0f;   // 0.5*(-3)*26
  want[223] = -50.0f;  // 0.5*100*(-1)
  const auto y = dequant(GgmlType::Q6_K, b);
  for (int e = 0; e < 256; ++e) EXPECT_EQ(y[e], want[e]) << "element " << e;
}

// MXFP4: byte 0 the E8M0 exponent e, then 16 bytes of E2M1 codes (element j
// in the low nibble of byte 1 + j, element j + 16 in the high one). Code c is
// (sign c & 8) x {0, 0.5, 1, 1.5, 2, 3, 4, 6}[c & 7] times 2^(e - 127).
TEST(QuantFormats, MXFP4CodesAndExponents) {
  std::vector<uint8_t> b(17 * 4, 0);
  b[0] = 127;  // block 0: 2^0
  for (int j = 0; j < 16; ++j) b[1 + j] = static_cast<uint8_t>(j | ((15 - j) << 4));
  b[17] = 130;  // block 1: 2^3; element 0 <- code 7 (6), element 16 <- code 15 (-6)
  b[18] = 0xF7;
  b[34] = 0;  // block 2: e = 0; element 0 <- code 1: 0.5 x 2^-127, a float subnormal
  b[35] = 0x01;
  b[51] = 254;  // block 3: 2^127; element 1 <- code 10 (-1)
  b[53] = 0x0A;
  const auto y = dequant(GgmlType::MXFP4, b);
  const float codes[16] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6, 0, -0.5f, -1, -1.5f, -2, -3, -4, -6};
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[j], codes[j]) << j;
    EXPECT_EQ(y[16 + j], codes[15 - j]) << j;
  }
  EXPECT_EQ(y[32], 48.0f);
  EXPECT_EQ(y[48], -48.0f);
  EXPECT_EQ(y[33], 0.0f);
  EXPECT_EQ(y[64], 0x1p-128f);
  EXPECT_EQ(y[97], -0x1p127f);
}

// ggml's quantizer: e = floor(log2(amax)) - 2 + 127, then per element the
// nearest code, the lower code on a tie.
TEST(QuantFormats, MXFP4QuantizerPicksExponentAndNearestCode) {
  std::vector<float> x(32, 0.0f);
  x[0] = 6.0f;     // once x[17] is 0, amax 6: e = 2 - 2 + 127 = 127, codes 0, 0.5, 1, 1.5, 2, 3, 4, 6
  x[1] = 0.25f;    // between 0 (code 0) and 0.5 (code 1): a tie, so code 0
  x[2] = -0.75f;   // between -0.5 (code 9) and -1 (code 10): code 9
  x[3] = 5.0f;     // between 4 (code 6) and 6 (code 7): code 6
  x[16] = -2.6f;   // nearest -3 (code 13)
  x[17] = 100.0f;  // the largest magnitude after all: amax 100, e = 6 - 2 + 127 = 131
  std::vector<uint8_t> b(17);
  quantize_row(GgmlType::MXFP4, x.data(), b.data(), 32);
  EXPECT_EQ(b[0], 131);  // scale 2^4 / 2 = 8 per doubled code: codes reach 12 * 8 = 96
  EXPECT_EQ(b[1 + 1] >> 4, 7);   // 100 -> 96 (code 7), clipped to the top code
  EXPECT_EQ(b[1 + 0] & 15, 1);   // 6 -> 8 (code 1), nearer than 0
  x[17] = 0.0f;
  quantize_row(GgmlType::MXFP4, x.data(), b.data(), 32);
  EXPECT_EQ(b[0], 127);
  EXPECT_EQ(b[1 + 0] & 15, 7);
  EXPECT_EQ(b[1 + 1] & 15, 0);
  EXPECT_EQ(b[1 + 2] & 15, 9);
  EXPECT_EQ(b[1 + 3] & 15, 6);
  EXPECT_EQ(b[1 + 0] >> 4, 13);
  // An all-zero block: e = 0 and code 0 throughout.
  std::vector<float> z(32, 0.0f);
  quantize_row(GgmlType::MXFP4, z.data(), b.data(), 32);
  EXPECT_EQ(b, std::vector<uint8_t>(17, 0));
}

}  // namespace
}  // namespace tandem

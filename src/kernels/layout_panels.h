// Panel layouts of the tiled kernels (see product_kernels.h), shared by the scalar
// reference and the SIMD kernels. One panel block holds one format block of
// each of kGemmTile = 16 weight rows; "lane n" is row o0 + n. Quants are
// stored unpacked, one unsigned byte each, grouped four elements per lane so
// a 32-bit lane of a vector holds what one dpbusd step needs:
//   q[group g][lane n][byte i] = element 4g + i of row n.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "quant/quant_blocks.h"
#include "kernels/product_kernels.h"

namespace tandem::gemm_detail {

// q4_0 / q5_0 / q8_0 / mxfp4: unsigned quant u = q + q32_offset(type) (mxfp4:
// its code's value doubled, -12..12, as kMxfp4Values). The scales stay the
// file's f16 so a q8_0 panel is exactly as large as the file's 16 blocks (544
// bytes): repacked q8_0 weights cost no memory and decode reads no more bytes
// than from the file. (With f32 scales, 576 bytes: +5.9% read per decoded
// token.) The quants are then 64-byte aligned in every other block only; the
// kernels load them unaligned. mxfp4's scale 2^(e - 128) is out of f16's
// range but exact in bf16 (a power of two, or one of the two f32 subnormals
// e8m0_to_f32_half gives, whose low 16 bits are zero), so its panels hold
// bf16 scales in the same 32 bytes.
struct Q32Panel {
  static constexpr size_t kD = 0;                  // f16 d[16] (mxfp4: bf16)
  static constexpr size_t kQ = 32;                 // uint8 q[8][16][4]
  static constexpr size_t kBytes = kQ + 8 * 64;    // 544
};

// Whether a q32 panel of type t holds bf16 scales (mxfp4) rather than f16.
inline bool q32_bf16_scales(GgmlType t) { return t == GgmlType::MXFP4; }

// The panel scale of the q32 block at blk: the f16 d every q4_0 / q5_0 /
// q8_0 block starts with, or mxfp4's 2^(e - 128) as bf16 (its f32 bits'
// upper half; the lower half is zero, see above).
inline uint16_t q32_panel_scale(GgmlType t, const uint8_t* blk) {
  if (q32_bf16_scales(t)) {
    const float d = e8m0_to_f32_half(blk[offsetof(BlockMXFP4, e)]);
    uint32_t bits;
    std::memcpy(&bits, &d, 4);
    return static_cast<uint16_t>(bits >> 16);
  }
  uint16_t h;
  std::memcpy(&h, blk, 2);
  return h;
}

// The scales of the blocks at byte `off` of 16 rows into a q32 panel.
inline void pack_q32_scales(GgmlType t, const uint8_t* const rows[16], size_t off, uint8_t* panel) {
  for (int n = 0; n < 16; ++n) {
    const uint16_t h = q32_panel_scale(t, rows[n] + off);
    std::memcpy(panel + Q32Panel::kD + 2 * n, &h, 2);
  }
}

// q4_K / q5_K: u in 0..15 / 0..31, scale and min per sub-block of 32.
struct K4Panel {
  static constexpr size_t kD = 0;                  // float d[16]
  static constexpr size_t kDmin = 64;              // float dmin[16]
  static constexpr size_t kSc = 128;               // int32 sc[8][16]
  static constexpr size_t kMins = kSc + 8 * 64;    // int32 [4][16]: int16 pair (m_2i, m_2i+1)
  static constexpr size_t kQ = kMins + 4 * 64;     // uint8 q[64][16][4]
  static constexpr size_t kBytes = kQ + 64 * 64;   // 4992
};

// q6_K: u = q + 32 in 0..63, signed scale per group of 16.
struct K6Panel {
  static constexpr size_t kD = 0;                  // float d[16]
  static constexpr size_t kSc = 64;                // int32 sc[16][16]
  static constexpr size_t kQ = kSc + 16 * 64;      // uint8 q[64][16][4]
  static constexpr size_t kBytes = kQ + 64 * 64;   // 5184
};

// Bytes of one panel block (16 rows' blocks) of a class with panels; 0 for the others.
inline size_t panel_block_bytes(GemmClass c) {
  switch (c) {
    case GemmClass::kQ32: return Q32Panel::kBytes;
    case GemmClass::kK4: return K4Panel::kBytes;
    case GemmClass::kK6: return K6Panel::kBytes;
    default: return 0;
  }
}

// Scalar packers (the definition of the layouts above); SIMD levels may use
// faster ones that write the same bytes.
void pack_q32_ref(const WeightMatrix& W, int64_t o0, int64_t b0, int64_t b1, uint8_t* panel);
void pack_k4_ref(const WeightMatrix& W, int64_t o0, int64_t b0, int64_t b1, uint8_t* panel);
void pack_k6_ref(const WeightMatrix& W, int64_t o0, int64_t b0, int64_t b1, uint8_t* panel);

// The packers of each vector width (layout_pack_rows.h), for CPUs that run it;
// the AVX-512 ones also read the tiles.
namespace avx2 {
void pack_q32(const WeightMatrix& W, int64_t o0, int64_t b0, int64_t b1, uint8_t* panel);
void pack_k4(const WeightMatrix& W, int64_t o0, int64_t b0, int64_t b1, uint8_t* panel);
void pack_k6(const WeightMatrix& W, int64_t o0, int64_t b0, int64_t b1, uint8_t* panel);
}  // namespace avx2
namespace avx512 {
void pack_q32(const WeightMatrix& W, int64_t o0, int64_t b0, int64_t b1, uint8_t* panel);
void pack_k4(const WeightMatrix& W, int64_t o0, int64_t b0, int64_t b1, uint8_t* panel);
void pack_k6(const WeightMatrix& W, int64_t o0, int64_t b0, int64_t b1, uint8_t* panel);
}  // namespace avx512

}  // namespace tandem::gemm_detail

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

#include "kernels/product_kernels.h"

namespace tandem::gemm_detail {

// q4_0 / q5_0 / q8_0: unsigned quant u = q + q32_offset(type). The scales
// stay the file's f16 so a q8_0 panel is exactly as large as the file's 16
// blocks (544 bytes): repacked q8_0 weights cost no memory and decode reads
// no more bytes than from the file. (With f32 scales, 576 bytes: +5.9% read
// per decoded token.) The quants are then 64-byte aligned in every other
// block only; the kernels load them unaligned.
struct Q32Panel {
  static constexpr size_t kD = 0;                  // f16 d[16]
  static constexpr size_t kQ = 32;                 // uint8 q[8][16][4]
  static constexpr size_t kBytes = kQ + 8 * 64;    // 544
};

// The scales of the blocks at byte `off` of 16 rows into a q32 panel: every
// q32 block (q4_0, q5_0, q8_0) starts with its f16 d.
inline void pack_q32_scales(const uint8_t* const rows[16], size_t off, uint8_t* panel) {
  for (int n = 0; n < 16; ++n) std::memcpy(panel + Q32Panel::kD + 2 * n, rows[n] + off, 2);
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

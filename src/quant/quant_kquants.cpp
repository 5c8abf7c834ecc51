// K-quants: 256-element super-blocks with per-sub-block scales (and mins)
// that are themselves quantized against one or two f16 super-block scales.
// Layouts are ggml's block_q{2..6}_K; the quantizers reproduce ggml's
// quantize_row_q*_K_ref searches (make_qx_quants, make_q3_quants,
// make_qkx2_quants) operation for operation, so the chosen levels, and hence
// the bytes, match what llama.cpp writes. Keep the float expressions in the
// same order: (a*b)*c is not a*(b*c) and the searches compare near-ties.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "quant/quant_internal.h"

namespace tandem::quant_detail {
namespace {

constexpr int kQK_K = 256;

// Byte offsets inside each block.
constexpr int kQ2Bytes = 84, kQ2Scales = 0, kQ2Qs = 16, kQ2D = 80, kQ2Dmin = 82;
constexpr int kQ3Bytes = 110, kQ3Hmask = 0, kQ3Qs = 32, kQ3Scales = 96, kQ3D = 108;
constexpr int kQ4Bytes = 144, kQ4Scales = 4, kQ4Qs = 16;  // d at 0, dmin at 2
constexpr int kQ5Bytes = 176, kQ5Scales = 4, kQ5Qh = 16, kQ5Qs = 48;
constexpr int kQ6Bytes = 210, kQ6Ql = 0, kQ6Qh = 128, kQ6Scales = 192, kQ6D = 208;

// Q4_K/Q5_K: eight 6-bit scales and eight 6-bit mins in 12 bytes. Sub-blocks
// 0..3 use the low 6 bits of bytes j (scale) and j+4 (min); sub-blocks 4..7
// take their low nibbles from byte j+4 and their top two bits from the spare
// top bits of bytes j-4 (scale) and j (min).
void scale_min_k4(int j, const uint8_t* q, uint8_t& sc, uint8_t& m) {
  if (j < 4) {
    sc = q[j] & 63;
    m = q[j + 4] & 63;
  } else {
    sc = static_cast<uint8_t>((q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4));
    m = static_cast<uint8_t>((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

void pack_scale_min_k4(int j, uint8_t ls, uint8_t lm, uint8_t* q) {
  if (j < 4) {
    q[j] = ls;
    q[j + 4] = lm;
  } else {
    q[j + 4] = static_cast<uint8_t>((ls & 0x0f) | ((lm & 0x0f) << 4));
    q[j - 4] |= static_cast<uint8_t>((ls >> 4) << 6);
    q[j] |= static_cast<uint8_t>((lm >> 4) << 6);
  }
}

// Q3_K: sixteen 6-bit scales (stored +32) in 12 bytes. Low nibbles: bytes 0..7,
// low half for scales 0..7 and high half for 8..15. Top two bits: byte
// 8 + j%4, bit pair j/4.
int q3_scale(const uint8_t* s, int j) {
  const int lo = j < 8 ? (s[j] & 0x0f) : (s[j - 8] >> 4);
  const int hi = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
  return (lo | (hi << 4)) - 32;
}

// 2-bit fields of Q2_K/Q3_K: within each 128-element half, byte l of the
// 32-byte group holds elements l, l+32, l+64, l+96 in bit pairs 0..3.
void pack_2bit(const uint8_t* L, uint8_t* qs) {
  for (int h = 0; h < 2; ++h) {
    const uint8_t* l4 = L + 128 * h;
    for (int l = 0; l < 32; ++l)
      qs[32 * h + l] = static_cast<uint8_t>(l4[l] | (l4[l + 32] << 2) | (l4[l + 64] << 4) | (l4[l + 96] << 6));
  }
}

}  // namespace

// ---------------------------------------------------------------- Q2_K
// value = d*(sc&15)*q - dmin*(sc>>4), q in 0..3, one 4+4-bit scale byte per 16 elements.
void dequant_q2_k(const uint8_t* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, b += kQ2Bytes) {
    const float d = load_f16(b + kQ2D), dmin = load_f16(b + kQ2Dmin);
    const uint8_t* sc = b + kQ2Scales;
    for (int h = 0; h < 2; ++h) {
      const uint8_t* q = b + kQ2Qs + 32 * h;
      for (int j = 0; j < 4; ++j) {
        for (int g = 0; g < 2; ++g) {
          const uint8_t s = sc[8 * h + 2 * j + g];
          const float dl = d * static_cast<float>(s & 0x0f), ml = dmin * static_cast<float>(s >> 4);
          for (int l = 0; l < 16; ++l)
            *y++ = dl * static_cast<float>((q[16 * g + l] >> (2 * j)) & 3) - ml;
        }
      }
    }
  }
}

void quant_q2_k(const float* x, uint8_t* b, int64_t nb) {
  uint8_t L[kQK_K], Laux[16];
  float weights[16], mins[16], scales[16];
  for (int64_t i = 0; i < nb; ++i, x += kQK_K, b += kQ2Bytes) {
    float max_scale = 0, max_min = 0;  // mins are subtracted, so scales are >= 0
    for (int j = 0; j < 16; ++j) {
      for (int l = 0; l < 16; ++l) weights[l] = std::fabs(x[16 * j + l]);
      scales[j] = make_qkx2_quants(16, 3, x + 16 * j, weights, L + 16 * j, &mins[j], Laux, -0.5f, 0.1f, 15, true);
      if (scales[j] > max_scale) max_scale = scales[j];
      if (mins[j] > max_min) max_min = mins[j];
    }
    uint8_t* sc = b + kQ2Scales;
    if (max_scale > 0) {
      const float iscale = 15.f / max_scale;
      for (int j = 0; j < 16; ++j) sc[j] = static_cast<uint8_t>(nearest_int(iscale * scales[j]));
      store_f16(b + kQ2D, max_scale / 15.f);
    } else {
      std::memset(sc, 0, 16);
      store_f16(b + kQ2D, 0.f);
    }
    if (max_min > 0) {
      const float iscale = 15.f / max_min;
      for (int j = 0; j < 16; ++j) sc[j] |= static_cast<uint8_t>(nearest_int(iscale * mins[j]) << 4);
      store_f16(b + kQ2Dmin, max_min / 15.f);
    } else {
      store_f16(b + kQ2Dmin, 0.f);
    }
    // Re-pick levels against the scales as stored (rounded to 4 bits and f16).
    for (int j = 0; j < 16; ++j) {
      const float d = load_f16(b + kQ2D) * static_cast<float>(sc[j] & 0x0f);
      if (d == 0.f) continue;
      const float dm = load_f16(b + kQ2Dmin) * static_cast<float>(sc[j] >> 4);
      for (int ii = 0; ii < 16; ++ii) {
        const int l = nearest_int((x[16 * j + ii] + dm) / d);
        L[16 * j + ii] = static_cast<uint8_t>(std::max(0, std::min(3, l)));
      }
    }
    pack_2bit(L, b + kQ2Qs);
  }
}

// ---------------------------------------------------------------- Q3_K
// value = d*(scale-32)*(q-4), q = 2 low bits from qs | high bit from hmask
// (hmask byte l%32, bit l/32 for element l).
void dequant_q3_k(const uint8_t* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, b += kQ3Bytes) {
    const float d_all = load_f16(b + kQ3D);
    const uint8_t* hm = b + kQ3Hmask;
    for (int h = 0; h < 2; ++h) {
      const uint8_t* q = b + kQ3Qs + 32 * h;
      for (int j = 0; j < 4; ++j) {
        const int mask = 1 << (4 * h + j);
        for (int g = 0; g < 2; ++g) {
          const float dl = d_all * static_cast<float>(q3_scale(b + kQ3Scales, 8 * h + 2 * j + g));
          for (int l = 16 * g; l < 16 * g + 16; ++l) {
            const int v = ((q[l] >> (2 * j)) & 3) - ((hm[l] & mask) ? 0 : 4);
            *y++ = dl * static_cast<float>(v);
          }
        }
      }
    }
  }
}

void quant_q3_k(const float* x, uint8_t* b, int64_t nb) {
  int8_t L[kQK_K];
  float scales[16];
  for (int64_t i = 0; i < nb; ++i, x += kQK_K, b += kQ3Bytes) {
    float max_scale = 0, amax = 0;
    for (int j = 0; j < 16; ++j) {
      scales[j] = make_q3_quants(16, 4, x + 16 * j, L + 16 * j);
      const float a = std::fabs(scales[j]);
      if (a > amax) {
        amax = a;
        max_scale = scales[j];
      }
    }
    uint8_t* sc = b + kQ3Scales;
    std::memset(sc, 0, 12);
    if (max_scale != 0.f) {
      const float iscale = -32.f / max_scale;
      for (int j = 0; j < 16; ++j) {
        const int8_t r = static_cast<int8_t>(nearest_int(iscale * scales[j]));  // ggml narrows before clamping
        const int l = std::max<int>(-32, std::min<int>(31, r)) + 32;
        if (j < 8)
          sc[j] = static_cast<uint8_t>(l & 0x0f);
        else
          sc[j - 8] |= static_cast<uint8_t>((l & 0x0f) << 4);
        sc[j % 4 + 8] |= static_cast<uint8_t>((l >> 4) << (2 * (j / 4)));
      }
      store_f16(b + kQ3D, 1 / iscale);
    } else {
      store_f16(b + kQ3D, 0.f);
    }
    for (int j = 0; j < 16; ++j) {
      const float d = load_f16(b + kQ3D) * static_cast<float>(q3_scale(sc, j));
      if (d == 0.f) continue;
      for (int ii = 0; ii < 16; ++ii) {
        const int l = nearest_int(x[16 * j + ii] / d);
        L[16 * j + ii] = static_cast<int8_t>(std::max(-4, std::min(3, l)) + 4);
      }
    }
    uint8_t* hmask = b + kQ3Hmask;
    std::memset(hmask, 0, 32);
    uint8_t low[kQK_K];
    for (int j = 0; j < kQK_K; ++j) {
      int l = L[j];
      if (l > 3) {
        hmask[j % 32] |= static_cast<uint8_t>(1 << (j / 32));
        l -= 4;
      }
      low[j] = static_cast<uint8_t>(l);
    }
    pack_2bit(low, b + kQ3Qs);
  }
}

// ---------------------------------------------------------------- Q4_K / Q5_K
// value = d*sc*q - dmin*m per 32-element sub-block, q 4 bits (Q5_K: plus a
// high bit from qh byte l, bit = sub-block index). Each 32-byte group of qs
// holds two sub-blocks: the low nibbles the first, the high nibbles the second.
void dequant_q4_k(const uint8_t* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, b += kQ4Bytes) {
    const float d = load_f16(b), dmin = load_f16(b + 2);
    for (int j = 0; j < 4; ++j) {
      const uint8_t* q = b + kQ4Qs + 32 * j;
      uint8_t sc, m;
      scale_min_k4(2 * j, b + kQ4Scales, sc, m);
      const float d1 = d * static_cast<float>(sc), m1 = dmin * static_cast<float>(m);
      scale_min_k4(2 * j + 1, b + kQ4Scales, sc, m);
      const float d2 = d * static_cast<float>(sc), m2 = dmin * static_cast<float>(m);
      for (int l = 0; l < 32; ++l) *y++ = d1 * static_cast<float>(q[l] & 0x0f) - m1;
      for (int l = 0; l < 32; ++l) *y++ = d2 * static_cast<float>(q[l] >> 4) - m2;
    }
  }
}

void dequant_q5_k(const uint8_t* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, b += kQ5Bytes) {
    const float d = load_f16(b), dmin = load_f16(b + 2);
    const uint8_t* qh = b + kQ5Qh;
    for (int j = 0; j < 4; ++j) {
      const uint8_t* ql = b + kQ5Qs + 32 * j;
      const int u1 = 1 << (2 * j), u2 = 2 << (2 * j);
      uint8_t sc, m;
      scale_min_k4(2 * j, b + kQ5Scales, sc, m);
      const float d1 = d * static_cast<float>(sc), m1 = dmin * static_cast<float>(m);
      scale_min_k4(2 * j + 1, b + kQ5Scales, sc, m);
      const float d2 = d * static_cast<float>(sc), m2 = dmin * static_cast<float>(m);
      for (int l = 0; l < 32; ++l)
        *y++ = d1 * static_cast<float>((ql[l] & 0x0f) + ((qh[l] & u1) ? 16 : 0)) - m1;
      for (int l = 0; l < 32; ++l)
        *y++ = d2 * static_cast<float>((ql[l] >> 4) + ((qh[l] & u2) ? 16 : 0)) - m2;
    }
  }
}

namespace {

// The shared part of the Q4_K and Q5_K reference quantizers: fills the
// d/dmin/scales header of block b and the levels L (0..nmax) of all 256 elements.
void quant_k_header(const float* x, uint8_t* b, int nmax, float rmin, float rdelta, int nstep, uint8_t* L) {
  uint8_t Laux[32];
  float weights[32], mins[8], scales[8];
  float max_scale = 0, max_min = 0;
  for (int j = 0; j < 8; ++j) {
    const float* xs = x + 32 * j;
    float sum_x2 = 0;
    for (int l = 0; l < 32; ++l) sum_x2 += xs[l] * xs[l];
    const float av_x = std::sqrt(sum_x2 / 32);
    for (int l = 0; l < 32; ++l) weights[l] = av_x + std::fabs(xs[l]);
    scales[j] = make_qkx2_quants(32, nmax, xs, weights, L + 32 * j, &mins[j], Laux, rmin, rdelta, nstep, false);
    if (scales[j] > max_scale) max_scale = scales[j];
    if (mins[j] > max_min) max_min = mins[j];
  }
  const float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
  const float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
  uint8_t* sc = b + kQ4Scales;  // same offset in Q5_K
  for (int j = 0; j < 8; ++j) {
    // ggml narrows to uint8_t before clamping, so a negative level wraps to 63.
    const uint8_t ls = std::min<uint8_t>(63, static_cast<uint8_t>(nearest_int(inv_scale * scales[j])));
    const uint8_t lm = std::min<uint8_t>(63, static_cast<uint8_t>(nearest_int(inv_min * mins[j])));
    pack_scale_min_k4(j, ls, lm, sc);
  }
  store_f16(b, max_scale / 63.f);
  store_f16(b + 2, max_min / 63.f);
  for (int j = 0; j < 8; ++j) {
    uint8_t s, m;
    scale_min_k4(j, sc, s, m);
    const float d = load_f16(b) * static_cast<float>(s);
    if (d == 0.f) continue;
    const float dm = load_f16(b + 2) * static_cast<float>(m);
    for (int ii = 0; ii < 32; ++ii) {
      const int l = nearest_int((x[32 * j + ii] + dm) / d);
      L[32 * j + ii] = static_cast<uint8_t>(std::max(0, std::min(nmax, l)));
    }
  }
}

}  // namespace

void quant_q4_k(const float* x, uint8_t* b, int64_t nb) {
  uint8_t L[kQK_K];
  for (int64_t i = 0; i < nb; ++i, x += kQK_K, b += kQ4Bytes) {
    quant_k_header(x, b, 15, -1.f, 0.1f, 20, L);
    for (int j = 0; j < 4; ++j)
      for (int l = 0; l < 32; ++l)
        b[kQ4Qs + 32 * j + l] = static_cast<uint8_t>(L[64 * j + l] | (L[64 * j + l + 32] << 4));
  }
}

void quant_q5_k(const float* x, uint8_t* b, int64_t nb) {
  uint8_t L[kQK_K];
  for (int64_t i = 0; i < nb; ++i, x += kQK_K, b += kQ5Bytes) {
    quant_k_header(x, b, 31, -0.5f, 0.1f, 15, L);
    uint8_t* qh = b + kQ5Qh;
    std::memset(qh, 0, 32);
    for (int j = 0; j < 4; ++j) {
      for (int l = 0; l < 32; ++l) {
        const int l1 = L[64 * j + l], l2 = L[64 * j + l + 32];
        if (l1 > 15) qh[l] |= static_cast<uint8_t>(1 << (2 * j));
        if (l2 > 15) qh[l] |= static_cast<uint8_t>(2 << (2 * j));
        b[kQ5Qs + 32 * j + l] = static_cast<uint8_t>((l1 & 0x0f) | ((l2 & 0x0f) << 4));
      }
    }
  }
}

// ---------------------------------------------------------------- Q6_K
// value = d*scale*(q-32), 6-bit q: low 4 bits in ql, top 2 in qh, int8 scale
// per 16 elements. In each 128-element half, ql byte l holds elements l (low
// nibble) and l+64 (high); ql byte l+32 holds l+32 and l+96; qh byte l holds
// the top bits of l, l+32, l+64, l+96 in bit pairs 0..3.
void dequant_q6_k(const uint8_t* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, b += kQ6Bytes) {
    const float d = load_f16(b + kQ6D);
    for (int h = 0; h < 2; ++h, y += 128) {
      const uint8_t* ql = b + kQ6Ql + 64 * h;
      const uint8_t* qh = b + kQ6Qh + 32 * h;
      const int8_t* sc = reinterpret_cast<const int8_t*>(b + kQ6Scales) + 8 * h;
      for (int l = 0; l < 32; ++l) {
        const int is = l / 16;
        const int q1 = ((ql[l] & 0x0f) | (((qh[l] >> 0) & 3) << 4)) - 32;
        const int q2 = ((ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        y[l] = d * static_cast<float>(sc[is]) * static_cast<float>(q1);
        y[l + 32] = d * static_cast<float>(sc[is + 2]) * static_cast<float>(q2);
        y[l + 64] = d * static_cast<float>(sc[is + 4]) * static_cast<float>(q3);
        y[l + 96] = d * static_cast<float>(sc[is + 6]) * static_cast<float>(q4);
      }
    }
  }
}

void quant_q6_k(const float* x, uint8_t* b, int64_t nb) {
  int8_t L[kQK_K];
  float scales[16];
  for (int64_t i = 0; i < nb; ++i, x += kQK_K, b += kQ6Bytes) {
    float max_scale = 0, max_abs_scale = 0;
    for (int ib = 0; ib < 16; ++ib) {
      scales[ib] = make_qx_quants(16, 32, x + 16 * ib, L + 16 * ib);
      const float a = std::fabs(scales[ib]);
      if (a > max_abs_scale) {
        max_abs_scale = a;
        max_scale = scales[ib];
      }
    }
    if (max_abs_scale < kGroupMaxEps) {
      std::memset(b, 0, kQ6Bytes);
      continue;
    }
    const float iscale = -128.f / max_scale;
    store_f16(b + kQ6D, 1 / iscale);
    int8_t* sc = reinterpret_cast<int8_t*>(b + kQ6Scales);
    for (int ib = 0; ib < 16; ++ib) sc[ib] = static_cast<int8_t>(std::min(127, nearest_int(iscale * scales[ib])));
    for (int j = 0; j < 16; ++j) {
      const float d = load_f16(b + kQ6D) * static_cast<float>(sc[j]);
      if (d == 0.f) continue;
      for (int ii = 0; ii < 16; ++ii) {
        const int l = nearest_int(x[16 * j + ii] / d);
        L[16 * j + ii] = static_cast<int8_t>(std::max(-32, std::min(31, l)) + 32);
      }
    }
    for (int h = 0; h < 2; ++h) {
      const int8_t* l4 = L + 128 * h;
      uint8_t* ql = b + kQ6Ql + 64 * h;
      uint8_t* qh = b + kQ6Qh + 32 * h;
      for (int l = 0; l < 32; ++l) {
        ql[l] = static_cast<uint8_t>((l4[l] & 0x0f) | ((l4[l + 64] & 0x0f) << 4));
        ql[l + 32] = static_cast<uint8_t>((l4[l + 32] & 0x0f) | ((l4[l + 96] & 0x0f) << 4));
        qh[l] = static_cast<uint8_t>((l4[l] >> 4) | ((l4[l + 32] >> 4) << 2) | ((l4[l + 64] >> 4) << 4) |
                                     ((l4[l + 96] >> 4) << 6));
      }
    }
  }
}

}  // namespace tandem::quant_detail

// Weight formats on the device: where a matrix's parts live (kernels.h
// describes the layouts), the exact dequantization of 32 elements (the CPU's
// expressions in quant/quant*.cpp, so that values match bit for bit under
// --fmad=false), and the per-lane units of the matrix-vector products.
//
// A GEMV unit is the slice of a weight row one lane handles per step: one
// aligned 16-byte load of quants (plus its scales) and the matching
// activations. Quantized units compute integer partial sums that the lanes of
// one block combine exactly (shuffles), so each block's integer sum is the
// CPU's (kernels/dot_ref.cpp); the block's float contribution is then added
// by the group's first lane.
#pragma once

#include "cuda/device_common.cuh"

namespace tandem::cuda {

__host__ __device__ inline int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// Bytes of one row of the main (q) array.
__host__ __device__ inline int64_t q_row_bytes(GgmlType t, int64_t cols) {
  switch (t) {
    case GgmlType::Q8_0: return cols;
    case GgmlType::Q4_0:
    case GgmlType::Q5_0:
    case GgmlType::Q6_K: return cols / 2;
    case GgmlType::Q4_K: return cols / 256 * 144;
    case GgmlType::Q5_K: return cols / 256 * 176;
    case GgmlType::F16:
    case GgmlType::BF16: return round_up(cols * 2, 16);
    default: return round_up(cols * 4, 16);  // F32
  }
}

__device__ __forceinline__ uint32_t byte_of(const uint4& v, int i) {
  const uint32_t w = i < 4 ? v.x : i < 8 ? v.y : i < 12 ? v.z : v.w;
  return (w >> (8 * (i & 3))) & 0xffu;
}

// q4_K / q5_K: the 6-bit scale and min of sub-block j from the 12 scale bytes
// (bytes 4..15 of the header), as quant/quant_blocks.h's k4_scale_min.
__device__ __forceinline__ void k4_scale_min_dev(int j, const uint4& hdr, int& sc, int& m) {
  auto q = [&](int i) { return static_cast<int>(byte_of(hdr, 4 + i)); };
  if (j < 4) {
    sc = q(j) & 63;
    m = q(j + 4) & 63;
  } else {
    sc = (q(j + 4) & 0xF) | ((q(j - 4) >> 6) << 4);
    m = (q(j + 4) >> 4) | ((q(j) >> 6) << 4);
  }
}

// ---- Exact dequantization of 32 consecutive elements (sub-block `sb`:
// elements [32 sb, 32 sb + 32) of the row; for plain types fewer at the row's
// end: elements >= cols are not written).
__device__ inline void dequant32(const DevMatrix& m, int64_t row, int64_t sb, float* y) {
  const int64_t ld = q_row_bytes(m.type, m.cols);
  const uint8_t* qrow = m.q + row * ld;
  switch (m.type) {
    case GgmlType::F32: {
      const float* p = reinterpret_cast<const float*>(qrow);
#pragma unroll
      for (int i = 0; i < 32; ++i)
        if (sb * 32 + i < m.cols) y[i] = p[sb * 32 + i];
      return;
    }
    case GgmlType::F16: {
      const uint16_t* p = reinterpret_cast<const uint16_t*>(qrow);
#pragma unroll
      for (int i = 0; i < 32; ++i)
        if (sb * 32 + i < m.cols) y[i] = f16_bits_to_float(p[sb * 32 + i]);
      return;
    }
    case GgmlType::BF16: {
      const uint16_t* p = reinterpret_cast<const uint16_t*>(qrow);
#pragma unroll
      for (int i = 0; i < 32; ++i)
        if (sb * 32 + i < m.cols) y[i] = bf16_bits_to_float(p[sb * 32 + i]);
      return;
    }
    case GgmlType::Q8_0: {
      const float d = f16_bits_to_float(m.d[row * (m.cols / 32) + sb]);
      const int8_t* q = reinterpret_cast<const int8_t*>(qrow) + sb * 32;
      for (int i = 0; i < 32; ++i) y[i] = __fmul_rn(static_cast<float>(q[i]), d);
      return;
    }
    case GgmlType::Q4_0: {
      const float d = f16_bits_to_float(m.d[row * (m.cols / 32) + sb]);
      const uint8_t* q = qrow + sb * 16;
      for (int j = 0; j < 16; ++j) {
        y[j] = __fmul_rn(static_cast<float>((q[j] & 0x0f) - 8), d);
        y[j + 16] = __fmul_rn(static_cast<float>((q[j] >> 4) - 8), d);
      }
      return;
    }
    case GgmlType::Q5_0: {
      const float d = f16_bits_to_float(m.d[row * (m.cols / 32) + sb]);
      const uint8_t* q = qrow + sb * 16;
      const uint32_t qh = reinterpret_cast<const uint32_t*>(m.qh)[row * (m.cols / 32) + sb];
      for (int j = 0; j < 16; ++j) {
        const int lo = (q[j] & 0x0f) | static_cast<int>(((qh >> j) & 1) << 4);
        const int hi = (q[j] >> 4) | static_cast<int>(((qh >> (j + 16)) & 1) << 4);
        y[j] = __fmul_rn(static_cast<float>(lo - 16), d);
        y[j + 16] = __fmul_rn(static_cast<float>(hi - 16), d);
      }
      return;
    }
    case GgmlType::Q4_K:
    case GgmlType::Q5_K: {
      const bool five = m.type == GgmlType::Q5_K;
      const uint8_t* b = qrow + (sb / 8) * (five ? 176 : 144);
      const int s = static_cast<int>(sb % 8);
      const uint4 hdr = *reinterpret_cast<const uint4*>(b);
      const float d = f16_bits_to_float(static_cast<uint16_t>(hdr.x & 0xffff));
      const float dmin = f16_bits_to_float(static_cast<uint16_t>(hdr.x >> 16));
      int sc, mn;
      k4_scale_min_dev(s, hdr, sc, mn);
      const float d1 = __fmul_rn(d, static_cast<float>(sc)), m1 = __fmul_rn(dmin, static_cast<float>(mn));
      const uint8_t* q = b + (five ? 48 : 16) + 32 * (s / 2);
      const int shift = 4 * (s % 2);
      for (int l = 0; l < 32; ++l) {
        int v = (q[l] >> shift) & 0x0f;
        if (five) v += ((b[16 + l] >> s) & 1) ? 16 : 0;
        y[l] = __fsub_rn(__fmul_rn(d1, static_cast<float>(v)), m1);
      }
      return;
    }
    case GgmlType::Q6_K: {
      const int64_t nb = m.cols / 256, blk = sb / 8;
      const int j = static_cast<int>(sb % 8), h = j / 4, k = j % 4;
      const float d = f16_bits_to_float(m.d[row * nb + blk]);
      const uint8_t* ql = qrow + blk * 128 + 64 * h + 32 * (k % 2);
      const uint8_t* qh = m.qh + row * (m.cols / 4) + blk * 64 + 32 * h;
      const int8_t* scl = m.sc + row * (m.cols / 16) + blk * 16 + 8 * h + 2 * k;
      for (int l = 0; l < 32; ++l) {
        const int q = (((ql[l] >> (4 * (k / 2))) & 0x0f) | (((qh[l] >> (2 * k)) & 3) << 4)) - 32;
        y[l] = __fmul_rn(__fmul_rn(d, static_cast<float>(scl[l / 16])), static_cast<float>(q));
      }
      return;
    }
    default:
      return;
  }
}

// ---- GEMV units ----
// Each unit type provides:
//   kElems   elements per unit; kGroup lanes per block (their integer sums
//            are combined); kUnroll units a lane loads before computing.
//   Raw      the loaded weight bytes of a unit; load(m, row, u).
//   accum(raw, m, row, u, x, xrow, valid, lane, acc): adds the unit's share of
//            row `xrow`'s dot product to acc (executes its shuffles on every
//            lane, valid or not).

__device__ __forceinline__ int dp4a_16(const uint4& w, const uint4& a, int c) {
  c = __dp4a(static_cast<int>(w.x), static_cast<int>(a.x), c);
  c = __dp4a(static_cast<int>(w.y), static_cast<int>(a.y), c);
  c = __dp4a(static_cast<int>(w.z), static_cast<int>(a.z), c);
  return __dp4a(static_cast<int>(w.w), static_cast<int>(a.w), c);
}
__device__ __forceinline__ uint4 map4(const uint4& v, uint32_t (*f)(uint32_t, int), int arg) {
  return make_uint4(f(v.x, arg), f(v.y, arg), f(v.z, arg), f(v.w, arg));
}

struct UnitQ8_0 {
  static constexpr int kElems = 16, kGroup = 2, kUnroll = 4;
  struct Raw {
    uint4 q;
    uint16_t d;
  };
  __device__ static Raw load(const DevMatrix& m, int64_t row, int64_t u) {
    Raw r;
    r.q = ldg16(m.q + row * m.cols + u * 16);
    r.d = __ldg(m.d + row * (m.cols / 32) + u / 2);
    return r;
  }
  __device__ static void accum(const Raw& w, const DevMatrix& m, int64_t row, int64_t u, const DevActs& x,
                               int64_t xrow, bool valid, int lane, float& acc) {
    int isum = 0;
    if (valid) isum = dp4a_16(w.q, ldg16(static_cast<const int8_t*>(x.q) + xrow * x.ld + u * 16), 0);
    isum = group_sum<2>(isum);
    if (valid && (lane & 1) == 0) {
      const float da = __ldg(x.d + xrow * (x.ld / 32) + u / 2);
      acc = fmaf(__fmul_rn(f16_bits_to_float(w.d), da), static_cast<float>(isum), acc);
    }
  }
};

__device__ __forceinline__ uint32_t lo_nib(uint32_t v, int) { return v & 0x0F0F0F0Fu; }
__device__ __forceinline__ uint32_t hi_nib(uint32_t v, int) { return (v >> 4) & 0x0F0F0F0Fu; }
// Bits 0..3 of b to bit 4 of bytes 0..3.
__device__ __forceinline__ uint32_t expand4(uint32_t b) {
  return ((b & 1u) << 4) | ((b & 2u) << 11) | ((b & 4u) << 18) | ((b & 8u) << 25);
}

struct UnitQ4_0 {
  static constexpr int kElems = 32, kGroup = 1, kUnroll = 4;
  struct Raw {
    uint4 q;
    uint16_t d;
  };
  __device__ static Raw load(const DevMatrix& m, int64_t row, int64_t u) {
    Raw r;
    r.q = ldg16(m.q + row * (m.cols / 2) + u * 16);
    r.d = __ldg(m.d + row * (m.cols / 32) + u);
    return r;
  }
  __device__ static void accum(const Raw& w, const DevMatrix& m, int64_t row, int64_t u, const DevActs& x,
                               int64_t xrow, bool valid, int lane, float& acc) {
    if (!valid) return;
    const int8_t* a = static_cast<const int8_t*>(x.q) + xrow * x.ld + u * 32;
    int isum = dp4a_16(map4(w.q, lo_nib, 0), ldg16(a), 0);
    isum = dp4a_16(map4(w.q, hi_nib, 0), ldg16(a + 16), isum);
    isum -= 8 * static_cast<int>(__ldg(x.sums + xrow * (x.ld / 32) + u));
    const float da = __ldg(x.d + xrow * (x.ld / 32) + u);
    acc = fmaf(__fmul_rn(f16_bits_to_float(w.d), da), static_cast<float>(isum), acc);
  }
};

struct UnitQ5_0 {
  static constexpr int kElems = 32, kGroup = 1, kUnroll = 4;
  struct Raw {
    uint4 q;
    uint32_t qh;
    uint16_t d;
  };
  __device__ static Raw load(const DevMatrix& m, int64_t row, int64_t u) {
    Raw r;
    r.q = ldg16(m.q + row * (m.cols / 2) + u * 16);
    r.qh = __ldg(reinterpret_cast<const uint32_t*>(m.qh) + row * (m.cols / 32) + u);
    r.d = __ldg(m.d + row * (m.cols / 32) + u);
    return r;
  }
  __device__ static void accum(const Raw& w, const DevMatrix& m, int64_t row, int64_t u, const DevActs& x,
                               int64_t xrow, bool valid, int lane, float& acc) {
    if (!valid) return;
    const int8_t* a = static_cast<const int8_t*>(x.q) + xrow * x.ld + u * 32;
    const uint4 lo = make_uint4(lo_nib(w.q.x, 0) | expand4(w.qh), lo_nib(w.q.y, 0) | expand4(w.qh >> 4),
                                lo_nib(w.q.z, 0) | expand4(w.qh >> 8), lo_nib(w.q.w, 0) | expand4(w.qh >> 12));
    const uint4 hi = make_uint4(hi_nib(w.q.x, 0) | expand4(w.qh >> 16), hi_nib(w.q.y, 0) | expand4(w.qh >> 20),
                                hi_nib(w.q.z, 0) | expand4(w.qh >> 24), hi_nib(w.q.w, 0) | expand4(w.qh >> 28));
    int isum = dp4a_16(lo, ldg16(a), 0);
    isum = dp4a_16(hi, ldg16(a + 16), isum);
    isum -= 16 * static_cast<int>(__ldg(x.sums + xrow * (x.ld / 32) + u));
    const float da = __ldg(x.d + xrow * (x.ld / 32) + u);
    acc = fmaf(__fmul_rn(f16_bits_to_float(w.d), da), static_cast<float>(isum), acc);
  }
};

// q4_K and q5_K as stored: unit c of a super-block is its qs bytes
// [16c, 16c + 16): the low nibbles are elements 64g + 16(c%2) + [0, 16) of
// sub-block 2g (g = c/2), the high nibbles the same positions of sub-block 2g+1.
template <bool kFive>
struct UnitK4 {
  static constexpr int kElems = 32, kGroup = 8, kUnroll = 2;
  static constexpr int kBlockBytes = kFive ? 176 : 144, kQsOff = kFive ? 48 : 16;
  struct Raw {
    uint4 hdr, q, qh;
  };
  __device__ static Raw load(const DevMatrix& m, int64_t row, int64_t u) {
    Raw r;
    const uint8_t* b = m.q + row * (m.cols / 256 * kBlockBytes) + (u / 8) * kBlockBytes;
    const int c = static_cast<int>(u % 8);
    r.hdr = ldg16(b);
    r.q = ldg16(b + kQsOff + 16 * c);
    if constexpr (kFive) r.qh = ldg16(b + 16 + 16 * (c % 2));
    else r.qh = make_uint4(0, 0, 0, 0);
    return r;
  }
  __device__ static uint32_t fifth(uint32_t qh, int s) { return ((qh >> s) & 0x01010101u) << 4; }
  __device__ static void accum(const Raw& w, const DevMatrix& m, int64_t row, int64_t u, const DevActs& x,
                               int64_t xrow, bool valid, int lane, float& acc) {
    const int c = static_cast<int>(u % 8), g = c / 2, s0 = 2 * g, s1 = s0 + 1;
    const int64_t sbk = u / 8;
    int isum = 0, msum = 0;
    if (valid) {
      uint4 lo = map4(w.q, lo_nib, 0), hi = map4(w.q, hi_nib, 0);
      if constexpr (kFive) {
        lo = make_uint4(lo.x | fifth(w.qh.x, s0), lo.y | fifth(w.qh.y, s0), lo.z | fifth(w.qh.z, s0),
                        lo.w | fifth(w.qh.w, s0));
        hi = make_uint4(hi.x | fifth(w.qh.x, s1), hi.y | fifth(w.qh.y, s1), hi.z | fifth(w.qh.z, s1),
                        hi.w | fifth(w.qh.w, s1));
      }
      const int8_t* a = static_cast<const int8_t*>(x.q) + xrow * x.ld + sbk * 256 + 64 * g + 16 * (c % 2);
      int sc0, m0, sc1, m1;
      k4_scale_min_dev(s0, w.hdr, sc0, m0);
      k4_scale_min_dev(s1, w.hdr, sc1, m1);
      isum = sc0 * dp4a_16(lo, ldg16(a), 0) + sc1 * dp4a_16(hi, ldg16(a + 32), 0);
      const int16_t* bs = x.sums + xrow * (x.ld / 16) + sbk * 16;
      msum = m0 * static_cast<int>(__ldg(bs + 4 * g + c % 2)) + m1 * static_cast<int>(__ldg(bs + 4 * g + 2 + c % 2));
    }
    isum = group_sum<8>(isum);
    msum = group_sum<8>(msum);
    if (valid && c == 0) {
      const float d = f16_bits_to_float(static_cast<uint16_t>(w.hdr.x & 0xffff));
      const float dmin = f16_bits_to_float(static_cast<uint16_t>(w.hdr.x >> 16));
      const float da = __ldg(x.d + xrow * (x.ld / 256) + sbk);
      // The CPU's y.d * (d * isum - dmin * msum), then added.
      acc = __fadd_rn(acc, __fmul_rn(da, __fsub_rn(__fmul_rn(d, static_cast<float>(isum)),
                                                    __fmul_rn(dmin, static_cast<float>(msum)))));
    }
  }
};

// q6_K split: unit j of a super-block covers elements [16j, 16j + 16):
// h = j/8, k = (j%8)/2, half = j%2; low nibbles in ql[64h + 32(k%2) + 16half ..]
// (shifted by 4(k/2)), top bits in qh[32h + 16half ..] >> 2k, scale sc[j].
struct UnitQ6K {
  static constexpr int kElems = 16, kGroup = 16, kUnroll = 2;
  struct Raw {
    uint4 ql, qh;
    int sc;
    uint16_t d;
  };
  __device__ static Raw load(const DevMatrix& m, int64_t row, int64_t u) {
    Raw r;
    const int64_t sbk = u / 16;
    const int j = static_cast<int>(u % 16), h = j / 8, k = (j % 8) / 2, half = j % 2;
    r.ql = ldg16(m.q + row * (m.cols / 2) + sbk * 128 + 64 * h + 32 * (k % 2) + 16 * half);
    r.qh = ldg16(m.qh + row * (m.cols / 4) + sbk * 64 + 32 * h + 16 * half);
    r.sc = __ldg(m.sc + row * (m.cols / 16) + u);
    r.d = __ldg(m.d + row * (m.cols / 256) + sbk);
    return r;
  }
  __device__ static void accum(const Raw& w, const DevMatrix& m, int64_t row, int64_t u, const DevActs& x,
                               int64_t xrow, bool valid, int lane, float& acc) {
    const int j = static_cast<int>(u % 16), k = (j % 8) / 2;
    int isum = 0;
    if (valid) {
      const int shift = 4 * (k / 2);
      auto val = [&](uint32_t l, uint32_t h) { return ((l >> shift) & 0x0F0F0F0Fu) | (((h >> (2 * k)) & 0x03030303u) << 4); };
      const uint4 v = make_uint4(val(w.ql.x, w.qh.x), val(w.ql.y, w.qh.y), val(w.ql.z, w.qh.z), val(w.ql.w, w.qh.w));
      const int8_t* a = static_cast<const int8_t*>(x.q) + xrow * x.ld + u * 16;
      const int sub = dp4a_16(v, ldg16(a), 0) - 32 * static_cast<int>(__ldg(x.sums + xrow * (x.ld / 16) + u));
      isum = w.sc * sub;
    }
    isum = group_sum<16>(isum);
    if (valid && j == 0) {
      const float da = __ldg(x.d + xrow * (x.ld / 256) + u / 16);
      acc = __fadd_rn(acc, __fmul_rn(__fmul_rn(f16_bits_to_float(w.d), da), static_cast<float>(isum)));
    }
  }
};

// f16 / bf16 / f32 rows as stored (rows padded to 16 bytes): 16 bytes of
// weights against the same elements of the activations, in f32 FMAs. The
// last unit of a row may reach past cols: those elements are skipped.
template <GgmlType kType>
struct UnitFloat {
  static constexpr int kEsize = kType == GgmlType::F32 ? 4 : 2;
  static constexpr int kElems = 16 / kEsize, kGroup = 1, kUnroll = 4;
  struct Raw {
    uint4 q;
  };
  __device__ static Raw load(const DevMatrix& m, int64_t row, int64_t u) {
    return {ldg16(m.q + row * q_row_bytes(kType, m.cols) + u * 16)};
  }
  __device__ static float value(const uint4& v, int i) {
    const uint32_t word = i * kEsize / 4 == 0 ? v.x : i * kEsize / 4 == 1 ? v.y : i * kEsize / 4 == 2 ? v.z : v.w;
    if constexpr (kType == GgmlType::F32) return __uint_as_float(word);
    const uint16_t h = static_cast<uint16_t>((i & 1) ? word >> 16 : word & 0xffff);
    if constexpr (kType == GgmlType::F16) return f16_bits_to_float(h);
    return bf16_bits_to_float(h);
  }
  __device__ static void accum(const Raw& w, const DevMatrix& m, int64_t row, int64_t u, const DevActs& x,
                               int64_t xrow, bool valid, int lane, float& acc) {
    if (!valid) return;
    const uint4 a = ldg16(static_cast<const uint8_t*>(x.q) + (xrow * x.ld + u * kElems) * kEsize);
    const int64_t left = m.cols - u * kElems;
#pragma unroll
    for (int i = 0; i < kElems; ++i)
      if (i < left) acc = fmaf(value(w.q, i), value(a, i), acc);
  }
};

}  // namespace tandem::cuda

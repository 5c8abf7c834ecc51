// Scalar reference of the tiled kernels: the packers that define the panel
// layouts, and kernels that spell out each output's float chain (product_kernels.h)
// with std::fma, so every SIMD level must match them bit for bit.
#include <cmath>
#include <cstring>
#include <type_traits>

#include "quant/quant_blocks.h"
#include "quant/quant.h"
#include "kernels/kernel_builds.h"
#include "kernels/product_kernels.h"
#include "kernels/layout_panels.h"

namespace tandem::gemm_detail {
namespace {

template <typename T>
T* at(uint8_t* p, size_t off) {
  return reinterpret_cast<T*>(p + off);
}
template <typename T>
const T* at(const uint8_t* p, size_t off) {
  return reinterpret_cast<const T*>(p + off);
}

// Byte of element k (0..255 or 0..31) of lane n in a panel's quant area.
inline size_t qpos(int k, int n) { return static_cast<size_t>((k / 4) * 64 + n * 4 + k % 4); }

// Signed quants and scale of one q4_0/q5_0/q8_0 block (its f16 d) or mxfp4
// block (its code values, kMxfp4Values, and 2^(e - 128)).
float q32_block(GgmlType t, const uint8_t* blk, int8_t q[kQK]) {
  switch (t) {
    case GgmlType::MXFP4: {
      const auto& x = *reinterpret_cast<const BlockMXFP4*>(blk);
      for (int j = 0; j < kQK / 2; ++j) {
        q[j] = kMxfp4Values[x.qs[j] & 0xF];
        q[j + kQK / 2] = kMxfp4Values[x.qs[j] >> 4];
      }
      return e8m0_to_f32_half(x.e);
    }
    case GgmlType::Q4_0: {
      const auto& x = *reinterpret_cast<const BlockQ4_0*>(blk);
      for (int j = 0; j < kQK / 2; ++j) {
        q[j] = static_cast<int8_t>((x.qs[j] & 0xF) - 8);
        q[j + kQK / 2] = static_cast<int8_t>((x.qs[j] >> 4) - 8);
      }
      return f16_to_f32(x.d);
    }
    case GgmlType::Q5_0: {
      const auto& x = *reinterpret_cast<const BlockQ5_0*>(blk);
      uint32_t qh;
      std::memcpy(&qh, x.qh, 4);
      for (int j = 0; j < kQK / 2; ++j) {
        q[j] = static_cast<int8_t>(((x.qs[j] & 0xF) | (((qh >> j) & 1) << 4)) - 16);
        q[j + kQK / 2] = static_cast<int8_t>(((x.qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4)) - 16);
      }
      return f16_to_f32(x.d);
    }
    default: {
      const auto& x = *reinterpret_cast<const BlockQ8_0*>(blk);
      std::memcpy(q, x.qs, kQK);
      return f16_to_f32(x.d);
    }
  }
}

// Activation quant of element k (of the current block) of slot s.
inline int8_t act_q(const int8_t* blk, int64_t S, int k, int s) { return blk[((k / 4) * S + s) * 4 + k % 4]; }

void run_q32_body(const uint8_t* panel, int64_t nblk, const GemmActs& A, int64_t G, int R, int64_t b0, float* acc) {
  const int32_t off = q32_offset(A.wtype);
  const int64_t S = A.slots;
  for (int64_t i = 0; i < nblk; ++i, panel += Q32Panel::kBytes) {
    const int64_t b = b0 + i;
    float d[kGemmTile];
    for (int n = 0; n < kGemmTile; ++n) {
      const uint16_t h = at<uint16_t>(panel, Q32Panel::kD)[n];
      d[n] = q32_bf16_scales(A.wtype) ? bf16_to_f32(h) : f16_to_f32(h);
    }
    const uint8_t* q = panel + Q32Panel::kQ;
    const int8_t* a = A.qgroup(G) + b * kQK * S;
    for (int s = 0; s < R; ++s) {
      const float da = A.sgroup(G)[b * S + s];
      for (int n = 0; n < kGemmTile; ++n) {
        int32_t sum = 0;
        for (int k = 0; k < kQK; ++k) sum += (q[qpos(k, n)] - off) * act_q(a, S, k, s);
        float& y = acc[s * kGemmTile + n];
        y = std::fma(static_cast<float>(sum), d[n] * da, y);
      }
    }
  }
}

// q4_K / q5_K (kK6 false: 8 sub-blocks of 32, the quants as stored, and the
// mins term) and q6_K (16 groups of 16, the quants stored + 32).
template <bool kK6>
void run_kq_body(const uint8_t* panel, int64_t nblk, const GemmActs& A, int64_t G, int R, int64_t b0, float* acc) {
  using P = std::conditional_t<kK6, K6Panel, K4Panel>;
  constexpr int kSub = kK6 ? 16 : 8, kLen = kQKK / kSub, kOffset = kK6 ? 32 : 0;
  const int64_t S = A.slots;
  for (int64_t i = 0; i < nblk; ++i, panel += P::kBytes) {
    const int64_t b = b0 + i;
    const float* d = at<float>(panel, P::kD);
    const int32_t* sc = at<int32_t>(panel, P::kSc);
    const uint8_t* q = panel + P::kQ;
    const int8_t* a = A.qgroup(G) + b * kQKK * S;
    for (int s = 0; s < R; ++s) {
      const float da = A.sgroup(G)[b * S + s];
      int16_t bp[8] = {};  // q4_K / q5_K: sums of the activation's 8 sub-blocks
      if constexpr (!kK6)
        for (int e = 0; e < 4; ++e) std::memcpy(bp + 2 * e, &A.egroup(G)[(b * 4 + e) * S + s], 4);
      for (int n = 0; n < kGemmTile; ++n) {
        int32_t isum = 0, msum = 0;
        for (int j = 0; j < kSub; ++j) {
          int32_t sum = 0;
          for (int k = kLen * j; k < kLen * j + kLen; ++k) sum += (q[qpos(k, n)] - kOffset) * act_q(a, S, k, s);
          isum += sc[j * kGemmTile + n] * sum;
          if constexpr (!kK6)
            msum += at<int16_t>(panel, K4Panel::kMins)[((j / 2) * kGemmTile + n) * 2 + j % 2] * bp[j];
        }
        float& y = acc[s * kGemmTile + n];
        y = std::fma(static_cast<float>(isum), d[n] * da, y);
        if constexpr (!kK6) y = std::fma(-static_cast<float>(msum), at<float>(panel, K4Panel::kDmin)[n] * da, y);
      }
    }
  }
}

// The packed kernels' GemmAcc contract around the bodies above, which keep
// the chains in a dense [slot][lane] array.
template <void (*Body)(const uint8_t*, int64_t, const GemmActs&, int64_t, int, int64_t, float*)>
void run_packed(const uint8_t* panel, int64_t nblk, const GemmActs& A, int64_t G, int R, int64_t b0,
                const GemmAcc& acc) {
  float chain[kGemmMaxRows * kGemmTile] = {};
  if (acc.in != nullptr) std::memcpy(chain, acc.in, sizeof(float) * R * kGemmTile);
  Body(panel, nblk, A, G, R, b0, chain);
  for (int s = 0; s < R; ++s) std::memcpy(acc.out + s * acc.ld_out, chain + s * kGemmTile, sizeof(float) * kGemmTile);
}

// Row-wise reference: the same chains, straight from the stored blocks.

void rows_q32(const WeightMatrix& W, int64_t o0, int64_t o1, const GemmActs& A, int64_t r0, int64_t r1, float* y,
              int64_t ldy) {
  const size_t bb = type_traits(W.type).block_bytes;
  for (int64_t o = o0; o < o1; ++o)
    for (int64_t r = r0; r < r1; ++r) {
      const int8_t* a = A.qgroup(r);
      float acc = 0.0f;
      for (int64_t b = 0; b < A.nb; ++b) {
        int8_t q[kQK];
        const float d = q32_block(W.type, W.row(o) + b * bb, q);
        int32_t sum = 0;
        for (int k = 0; k < kQK; ++k) sum += q[k] * a[b * kQK + k];
        acc = std::fma(static_cast<float>(sum), d * A.sgroup(r)[b], acc);
      }
      y[r * ldy + o] = acc;
    }
}

void rows_k4(const WeightMatrix& W, int64_t o0, int64_t o1, const GemmActs& A, int64_t r0, int64_t r1, float* y,
             int64_t ldy) {
  const bool q5 = W.type == GgmlType::Q5_K;
  for (int64_t o = o0; o < o1; ++o)
    for (int64_t r = r0; r < r1; ++r) {
      float acc = 0.0f;
      for (int64_t b = 0; b < A.nb; ++b) {
        const BlockQ5K* x5 = q5 ? reinterpret_cast<const BlockQ5K*>(W.row(o)) + b : nullptr;
        const BlockQ4K* x4 = q5 ? nullptr : reinterpret_cast<const BlockQ4K*>(W.row(o)) + b;
        const uint8_t* scales = q5 ? x5->scales : x4->scales;
        const uint8_t* qs = q5 ? x5->qs : x4->qs;
        const int8_t* a = A.qgroup(r) + b * kQKK;
        int16_t bp[8];
        std::memcpy(bp, A.egroup(r) + b * 4, sizeof(bp));
        int32_t isum = 0, msum = 0;
        for (int j = 0; j < 8; ++j) {
          uint8_t sc, m;
          k4_scale_min(j, scales, &sc, &m);
          int32_t sum = 0;
          for (int l = 0; l < 32; ++l) {
            int v = (qs[(j / 2) * 32 + l] >> (4 * (j % 2))) & 0xF;
            if (q5) v |= ((x5->qh[l] >> j) & 1) << 4;
            sum += v * a[32 * j + l];
          }
          isum += sc * sum;
          msum += m * bp[j];
        }
        const float da = A.sgroup(r)[b];
        acc = std::fma(static_cast<float>(isum), f16_to_f32(q5 ? x5->d : x4->d) * da, acc);
        acc = std::fma(-static_cast<float>(msum), f16_to_f32(q5 ? x5->dmin : x4->dmin) * da, acc);
      }
      y[r * ldy + o] = acc;
    }
}

void rows_k6(const WeightMatrix& W, int64_t o0, int64_t o1, const GemmActs& A, int64_t r0, int64_t r1, float* y,
             int64_t ldy) {
  for (int64_t o = o0; o < o1; ++o)
    for (int64_t r = r0; r < r1; ++r) {
      float acc = 0.0f;
      for (int64_t b = 0; b < A.nb; ++b) {
        const BlockQ6K& x = reinterpret_cast<const BlockQ6K*>(W.row(o))[b];
        const int8_t* a = A.qgroup(r) + b * kQKK;
        int32_t isum = 0;
        for (int j = 0; j < 16; ++j) {
          int32_t sum = 0;
          for (int k = 16 * j; k < 16 * j + 16; ++k) {
            const int h = k / 128, quarter = (k % 128) / 32, l = k % 32;
            const int lo = (x.ql[64 * h + 32 * (quarter % 2) + l] >> (4 * (quarter / 2))) & 0xF;
            const int hi = (x.qh[32 * h + l] >> (2 * quarter)) & 3;
            sum += ((lo | (hi << 4)) - 32) * a[k];
          }
          isum += x.scales[j] * sum;
        }
        acc = std::fma(static_cast<float>(isum), f16_to_f32(x.d) * A.sgroup(r)[b], acc);
      }
      y[r * ldy + o] = acc;
    }
}

float weight_value(GgmlType t, const uint8_t* row, int64_t k) {
  if (t == GgmlType::F32) {
    float v;
    std::memcpy(&v, row + 4 * k, 4);
    return v;
  }
  uint16_t h;
  std::memcpy(&h, row + 2 * k, 2);
  return t == GgmlType::F16 ? f16_to_f32(h) : bf16_to_f32(h);
}

void rows_float(const WeightMatrix& W, int64_t o0, int64_t o1, const GemmActs& A, int64_t r0, int64_t r1, float* y,
                int64_t ldy) {
  for (int64_t o = o0; o < o1; ++o)
    for (int64_t r = r0; r < r1; ++r) {
      const float* a = A.fgroup(r);
      float p[16] = {};
      for (int64_t k = 0; k < A.cols; ++k) p[k % 16] = std::fma(weight_value(W.type, W.row(o), k), a[k], p[k % 16]);
      y[r * ldy + o] = reduce16(p);
    }
}

}  // namespace

int32_t q32_offset(GgmlType w) {
  switch (w) {
    case GgmlType::Q4_0: return 8;
    case GgmlType::Q5_0: return 16;
    case GgmlType::MXFP4: return 12;
    default: return 128;
  }
}

void pack_q32_ref(const WeightMatrix& W, int64_t o0, int64_t b0, int64_t b1, uint8_t* panel) {
  const size_t bb = type_traits(W.type).block_bytes;
  const int32_t off = q32_offset(W.type);
  for (int64_t b = b0; b < b1; ++b, panel += Q32Panel::kBytes) {
    std::memset(panel, 0, Q32Panel::kBytes);
    uint8_t* q = panel + Q32Panel::kQ;
    for (int n = 0; n < kGemmTile && o0 + n < W.rows; ++n) {
      int8_t v[kQK];
      const uint8_t* blk = W.row(o0 + n) + b * bb;
      q32_block(W.type, blk, v);
      const uint16_t h = q32_panel_scale(W.type, blk);
      std::memcpy(panel + Q32Panel::kD + 2 * n, &h, 2);
      for (int k = 0; k < kQK; ++k) q[qpos(k, n)] = static_cast<uint8_t>(v[k] + off);
    }
  }
}

void pack_k4_ref(const WeightMatrix& W, int64_t o0, int64_t b0, int64_t b1, uint8_t* panel) {
  const bool q5 = W.type == GgmlType::Q5_K;
  for (int64_t b = b0; b < b1; ++b, panel += K4Panel::kBytes) {
    std::memset(panel, 0, K4Panel::kBytes);
    for (int n = 0; n < kGemmTile && o0 + n < W.rows; ++n) {
      // q4_K and q5_K share d, dmin, scales and qs; q5_K adds qh.
      const uint8_t* row = W.row(o0 + n);
      const BlockQ5K* x5 = q5 ? reinterpret_cast<const BlockQ5K*>(row) + b : nullptr;
      const BlockQ4K* x4 = q5 ? nullptr : reinterpret_cast<const BlockQ4K*>(row) + b;
      const uint16_t d = q5 ? x5->d : x4->d, dmin = q5 ? x5->dmin : x4->dmin;
      const uint8_t* scales = q5 ? x5->scales : x4->scales;
      const uint8_t* qs = q5 ? x5->qs : x4->qs;
      at<float>(panel, K4Panel::kD)[n] = f16_to_f32(d);
      at<float>(panel, K4Panel::kDmin)[n] = f16_to_f32(dmin);
      int16_t* mins = at<int16_t>(panel, K4Panel::kMins);
      for (int j = 0; j < 8; ++j) {
        uint8_t sc, m;
        k4_scale_min(j, scales, &sc, &m);
        at<int32_t>(panel, K4Panel::kSc)[j * kGemmTile + n] = sc;
        mins[((j / 2) * kGemmTile + n) * 2 + j % 2] = m;
      }
      uint8_t* q = panel + K4Panel::kQ;
      for (int k = 0; k < kQKK; ++k) {
        const int j = k / 32, l = k % 32;
        int v = (qs[(j / 2) * 32 + l] >> (4 * (j % 2))) & 0xF;
        if (q5) v |= ((x5->qh[l] >> j) & 1) << 4;
        q[qpos(k, n)] = static_cast<uint8_t>(v);
      }
    }
  }
}

void pack_k6_ref(const WeightMatrix& W, int64_t o0, int64_t b0, int64_t b1, uint8_t* panel) {
  for (int64_t b = b0; b < b1; ++b, panel += K6Panel::kBytes) {
    std::memset(panel, 0, K6Panel::kBytes);
    for (int n = 0; n < kGemmTile && o0 + n < W.rows; ++n) {
      const BlockQ6K& x = reinterpret_cast<const BlockQ6K*>(W.row(o0 + n))[b];
      at<float>(panel, K6Panel::kD)[n] = f16_to_f32(x.d);
      for (int j = 0; j < 16; ++j) at<int32_t>(panel, K6Panel::kSc)[j * kGemmTile + n] = x.scales[j];
      uint8_t* q = panel + K6Panel::kQ;
      for (int k = 0; k < kQKK; ++k) {
        const int h = k / 128, quarter = (k % 128) / 32, l = k % 32;
        const int lo = (x.ql[64 * h + 32 * (quarter % 2) + l] >> (4 * (quarter / 2))) & 0xF;
        const int hi = (x.qh[32 * h + l] >> (2 * quarter)) & 3;
        q[qpos(k, n)] = static_cast<uint8_t>(lo | (hi << 4));
      }
    }
  }
}

}  // namespace tandem::gemm_detail

namespace tandem::builds {

using namespace gemm_detail;

TypeFns scalar_products(GgmlType w) {
  switch (gemm_class(w)) {
    case GemmClass::kQ32: return {.pack = pack_q32_ref, .run = run_packed<run_q32_body>, .rows = rows_q32};
    case GemmClass::kK4: return {.pack = pack_k4_ref, .run = run_packed<run_kq_body<false>>, .rows = rows_k4};
    case GemmClass::kK6: return {.pack = pack_k6_ref, .run = run_packed<run_kq_body<true>>, .rows = rows_k6};
    case GemmClass::kFloat: return {.rows = rows_float};
    case GemmClass::kNone: break;
  }
  return {};
}

}  // namespace tandem::builds

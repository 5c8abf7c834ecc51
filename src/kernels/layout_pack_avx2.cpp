// AVX2 packers: the AVX-512 packers' work (layout_pack_avx512.cpp) with two
// 8x8 transposes per 16-row tile, one for lanes 0-7 and one for lanes 8-15.
// They write the same bytes as the scalar packers; a tile that runs past the
// matrix's last row goes to the scalar packer.
#include "kernels/layout_pack_avx2.h"

#if defined(__x86_64__)

#include <immintrin.h>

#include <cstring>

#include "core/quant_blocks.h"
#include "kernels/product_kernels.h"
#include "kernels/simd_avx2.h"
#include "kernels/layout_panels.h"
#include "kernels/simd_transpose.h"

#define TD_ATTR __attribute__((target("avx2,fma,f16c")))
#define TD_FN TD_ATTR inline

namespace tandem::gemm_detail {
namespace {

using namespace avx2;

// 16 rows of 8 dwords to 8 panel vectors, 64 bytes apart from out.
TD_FN void transpose_16x8(__m256i r[16], uint8_t* out) {
  simd::transpose_8x8_epi32(r);
  simd::transpose_8x8_epi32(r + 8);
  for (int g = 0; g < 8; ++g) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 64 * g), r[g]);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 64 * g + 32), r[8 + g]);
  }
}

TD_FN void pack_f16s(const uint8_t* const rows[16], size_t off, float* out) {
  alignas(32) uint16_t h[16];
  for (int n = 0; n < 16; ++n) std::memcpy(&h[n], rows[n] + off, 2);
  const __m256i v = _mm256_load_si256(reinterpret_cast<const __m256i*>(h));
  _mm256_store_ps(out, _mm256_cvtph_ps(_mm256_castsi256_si128(v)));
  _mm256_store_ps(out + 8, _mm256_cvtph_ps(_mm256_extracti128_si256(v, 1)));
}

template <typename Conv>
TD_FN void pack_q32_rows(const uint8_t* const rows[16], int64_t b0, int64_t b1, uint8_t* panel) {
  const Conv conv;
  for (int64_t b = b0; b < b1; ++b, panel += Q32Panel::kBytes) {
    const size_t off = static_cast<size_t>(b) * Conv::kBlock;
    __m256i r[16];
    for (int n = 0; n < 16; ++n) r[n] = conv(rows[n] + off);
    pack_q32_scales(rows, off, panel);
    transpose_16x8(r, panel + Q32Panel::kQ);
  }
}

template <typename Block>
TD_FN void pack_k4_rows(const uint8_t* const rows[16], int64_t b0, int64_t b1, uint8_t* panel) {
  constexpr bool kQ5 = sizeof(Block) == sizeof(BlockQ5K);
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  for (int64_t b = b0; b < b1; ++b, panel += K4Panel::kBytes) {
    const size_t off = static_cast<size_t>(b) * sizeof(Block);
    pack_f16s(rows, off + offsetof(Block, d), reinterpret_cast<float*>(panel + K4Panel::kD));
    pack_f16s(rows, off + offsetof(Block, dmin), reinterpret_cast<float*>(panel + K4Panel::kDmin));
    int32_t* sc = reinterpret_cast<int32_t*>(panel + K4Panel::kSc);
    int16_t* mins = reinterpret_cast<int16_t*>(panel + K4Panel::kMins);
    for (int n = 0; n < 16; ++n) {
      uint32_t words[4];
      k4_unpack_words(rows[n] + off + offsetof(Block, scales), words);
      uint8_t sm[16];
      std::memcpy(sm, words, 16);
      for (int j = 0; j < 8; ++j) {
        sc[j * 16 + n] = sm[j];
        mins[((j / 2) * 16 + n) * 2 + j % 2] = sm[8 + j];
      }
    }
    for (int j = 0; j < 8; ++j) {
      __m256i r[16];
      for (int n = 0; n < 16; ++n) {
        const __m256i x = load256(rows[n] + off + offsetof(Block, qs) + 32 * (j / 2));
        __m256i v = _mm256_and_si256(j % 2 ? _mm256_srli_epi16(x, 4) : x, m4);
        if constexpr (kQ5) {
          const __m256i bit = _mm256_set1_epi8(static_cast<char>(1 << j));
          const __m256i qh = load256(rows[n] + off + offsetof(BlockQ5K, qh));
          v = _mm256_or_si256(v, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, bit), bit),
                                                  _mm256_set1_epi8(0x10)));
        }
        r[n] = v;
      }
      transpose_16x8(r, panel + K4Panel::kQ + 64 * 8 * j);
    }
  }
}

TD_FN void pack_k6_rows(const uint8_t* const rows[16], int64_t b0, int64_t b1, uint8_t* panel) {
  const __m256i m4 = _mm256_set1_epi8(0x0F), m2 = _mm256_set1_epi8(3);
  for (int64_t b = b0; b < b1; ++b, panel += K6Panel::kBytes) {
    const size_t off = static_cast<size_t>(b) * sizeof(BlockQ6K);
    pack_f16s(rows, off + offsetof(BlockQ6K, d), reinterpret_cast<float*>(panel + K6Panel::kD));
    int32_t* sc = reinterpret_cast<int32_t*>(panel + K6Panel::kSc);
    for (int n = 0; n < 16; ++n) {
      const int8_t* s = reinterpret_cast<const int8_t*>(rows[n] + off + offsetof(BlockQ6K, scales));
      for (int j = 0; j < 16; ++j) sc[j * 16 + n] = s[j];
    }
    for (int j = 0; j < 8; ++j) {
      const int h = j / 4, q = j % 4;
      __m256i r[16];
      for (int n = 0; n < 16; ++n) {
        const uint8_t* blk = rows[n] + off;
        const __m256i l = load256(blk + offsetof(BlockQ6K, ql) + 64 * h + 32 * (q % 2));
        const __m256i lo = _mm256_and_si256(q >= 2 ? _mm256_srli_epi16(l, 4) : l, m4);
        const __m256i hb = load256(blk + offsetof(BlockQ6K, qh) + 32 * h);
        const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(hb, 2 * q), m2);
        r[n] = _mm256_or_si256(lo, _mm256_slli_epi16(hi, 4));
      }
      transpose_16x8(r, panel + K6Panel::kQ + 64 * 8 * j);
    }
  }
}

TD_FN void row_pointers(const WeightMatrix& W, int64_t o0, const uint8_t* rows[16]) {
  for (int n = 0; n < 16; ++n) rows[n] = W.row(o0 + n);
}

}  // namespace

TD_ATTR void avx2_pack_q32(const WeightMatrix& W, int64_t o0, int64_t b0, int64_t b1, uint8_t* panel) {
  if (o0 + kGemmTile > W.rows) return pack_q32_ref(W, o0, b0, b1, panel);
  const uint8_t* rows[16];
  row_pointers(W, o0, rows);
  switch (W.type) {
    case GgmlType::Q4_0: return pack_q32_rows<Q4_0Conv>(rows, b0, b1, panel);
    case GgmlType::Q5_0: return pack_q32_rows<Q5_0Conv>(rows, b0, b1, panel);
    default: return pack_q32_rows<Q8_0Conv>(rows, b0, b1, panel);
  }
}

TD_ATTR void avx2_pack_k4(const WeightMatrix& W, int64_t o0, int64_t b0, int64_t b1, uint8_t* panel) {
  if (o0 + kGemmTile > W.rows) return pack_k4_ref(W, o0, b0, b1, panel);
  const uint8_t* rows[16];
  row_pointers(W, o0, rows);
  if (W.type == GgmlType::Q5_K) return pack_k4_rows<BlockQ5K>(rows, b0, b1, panel);
  pack_k4_rows<BlockQ4K>(rows, b0, b1, panel);
}

TD_ATTR void avx2_pack_k6(const WeightMatrix& W, int64_t o0, int64_t b0, int64_t b1, uint8_t* panel) {
  if (o0 + kGemmTile > W.rows) return pack_k6_ref(W, o0, b0, b1, panel);
  const uint8_t* rows[16];
  row_pointers(W, o0, rows);
  pack_k6_rows(rows, b0, b1, panel);
}

}  // namespace tandem::gemm_detail

#endif

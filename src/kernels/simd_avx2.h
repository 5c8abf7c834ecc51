// Block decoders shared by the AVX2 packers and row kernels: each turns one
// q4_0 / q5_0 / q8_0 block into its 32 quants as unsigned bytes (q +
// q32_offset), element order. Only for AVX2-targeted code; not a general
// header.
#pragma once

#if defined(__x86_64__)

#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "core/quant_blocks.h"

namespace tandem::gemm_detail::avx2 {

#define TD_CONV_FN __attribute__((target("avx2,fma,f16c"))) inline

TD_CONV_FN __m256i load256(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }

TD_CONV_FN __m256i nibbles32(const uint8_t* qs) {
  const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m128i m = _mm_set1_epi8(0x0F);
  return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(x, 4), m), _mm_and_si128(x, m));
}

// 0x10 in byte j where bit j of the 32-bit word is set.
TD_CONV_FN __m256i bits_to_0x10(uint32_t bits) {
  const __m256i spread = _mm256_shuffle_epi8(
      _mm256_set1_epi32(static_cast<int>(bits)),
      _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3));
  const __m256i bit = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201ull));
  return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit), _mm256_set1_epi8(0x10));
}

struct Q4_0Conv {
  static constexpr size_t kBlock = sizeof(BlockQ4_0);
  TD_CONV_FN __m256i operator()(const uint8_t* blk) const { return nibbles32(blk + offsetof(BlockQ4_0, qs)); }
};
struct Q5_0Conv {
  static constexpr size_t kBlock = sizeof(BlockQ5_0);
  TD_CONV_FN __m256i operator()(const uint8_t* blk) const {
    uint32_t qh;
    std::memcpy(&qh, blk + offsetof(BlockQ5_0, qh), 4);
    return _mm256_or_si256(nibbles32(blk + offsetof(BlockQ5_0, qs)), bits_to_0x10(qh));
  }
};
struct Q8_0Conv {
  static constexpr size_t kBlock = sizeof(BlockQ8_0);
  TD_CONV_FN __m256i operator()(const uint8_t* blk) const {
    return _mm256_xor_si256(load256(blk + offsetof(BlockQ8_0, qs)), _mm256_set1_epi8(static_cast<char>(0x80)));
  }
};

#undef TD_CONV_FN

}  // namespace tandem::gemm_detail::avx2

#endif

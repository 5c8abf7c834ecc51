// The AVX2 product files' common ground: their target, TD_ATTR / TD_FN for
// their functions (the library is built for baseline x86-64, so every
// function carries the target and runs only where CPUID allows), and the
// block decoders the packers and row kernels share: each turns one q4_0 /
// q5_0 / q8_0 / mxfp4 block into its 32 quants as unsigned bytes (q + q32_offset),
// element order. Only for files all of whose functions have this target.
#pragma once

#if defined(__x86_64__)

#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "quant/quant_blocks.h"

#define TD_AVX2 "avx2,fma,f16c"
#define TD_ATTR __attribute__((target(TD_AVX2)))
#define TD_FN TD_ATTR inline

namespace tandem::gemm_detail::avx2 {

TD_FN __m256i load256(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }

TD_FN __m256i nibbles32(const uint8_t* qs) {
  const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m128i m = _mm_set1_epi8(0x0F);
  return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(x, 4), m), _mm_and_si128(x, m));
}

// 0x10 in byte j where bit j of the 32-bit word is set.
TD_FN __m256i bits_to_0x10(uint32_t bits) {
  const __m256i spread = _mm256_shuffle_epi8(
      _mm256_set1_epi32(static_cast<int>(bits)),
      _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3));
  const __m256i bit = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201ull));
  return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit), _mm256_set1_epi8(0x10));
}

struct Q4_0Conv {
  static constexpr size_t kBlock = sizeof(BlockQ4_0);
  TD_FN __m256i operator()(const uint8_t* blk) const { return nibbles32(blk + offsetof(BlockQ4_0, qs)); }
};
struct Q5_0Conv {
  static constexpr size_t kBlock = sizeof(BlockQ5_0);
  TD_FN __m256i operator()(const uint8_t* blk) const {
    uint32_t qh;
    std::memcpy(&qh, blk + offsetof(BlockQ5_0, qh), 4);
    return _mm256_or_si256(nibbles32(blk + offsetof(BlockQ5_0, qs)), bits_to_0x10(qh));
  }
};
struct Q8_0Conv {
  static constexpr size_t kBlock = sizeof(BlockQ8_0);
  TD_FN __m256i operator()(const uint8_t* blk) const {
    return _mm256_xor_si256(load256(blk + offsetof(BlockQ8_0, qs)), _mm256_set1_epi8(static_cast<char>(0x80)));
  }
};

// MXFP4's codes to their values (kMxfp4Values) + 12, one in-lane shuffle.
struct Mxfp4Conv {
  static constexpr size_t kBlock = sizeof(BlockMXFP4);
  TD_FN __m256i operator()(const uint8_t* blk) const {
    const __m256i table = _mm256_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0, 12, 13, 14, 15,
                                           16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0);
    return _mm256_shuffle_epi8(table, nibbles32(blk + offsetof(BlockMXFP4, qs)));
  }
};


}  // namespace tandem::gemm_detail::avx2

#endif

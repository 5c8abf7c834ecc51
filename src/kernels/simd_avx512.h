// The AVX-512 product files' common ground: their target, TD_ATTR / TD_FN
// for their functions (the library is built for baseline x86-64, so every
// function carries the target and runs only where CPUID allows), and the
// block decoders the packers and row kernels share: each turns one q4_0 /
// q5_0 / q8_0 / mxfp4 block into its 32 quants as unsigned bytes (q + q32_offset),
// element order. Only for files all of whose functions have this target.
#pragma once

#if defined(__x86_64__)

// GCC 12's AVX-512 intrinsics build some results from a deliberately
// uninitialized vector (the "__Y = __Y" idiom), which -Wuninitialized then
// reports once inlined. The values are never read.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "quant/quant_blocks.h"

#define TD_AVX512 "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni"
#define TD_ATTR __attribute__((target(TD_AVX512)))
#define TD_FN TD_ATTR inline

namespace tandem::gemm_detail::avx512 {

TD_FN __m256i load256(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
// The 64-bit byte mask stored at p (q5_0 tiles' fifth bits).
TD_FN __mmask64 mask64_at(const uint8_t* p) {
  uint64_t m;
  std::memcpy(&m, p, 8);
  return m;
}

// 16 packed nibble bytes to 32 bytes: low nibbles, then high nibbles.
TD_FN __m256i nibbles32(const uint8_t* qs) {
  const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m128i m = _mm_set1_epi8(0x0F);
  return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(x, 4), m), _mm_and_si128(x, m));
}

// Blocks blk and blk + kBlock as one register: [first 32 | second 32].
TD_FN __m512i join(__m256i a, __m256i b) { return _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1); }

// The nibbles of two 16-byte quant fields: [lo0 hi0 lo1 hi1]. Each field is
// broadcast to two 128-bit lanes (loads, no shuffle unit) and the upper copy
// shifted down by a nibble.
TD_FN __m512i nibbles64(const uint8_t* qs0, const uint8_t* qs1) {
  __m512i z = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qs0)));
  z = _mm512_mask_broadcast_i32x4(z, 0xFF00, _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs1)));
  z = _mm512_mask_srli_epi16(z, 0xFF00FF00u, z, 4);
  return _mm512_and_si512(z, _mm512_set1_epi8(0x0F));
}

struct Q4_0Conv {
  static constexpr size_t kBlock = sizeof(BlockQ4_0);
  TD_FN __m256i operator()(const uint8_t* blk) const { return nibbles32(blk + offsetof(BlockQ4_0, qs)); }
  TD_FN __m512i pair(const uint8_t* blk) const {
    return nibbles64(blk + offsetof(BlockQ4_0, qs), blk + kBlock + offsetof(BlockQ4_0, qs));
  }
};
struct Q5_0Conv {
  static constexpr size_t kBlock = sizeof(BlockQ5_0);
  TD_FN __m256i operator()(const uint8_t* blk) const {
    uint32_t qh;
    std::memcpy(&qh, blk + offsetof(BlockQ5_0, qh), 4);
    const __m256i u = nibbles32(blk + offsetof(BlockQ5_0, qs));
    return _mm256_mask_add_epi8(u, static_cast<__mmask32>(qh), u, _mm256_set1_epi8(0x10));
  }
  TD_FN __m512i pair(const uint8_t* blk) const {
    uint32_t qh0, qh1;
    std::memcpy(&qh0, blk + offsetof(BlockQ5_0, qh), 4);
    std::memcpy(&qh1, blk + kBlock + offsetof(BlockQ5_0, qh), 4);
    const __m512i u = nibbles64(blk + offsetof(BlockQ5_0, qs), blk + kBlock + offsetof(BlockQ5_0, qs));
    return _mm512_mask_add_epi8(u, static_cast<__mmask64>((uint64_t{qh1} << 32) | qh0), u, _mm512_set1_epi8(0x10));
  }
};
struct Q8_0Conv {
  static constexpr size_t kBlock = sizeof(BlockQ8_0);
  TD_FN __m256i operator()(const uint8_t* blk) const {
    return _mm256_xor_si256(load256(blk + offsetof(BlockQ8_0, qs)), _mm256_set1_epi8(static_cast<char>(0x80)));
  }
  TD_FN __m512i pair(const uint8_t* blk) const {
    // Two broadcasts from memory rather than an insert: no shuffle unit.
    __m512i z = _mm512_broadcast_i64x4(load256(blk + offsetof(BlockQ8_0, qs)));
    z = _mm512_mask_broadcast_i64x4(z, 0xF0, load256(blk + kBlock + offsetof(BlockQ8_0, qs)));
    return _mm512_xor_si512(z, _mm512_set1_epi8(static_cast<char>(0x80)));
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
  TD_FN __m512i pair(const uint8_t* blk) const {
    const __m512i table = _mm512_broadcast_i32x4(_mm_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0));
    return _mm512_shuffle_epi8(table, nibbles64(blk + offsetof(BlockMXFP4, qs), blk + kBlock + offsetof(BlockMXFP4, qs)));
  }
};


}  // namespace tandem::gemm_detail::avx512

#endif

// AVX-512 kernels for the signed 32-element formats (q4_0, q5_0, q8_0), two
// blocks per 512-bit register. Textually included by vec_dot_avx512.cpp twice,
// inside different namespaces: TD_VNNI 0 (maddubs + madd) and TD_VNNI 1
// (AVX512-VNNI dpbusd), TD_TARGET naming the matching target. Not a normal
// header. q4_1/q5_1 use the AVX2 kernels.

#define TD_FN __attribute__((target(TD_TARGET))) inline

// Sums of 4 adjacent u8*s8 products, as 16 int32 lanes.
TD_FN __m512i dot_u8s8(__m512i u, __m512i s) {
#if TD_VNNI
  return _mm512_dpbusd_epi32(_mm512_setzero_si512(), u, s);
#else
  // Cannot saturate: |u| <= 128 and |s| <= 127 give pair sums <= 32512.
  return _mm512_madd_epi16(_mm512_maddubs_epi16(u, s), _mm512_set1_epi16(1));
#endif
}

// Signed x signed: |x| times y with x's sign moved onto it (y is never -128,
// see the AVX2 version). AVX-512 has no sign_epi8, hence the masked negate.
TD_FN __m512i dot_s8s8(__m512i x, __m512i y) {
  const __mmask64 negative = _mm512_movepi8_mask(x);
  return dot_u8s8(_mm512_abs_epi8(x), _mm512_mask_sub_epi8(y, negative, _mm512_setzero_si512(), y));
}

TD_FN __m256i load32(const int8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }

TD_FN __m256i unpack_nibbles(const uint8_t* qs) {
  const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), _mm256_set1_epi8(0x0F));
}

// 0x10 in byte i where bit i of the 32-bit qh field is set.
TD_FN __m256i fifth_bits(const uint8_t* qh) {
  uint32_t bits;
  std::memcpy(&bits, qh, 4);
  return _mm256_maskz_mov_epi8(static_cast<__mmask32>(bits), _mm256_set1_epi8(0x10));
}

struct Q4_0Quants {
  TD_FN __m256i operator()(const BlockQ4_0& x) const {
    return _mm256_sub_epi8(unpack_nibbles(x.qs), _mm256_set1_epi8(8));
  }
};
struct Q5_0Quants {
  TD_FN __m256i operator()(const BlockQ5_0& x) const {
    return _mm256_sub_epi8(_mm256_or_si256(unpack_nibbles(x.qs), fifth_bits(x.qh)), _mm256_set1_epi8(16));
  }
};
struct Q8_0Quants {
  TD_FN __m256i operator()(const BlockQ8_0& x) const { return load32(x.qs); }
};

TD_FN __m512i pair(__m256i lo, __m256i hi) { return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1); }

TD_FN float block_scale(uint16_t dx, uint16_t dy) { return _cvtsh_ss(dx) * _cvtsh_ss(dy); }

template <typename BlockW, typename Quants>
TD_FN float sum_block_pairs(int64_t nb, const BlockW* x, const BlockQ8_0* y, Quants quants) {
  __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
  int64_t b = 0;
  for (; b + 4 <= nb; b += 4) {
    const __m512i p0 = dot_s8s8(pair(quants(x[b]), quants(x[b + 1])), pair(load32(y[b].qs), load32(y[b + 1].qs)));
    const __m512i p1 =
        dot_s8s8(pair(quants(x[b + 2]), quants(x[b + 3])), pair(load32(y[b + 2].qs), load32(y[b + 3].qs)));
    const __m512 d0 = _mm512_mask_blend_ps(0xFF00, _mm512_set1_ps(block_scale(x[b].d, y[b].d)),
                                           _mm512_set1_ps(block_scale(x[b + 1].d, y[b + 1].d)));
    const __m512 d1 = _mm512_mask_blend_ps(0xFF00, _mm512_set1_ps(block_scale(x[b + 2].d, y[b + 2].d)),
                                           _mm512_set1_ps(block_scale(x[b + 3].d, y[b + 3].d)));
    acc0 = _mm512_fmadd_ps(d0, _mm512_cvtepi32_ps(p0), acc0);
    acc1 = _mm512_fmadd_ps(d1, _mm512_cvtepi32_ps(p1), acc1);
  }
  for (; b + 2 <= nb; b += 2) {
    const __m512i p = dot_s8s8(pair(quants(x[b]), quants(x[b + 1])), pair(load32(y[b].qs), load32(y[b + 1].qs)));
    const __m512 d = _mm512_mask_blend_ps(0xFF00, _mm512_set1_ps(block_scale(x[b].d, y[b].d)),
                                          _mm512_set1_ps(block_scale(x[b + 1].d, y[b + 1].d)));
    acc0 = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(p), acc0);
  }
  if (b < nb) {
    // Upper half zero: its products vanish.
    const __m512i p = dot_s8s8(_mm512_zextsi256_si512(quants(x[b])), _mm512_zextsi256_si512(load32(y[b].qs)));
    acc1 = _mm512_fmadd_ps(_mm512_set1_ps(block_scale(x[b].d, y[b].d)), _mm512_cvtepi32_ps(p), acc1);
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
}

TD_FN float dot_q4_0(int64_t n, const void* w, const void* a) {
  return sum_block_pairs(n / kQK, static_cast<const BlockQ4_0*>(w), static_cast<const BlockQ8_0*>(a), Q4_0Quants{});
}
TD_FN float dot_q5_0(int64_t n, const void* w, const void* a) {
  return sum_block_pairs(n / kQK, static_cast<const BlockQ5_0*>(w), static_cast<const BlockQ8_0*>(a), Q5_0Quants{});
}
TD_FN float dot_q8_0(int64_t n, const void* w, const void* a) {
  return sum_block_pairs(n / kQK, static_cast<const BlockQ8_0*>(w), static_cast<const BlockQ8_0*>(a), Q8_0Quants{});
}

#undef TD_FN

// AVX2 kernels for the 32-element formats (q4_0, q4_1, q5_0, q5_1, q8_0, mxfp4).
// Compiled twice by vec_dot_avx2.cpp through simd_avx2_variants.h: TD_VNNI 0
// (maddubs + madd) and TD_VNNI 1 (AVX-VNNI dpbusd), TD_TARGET naming the
// matching target attribute. Not a normal header.
//
// Each block's int32 sums stay exact; only the per-block float scaling and
// the final lane reduction differ in order from the scalar reference.

#define TD_FN __attribute__((target(TD_TARGET))) inline

// Sums of 4 adjacent u8*s8 products, as 8 int32 lanes.
TD_FN __m256i dot_u8s8(__m256i u, __m256i s) {
#if TD_VNNI
  return _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), u, s);
#else
  // maddubs cannot saturate here: |u| <= 128 and |s| <= 127 give <= 32512.
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
#endif
}

// Signed x signed by moving x's sign onto y. Needs y != -128, which q8
// activations never are (their quantizers stay within +-127).
TD_FN __m256i dot_s8s8(__m256i x, __m256i y) { return dot_u8s8(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x)); }

TD_FN float hsum_ps(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// The 32 quants of a 4-bit block in element order: low nibbles then high.
TD_FN __m256i unpack_nibbles(const uint8_t* qs) {
  const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), _mm256_set1_epi8(0x0F));
}

// 0x10 in byte i where bit i of the 32-bit qh field is set.
TD_FN __m256i fifth_bits(const uint8_t* qh) {
  uint32_t bits;
  std::memcpy(&bits, qh, 4);
  const __m256i spread = _mm256_shuffle_epi8(
      _mm256_set1_epi32(static_cast<int>(bits)),
      _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3));
  const __m256i sel = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201ULL));
  return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(spread, sel), sel), _mm256_set1_epi8(0x10));
}

TD_FN __m256i load32(const int8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }

TD_FN __m256 block_scale(uint16_t dx, uint16_t dy) { return _mm256_set1_ps(_cvtsh_ss(dx) * _cvtsh_ss(dy)); }

// Two accumulators so consecutive blocks' FMAs do not wait on each other.
// Formats with a min (x = d*q + m) add m times q8_1's stored d*sum(q8).
template <typename BlockW, typename BlockA, typename Quants>
TD_FN float sum_blocks(int64_t nb, const BlockW* x, const BlockA* y, Quants quants) {
  constexpr bool kHasMin = std::is_same_v<BlockA, BlockQ8_1>;
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  float mins0 = 0, mins1 = 0;
  int64_t b = 0;
  for (; b + 2 <= nb; b += 2) {
    acc0 = _mm256_fmadd_ps(block_scale(x[b].d, y[b].d), _mm256_cvtepi32_ps(quants(x[b], y[b])), acc0);
    acc1 = _mm256_fmadd_ps(block_scale(x[b + 1].d, y[b + 1].d), _mm256_cvtepi32_ps(quants(x[b + 1], y[b + 1])),
                           acc1);
    if constexpr (kHasMin) {
      mins0 += _cvtsh_ss(x[b].m) * _cvtsh_ss(y[b].s);
      mins1 += _cvtsh_ss(x[b + 1].m) * _cvtsh_ss(y[b + 1].s);
    }
  }
  if (b < nb) {
    acc0 = _mm256_fmadd_ps(block_scale(x[b].d, y[b].d), _mm256_cvtepi32_ps(quants(x[b], y[b])), acc0);
    if constexpr (kHasMin) mins0 += _cvtsh_ss(x[b].m) * _cvtsh_ss(y[b].s);
  }
  return hsum_ps(_mm256_add_ps(acc0, acc1)) + (mins0 + mins1);
}

// Per-block int32 sums (8 lanes) of each format against its activation block.
struct Q4_0Sums {
  TD_FN __m256i operator()(const BlockQ4_0& x, const BlockQ8_0& y) const {
    return dot_s8s8(_mm256_sub_epi8(unpack_nibbles(x.qs), _mm256_set1_epi8(8)), load32(y.qs));
  }
};
struct Q5_0Sums {
  TD_FN __m256i operator()(const BlockQ5_0& x, const BlockQ8_0& y) const {
    const __m256i q = _mm256_or_si256(unpack_nibbles(x.qs), fifth_bits(x.qh));
    return dot_s8s8(_mm256_sub_epi8(q, _mm256_set1_epi8(16)), load32(y.qs));
  }
};
struct Q8_0Sums {
  TD_FN __m256i operator()(const BlockQ8_0& x, const BlockQ8_0& y) const { return dot_s8s8(load32(x.qs), load32(y.qs)); }
};
// MXFP4's codes looked up to their signed values (|v| <= 12) by one shuffle.
struct Mxfp4Sums {
  TD_FN __m256i operator()(const BlockMXFP4& x, const BlockQ8_0& y) const {
    const __m128i table = _mm_loadu_si128(reinterpret_cast<const __m128i*>(kMxfp4Values));
    const __m256i v = _mm256_shuffle_epi8(_mm256_set_m128i(table, table), unpack_nibbles(x.qs));
    return dot_s8s8(v, load32(y.qs));
  }
};
struct Q4_1Sums {
  TD_FN __m256i operator()(const BlockQ4_1& x, const BlockQ8_1& y) const {
    return dot_u8s8(unpack_nibbles(x.qs), load32(y.qs));
  }
};
struct Q5_1Sums {
  TD_FN __m256i operator()(const BlockQ5_1& x, const BlockQ8_1& y) const {
    return dot_u8s8(_mm256_or_si256(unpack_nibbles(x.qs), fifth_bits(x.qh)), load32(y.qs));
  }
};

TD_FN float dot_q4_0(int64_t n, const void* w, const void* a) {
  return sum_blocks(n / kQK, static_cast<const BlockQ4_0*>(w), static_cast<const BlockQ8_0*>(a), Q4_0Sums{});
}
TD_FN float dot_q5_0(int64_t n, const void* w, const void* a) {
  return sum_blocks(n / kQK, static_cast<const BlockQ5_0*>(w), static_cast<const BlockQ8_0*>(a), Q5_0Sums{});
}
TD_FN float dot_q8_0(int64_t n, const void* w, const void* a) {
  return sum_blocks(n / kQK, static_cast<const BlockQ8_0*>(w), static_cast<const BlockQ8_0*>(a), Q8_0Sums{});
}

// The scalar reference's chain (vec_dot_ref.cpp): each block's exact sum
// reduced across lanes, then acc = fma(S, dw * da, acc) in block order.
TD_FN float dot_mxfp4(int64_t n, const void* w, const void* a) {
  const auto* x = static_cast<const BlockMXFP4*>(w);
  const auto* y = static_cast<const BlockQ8_0*>(a);
  float acc = 0;
  for (int64_t b = 0; b < n / kQK; ++b) {
    const __m256i v = Mxfp4Sums{}(x[b], y[b]);
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
    acc = std::fma(static_cast<float>(_mm_cvtsi128_si32(s)), e8m0_to_f32_half(x[b].e) * _cvtsh_ss(y[b].d), acc);
  }
  return acc;
}

TD_FN float dot_q4_1(int64_t n, const void* w, const void* a) {
  return sum_blocks(n / kQK, static_cast<const BlockQ4_1*>(w), static_cast<const BlockQ8_1*>(a), Q4_1Sums{});
}
TD_FN float dot_q5_1(int64_t n, const void* w, const void* a) {
  return sum_blocks(n / kQK, static_cast<const BlockQ5_1*>(w), static_cast<const BlockQ8_1*>(a), Q5_1Sums{});
}

#undef TD_FN

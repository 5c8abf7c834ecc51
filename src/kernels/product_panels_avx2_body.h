// AVX2 panel kernels, compiled twice by product_panels_avx2.cpp through
// simd_avx2_variants.h: TD_VNNI 1 (AVX-VNNI dpbusd) and TD_VNNI 0 (maddubs +
// madd), TD_TARGET naming the matching target. Not a normal header. A panel vector (16 lanes) is a pair
// of registers; each kernel handles `kStep` activation slots at a time so its
// accumulators stay in the 16 registers, and loops over the rest.

#define TD_ATTR __attribute__((target(TD_TARGET)))
#define TD_FN TD_ATTR inline

// Sums of four u8 x s8 products per int32 lane, added to acc.
TD_FN __m256i dot4(__m256i acc, __m256i u, __m256i s) {
#if TD_VNNI
  return _mm256_dpbusd_avx_epi32(acc, u, s);
#else
  return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
#endif
}

TD_FN __m256i bcast32(const void* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}

TD_FN __m256i load_i(const uint8_t* p) { return _mm256_load_si256(reinterpret_cast<const __m256i*>(p)); }
TD_FN __m256 load_f(const uint8_t* p) { return _mm256_load_ps(reinterpret_cast<const float*>(p)); }

// Slots s0.. of acc; half h of a 16-lane accumulator is lanes 8h..8h+7.
template <int R>
TD_FN void load_acc(const GemmAcc& acc, int s0, __m256 f[R][2]) {
  for (int r = 0; r < R; ++r)
    for (int h = 0; h < 2; ++h)
      f[r][h] = acc.in ? _mm256_loadu_ps(acc.in + (s0 + r) * kGemmTile + 8 * h) : _mm256_setzero_ps();
}
template <int R>
TD_FN void store_acc(const GemmAcc& acc, int s0, const __m256 f[R][2]) {
  for (int r = 0; r < R; ++r)
    for (int h = 0; h < 2; ++h) _mm256_storeu_ps(acc.out + (s0 + r) * acc.ld_out + 8 * h, f[r][h]);
}

// kSigned: q8_0 without VNNI, see product_panels_avx2.cpp. kBf16: the
// panel's scales are bf16 (mxfp4, layout_panels.h), else f16.
template <int R, bool kSigned, bool kBf16>
TD_FN void q32_rows(const uint8_t* panel, int64_t nblk, const GemmActs& A, int64_t G, int s0, int64_t b0,
                    const GemmAcc& acc) {
  const int64_t S = A.slots;
  const int8_t* aq = A.qgroup(G) + b0 * kQK * S + 4 * s0;
  const float* as = A.sgroup(G) + b0 * S + s0;
  const int32_t* ae = A.egroup(G) + b0 * S + s0;
  const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));
  __m256 f[R][2];
  load_acc<R>(acc, s0, f);
  for (int64_t i = 0; i < nblk; ++i) {
    __m256i s[R][2];
    for (int r = 0; r < R; ++r) s[r][0] = s[r][1] = kSigned ? _mm256_setzero_si256() : _mm256_set1_epi32(ae[r]);
#pragma GCC unroll 8
    for (int g = 0; g < 8; ++g) {
      const int8_t* ag = aq + g * 4 * S;
      for (int h = 0; h < 2; ++h) {
        const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(panel + Q32Panel::kQ + 64 * g + 32 * h));
        if constexpr (kSigned) {
          const __m256i sw = _mm256_xor_si256(w, flip);
          const __m256i aw = _mm256_abs_epi8(sw);
          for (int r = 0; r < R; ++r) s[r][h] = dot4(s[r][h], aw, _mm256_sign_epi8(bcast32(ag + 4 * r), sw));
        } else {
          for (int r = 0; r < R; ++r) s[r][h] = dot4(s[r][h], w, bcast32(ag + 4 * r));
        }
      }
    }
    for (int h = 0; h < 2; ++h) {
      const __m128i sh = _mm_loadu_si128(reinterpret_cast<const __m128i*>(panel + Q32Panel::kD + 16 * h));
      const __m256 d =
          kBf16 ? _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(sh), 16)) : _mm256_cvtph_ps(sh);
      for (int r = 0; r < R; ++r)
        f[r][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[r][h]), _mm256_mul_ps(d, _mm256_set1_ps(as[r])), f[r][h]);
    }
    panel += Q32Panel::kBytes;
    aq += kQK * S;
    as += S;
    ae += S;
  }
  store_acc<R>(acc, s0, f);
}

// The K-quant panels (q4_K / q5_K: kK6 false; q6_K: true), as the AVX-512
// kernel: per sub-block j the integer sums (q6_K's seeded with its -32
// offset's extra) times its scale, then the float chain, q4_K / q5_K with its
// mins term.
template <int R, bool kK6>
TD_FN void kq_rows(const uint8_t* panel, int64_t nblk, const GemmActs& A, int64_t G, int s0, int64_t b0,
                   const GemmAcc& acc) {
  using P = std::conditional_t<kK6, K6Panel, K4Panel>;
  constexpr int kSub = kK6 ? 16 : 8, kGroups = 64 / kSub, kExtra = kK6 ? 16 : 4;
  const int64_t S = A.slots;
  const int8_t* aq = A.qgroup(G) + b0 * kQKK * S + 4 * s0;
  const float* as = A.sgroup(G) + b0 * S + s0;
  const int32_t* ae = A.egroup(G) + b0 * kExtra * S + s0;
  __m256 f[R][2];
  load_acc<R>(acc, s0, f);
  for (int64_t i = 0; i < nblk; ++i) {
    for (int h = 0; h < 2; ++h) {
      __m256i isum[R];
      for (int r = 0; r < R; ++r) isum[r] = _mm256_setzero_si256();
      for (int j = 0; j < kSub; ++j) {
        __m256i s[R];
        for (int r = 0; r < R; ++r) s[r] = kK6 ? _mm256_set1_epi32(ae[j * S + r]) : _mm256_setzero_si256();
#pragma GCC unroll 8
        for (int g = 0; g < kGroups; ++g) {
          const __m256i w = load_i(panel + P::kQ + 64 * (kGroups * j + g) + 32 * h);
          const int8_t* ag = aq + (kGroups * j + g) * 4 * S;
          for (int r = 0; r < R; ++r) s[r] = dot4(s[r], w, bcast32(ag + 4 * r));
        }
        const __m256i sc = load_i(panel + P::kSc + 64 * j + 32 * h);
        for (int r = 0; r < R; ++r) isum[r] = _mm256_add_epi32(isum[r], _mm256_mullo_epi32(s[r], sc));
      }
      const __m256 d = load_f(panel + P::kD + 32 * h);
      for (int r = 0; r < R; ++r) {
        const __m256 da = _mm256_set1_ps(as[r]);
        f[r][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[r]), _mm256_mul_ps(d, da), f[r][h]);
        if constexpr (!kK6) {
          __m256i m = _mm256_setzero_si256();
          for (int e = 0; e < 4; ++e)
            m = _mm256_add_epi32(
                m, _mm256_madd_epi16(load_i(panel + K4Panel::kMins + 64 * e + 32 * h), bcast32(ae + e * S + r)));
          const __m256 dmin = load_f(panel + K4Panel::kDmin + 32 * h);
          f[r][h] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(m), _mm256_mul_ps(dmin, da), f[r][h]);
        }
      }
    }
    panel += P::kBytes;
    aq += kQKK * S;
    as += S;
    ae += kExtra * S;
  }
  store_acc<R>(acc, s0, f);
}

// Slots [0, R) in steps of kStep (R <= 8).
#define TD_DISPATCH_STEPS(name, kStep, call)                                                                  \
  TD_ATTR void name(const uint8_t* panel, int64_t nblk, const GemmActs& A, int64_t G, int R, int64_t b0,      \
                    const GemmAcc& acc) {                                                                     \
    for (int s0 = 0; s0 < R; s0 += kStep) {                                                                   \
      switch (R - s0 >= kStep ? kStep : R - s0) {                                                             \
        case 1: call(1); break;                                                                               \
        case 2: call(2); break;                                                                               \
        case 3: call(3); break;                                                                               \
        default: call(4); break;                                                                              \
      }                                                                                                       \
    }                                                                                                         \
  }

#define TD_Q32(n) q32_rows<n, false, false>(panel, nblk, A, G, s0, b0, acc)
#define TD_Q32S(n) q32_rows<n, true, false>(panel, nblk, A, G, s0, b0, acc)
#define TD_MX(n) q32_rows<n, false, true>(panel, nblk, A, G, s0, b0, acc)
#define TD_K4(n) kq_rows<n, false>(panel, nblk, A, G, s0, b0, acc)
#define TD_K6(n) kq_rows<n, true>(panel, nblk, A, G, s0, b0, acc)
TD_DISPATCH_STEPS(run_q32, 2, TD_Q32)
TD_DISPATCH_STEPS(run_q32_signed, 2, TD_Q32S)
TD_DISPATCH_STEPS(run_mx, 2, TD_MX)
TD_DISPATCH_STEPS(run_k4, 2, TD_K4)
TD_DISPATCH_STEPS(run_k6, 2, TD_K6)
#undef TD_Q32
#undef TD_Q32S
#undef TD_MX
#undef TD_K4
#undef TD_K6
#undef TD_DISPATCH_STEPS

#undef TD_FN
#undef TD_ATTR

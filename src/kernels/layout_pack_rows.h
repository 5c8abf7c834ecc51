// The packers of the file's rows into panels (layout_panels.h), written once
// for both vector widths. Not a normal header: layout_pack_avx2.cpp and
// layout_pack_avx512.cpp include it inside their namespace (gemm_detail::avx2,
// gemm_detail::avx512) after simd_avx2.h / simd_avx512.h, and define for
// their width first:
//   transpose_16x8(r, out)    16 rows of 8 dwords to 8 panel vectors 64 bytes apart
//   pack_f16s(rows, off, out) the f16 at rows[n] + off of each row n, as 16 floats
//   add_fifth_bit(v, qh, j)   v + 0x10 in each byte whose bit j of qh is set (q5_K)
//   pack_from_tiles(W, ...)   packs from W.tiles() and returns true where it reads them
// The bytes written equal the scalar packers'; a tile that runs past the
// matrix's last row goes to the scalar packer. No includes here: the includer
// provides them.

namespace {

template <typename Conv>
TD_FN void pack_q32_rows(GgmlType t, const uint8_t* const rows[16], int64_t b0, int64_t b1, uint8_t* panel) {
  const Conv conv;
  for (int64_t b = b0; b < b1; ++b, panel += Q32Panel::kBytes) {
    const size_t off = static_cast<size_t>(b) * Conv::kBlock;
    __m256i r[16];
    for (int n = 0; n < 16; ++n) r[n] = conv(rows[n] + off);
    pack_q32_scales(t, rows, off, panel);
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
      uint8_t sm[16];  // scales 0..7, mins 8..15
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
        if constexpr (kQ5) v = add_fifth_bit(v, load256(rows[n] + off + offsetof(BlockQ5K, qh)), j);
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
    // Slice j = 4h + q holds elements 128h + 32q + (0..31).
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

TD_ATTR void pack_q32(const WeightMatrix& W, int64_t o0, int64_t b0, int64_t b1, uint8_t* panel) {
  if (o0 + kGemmTile > W.rows) return pack_q32_ref(W, o0, b0, b1, panel);
  if (pack_from_tiles(W, o0, b0, b1, panel)) return;
  const uint8_t* rows[16];
  row_pointers(W, o0, rows);
  switch (W.type) {
    case GgmlType::Q4_0: return pack_q32_rows<Q4_0Conv>(W.type, rows, b0, b1, panel);
    case GgmlType::Q5_0: return pack_q32_rows<Q5_0Conv>(W.type, rows, b0, b1, panel);
    case GgmlType::MXFP4: return pack_q32_rows<Mxfp4Conv>(W.type, rows, b0, b1, panel);
    default: return pack_q32_rows<Q8_0Conv>(W.type, rows, b0, b1, panel);
  }
}

TD_ATTR void pack_k4(const WeightMatrix& W, int64_t o0, int64_t b0, int64_t b1, uint8_t* panel) {
  if (o0 + kGemmTile > W.rows) return pack_k4_ref(W, o0, b0, b1, panel);
  if (pack_from_tiles(W, o0, b0, b1, panel)) return;
  const uint8_t* rows[16];
  row_pointers(W, o0, rows);
  if (W.type == GgmlType::Q5_K) return pack_k4_rows<BlockQ5K>(rows, b0, b1, panel);
  pack_k4_rows<BlockQ4K>(rows, b0, b1, panel);
}

TD_ATTR void pack_k6(const WeightMatrix& W, int64_t o0, int64_t b0, int64_t b1, uint8_t* panel) {
  if (o0 + kGemmTile > W.rows) return pack_k6_ref(W, o0, b0, b1, panel);
  const uint8_t* rows[16];
  row_pointers(W, o0, rows);
  pack_k6_rows(rows, b0, b1, panel);
}

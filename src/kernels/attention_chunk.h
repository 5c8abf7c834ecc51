// The chunk kernel of attention_impl.h, written once over a vector "Ops"
// type and included by each instruction-set file inside its own namespace
// (after defining Ops and TD_FN, the function attributes of that level), the
// way vec_dot_avx512_q32.h is. No includes here: the includer provides them.
//
// Ops provides: V (vector of W floats), W, zero(), bcast(f), bcast_h(f16
// bits), load(const float*), load(const uint16_t*) (f16 -> f32),
// load_part(p, n) for both (lanes >= n are zero), load_i8(const int8_t*),
// load_q4_lo / load_q4_hi(const uint8_t*) (the low / high nibbles of W bytes,
// minus 8), store(float*, V), store_part(float*, V, n), add(V, V), sub(V, V),
// mul(V, V), fma(a, b, c) = a*b+c, reduce(V) (fixed lane order), max(x, m) =
// lane-wise x > m ? x : m, reduce_max(V), exp(V); tile sizes QR x QK for
// scores (rows x vectors of W keys), QKQ vectors for quantized keys, and
// PR x PD for the value sum (rows x vectors). For quantized keys: I (W
// int32), ibcast(int), to_float(I), KW (W words of 4 bytes) and
// load_words(p), nibbles_lo / nibbles_hi(KW) (each byte's low / high
// nibble), dot_u8(I, KW, q) (per lane: + the 4 unsigned bytes times the 4
// signed bytes of q), KS / signed_words(KW) / dot_s8(I, KS, q) (the same
// for signed key bytes, each read as key + kS8Bias).
//
// Quantized keys are read as stored (int8 or nibbles, attention_kv.h) and
// scored against the query quantized to int8 (QuantizedQuery): an exact
// integer sum per group of 32 dimensions, then the groups' sums folded by
// their scales in order -- again a function of the query and the key alone.
// Quantized values are converted in registers and scaled before the same
// value sum.
//
// Why the results do not depend on the tiling: every score is one FMA chain
// over head_dim in order, d = 0, 1, ..., with the keys in the lanes (the K
// cache stores each block transposed, attention_kv.h), so no reduction
// follows it and every level computes the same chain; the softmax of a row
// touches only its own scores, over vectors aligned to the chunk start; each
// output element of the value sum is one chain over the keys in position
// order, and a tile row outside its own range adds exact zeros (0 * v + acc
// == acc for finite v).

// Where the chunk's keys are: the key vector of W keys starting at chunk
// offset j (a multiple of W) has dimension d at at(j)[d * stride].
template <typename T>
struct KeyVectors {
  const T* const* base;           // per vector: dimension 0 of its first key
  const uint16_t* const* scales;  // quantized keys: per vector, group 0's scales
  int64_t stride;                 // the cache's block size, or kAttnChunk in a gathered copy
  const T* at(int32_t j) const { return base[j / Ops::W]; }
};

// s[r][j0 + v * W + i] = q[r] . k(j0 + v * W + i) for R query rows and NK
// key vectors: one FMA chain per score over d in order, all W lanes stored
// (lanes outside a row's range are never read as scores: the softmax zeroes
// them, see softmax_row).
template <int R, int NK, typename T>
TD_FN void qk_tile(const float* const* q, const T* const* k, int64_t ks, int32_t hd, float* const* s, int32_t j0) {
  using V = typename Ops::V;
  V acc[R][NK];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < NK; ++v) acc[r][v] = Ops::zero();
  for (int32_t d = 0; d < hd; ++d) {
    V kv[NK];
    for (int v = 0; v < NK; ++v) kv[v] = Ops::load(k[v] + d * ks);
    for (int r = 0; r < R; ++r) {
      const V qd = Ops::bcast(q[r][d]);
      for (int v = 0; v < NK; ++v) acc[r][v] = Ops::fma(qd, kv[v], acc[r][v]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < NK; ++v) Ops::store(s[r] + j0 + v * Ops::W, acc[r][v]);
}

// The same for quantized keys: per group of 32 dimensions an exact integer
// dot product of the key's values with the quantized query (four dimensions
// per step, QuantizedQuery, attention_kv.h's words), then the groups' sums
// times the key's and the query's scales, groups in order. The integer
// operations take one operand unsigned: q4_0 nibbles are stored + 8, and a
// level may offset q8_0 keys by kS8Bias; the offset times the query's sum
// starts each group's sum, so every level computes the same integers.
template <int R, int NK, KvType KT>
TD_FN void qk_tile_q(const QuantizedQuery* qq, const uint8_t* const* k, const uint16_t* const* sc, int64_t ks,
                     int32_t hd, float* const* s, int32_t j0) {
  using V = typename Ops::V;
  using I = typename Ops::I;
  constexpr int32_t bias = KT == KvType::kQ4_0 ? 8 : Ops::kS8Bias;
  const int64_t row = 4 * ks;  // bytes from one row of words to the next
  V acc[R][NK];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < NK; ++v) acc[r][v] = Ops::zero();
  for (int32_t g = 0; g < hd / kKvGroup; ++g) {
    I part[R][NK];
    for (int r = 0; r < R; ++r) {
      const I start = Ops::ibcast(-bias * qq[r].sum[g]);
      for (int v = 0; v < NK; ++v) part[r][v] = start;
    }
    if constexpr (KT == KvType::kQ4_0) {  // a word: dimensions 8w..8w+3 low, 8w+4..8w+7 high
      for (int32_t w = 0; w < kKvGroup / 8; ++w) {
        typename Ops::KW lo[NK], hi[NK];
        for (int v = 0; v < NK; ++v) {
          const typename Ops::KW x = Ops::load_words(k[v] + (g * kKvGroup / 8 + w) * row);
          lo[v] = Ops::nibbles_lo(x);
          hi[v] = Ops::nibbles_hi(x);
        }
        for (int r = 0; r < R; ++r) {
          int32_t q0, q1;
          std::memcpy(&q0, qq[r].q + g * kKvGroup + 8 * w, 4);
          std::memcpy(&q1, qq[r].q + g * kKvGroup + 8 * w + 4, 4);
          for (int v = 0; v < NK; ++v) part[r][v] = Ops::dot_u8(Ops::dot_u8(part[r][v], lo[v], q0), hi[v], q1);
        }
      }
    } else {
      for (int32_t w = 0; w < kKvGroup / 4; ++w) {
        typename Ops::KS kv[NK];
        for (int v = 0; v < NK; ++v) kv[v] = Ops::signed_words(Ops::load_words(k[v] + (g * kKvGroup / 4 + w) * row));
        for (int r = 0; r < R; ++r) {
          int32_t q0;
          std::memcpy(&q0, qq[r].q + g * kKvGroup + 4 * w, 4);
          for (int v = 0; v < NK; ++v) part[r][v] = Ops::dot_s8(part[r][v], kv[v], q0);
        }
      }
    }
    for (int v = 0; v < NK; ++v) {
      const V scale = Ops::load(sc[v] + g * ks);
      for (int r = 0; r < R; ++r)
        acc[r][v] = Ops::fma(Ops::to_float(part[r][v]), Ops::mul(scale, Ops::bcast(qq[r].d[g])), acc[r][v]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < NK; ++v) Ops::store(s[r] + j0 + v * Ops::W, acc[r][v]);
}

// One tile of NK key vectors at j of either kind.
template <int R, int NK, KvType KT, typename T>
TD_FN void qk_any(const float* const* q, const QuantizedQuery* qq, const KeyVectors<T>& keys, int32_t hd,
                  float* const* s, int32_t j) {
  const T* k[NK];
  for (int v = 0; v < NK; ++v) k[v] = keys.at(j + v * Ops::W);
  if constexpr (kv_type_quantized(KT)) {
    const uint16_t* sc[NK];
    for (int v = 0; v < NK; ++v) sc[v] = keys.scales[(j + v * Ops::W) / Ops::W];
    qk_tile_q<R, NK, KT>(qq, k, sc, keys.stride, hd, s, j);
  } else {
    qk_tile<R, NK>(q, k, keys.stride, hd, s, j);
  }
}

// Rows [r0, r0 + R) with R <= Ops::QR, over the key vectors that cover
// [a, b) (chunk-relative).
template <int R, KvType KT, typename T>
TD_FN void qk_rows(const ChunkJob& job, int32_t r0, const KeyVectors<T>& keys, int32_t a, int32_t b) {
  constexpr int W = Ops::W, NK = kv_type_quantized(KT) ? Ops::QKQ : Ops::QK;
  const int32_t C = kAttnChunk, hd = job.head_dim;
  float* s[R];
  for (int r = 0; r < R; ++r) s[r] = job.scores + size_t(r0 + r) * C;
  const float* const* q = job.q + r0;
  const QuantizedQuery* qq = job.qq ? job.qq + r0 : nullptr;
  int32_t j = a / W * W;
  const int32_t end = (b + W - 1) / W * W;
  for (; j + NK * W <= end; j += NK * W) qk_any<R, NK, KT>(q, qq, keys, hd, s, j);
  const int32_t left = (end - j) / W;
  if constexpr (NK > 1)
    if (left == 1) qk_any<R, 1, KT>(q, qq, keys, hd, s, j);
  if constexpr (NK > 2)
    if (left == 2) qk_any<R, 2, KT>(q, qq, keys, hd, s, j);
  if constexpr (NK > 3)
    if (left == 3) qk_any<R, 3, KT>(q, qq, keys, hd, s, j);
  static_assert(NK <= 4, "the tail cases above cover 1..3 vectors");
}

// Lanes d .. d + W of a value row as floats (PART: the first n only, the
// rest zero). A quantized row (VT q8_0 / q4_0: llama.cpp's blocks, addressed
// as bytes) is converted and scaled by its group's scale; d is then a
// multiple of W inside one group, so PART never applies to it.
template <KvType VT, bool PART, typename T>
TD_FN typename Ops::V value_vector(const T* row, int32_t d, int32_t n) {
  if constexpr (kv_type_quantized(VT)) {
    constexpr int32_t BB = VT == KvType::kQ4_0 ? 18 : 34;  // bytes of one group
    const int32_t o = d % kKvGroup;
    const uint8_t* blk = row + d / kKvGroup * BB;
    uint16_t h;
    std::memcpy(&h, blk, 2);
    typename Ops::V x;
    if constexpr (VT == KvType::kQ4_0)
      x = o < 16 ? Ops::load_q4_lo(blk + 2 + o) : Ops::load_q4_hi(blk + 2 + o - 16);
    else
      x = Ops::load_i8(reinterpret_cast<const int8_t*>(blk + 2 + o));
    return Ops::mul(x, Ops::bcast_h(h));
  } else {
    return PART ? Ops::load_part(row + d, n) : Ops::load(row + d);
  }
}

// acc_out[r][d0 .. d0 + D*W) = sum over keys j in [a, b) of p[r][j] * v[j][..],
// in key order. PART: one vector of `n` (< W) lanes instead (D must be 1).
template <int R, int D, bool PART, KvType VT, typename T>
TD_FN void pv_tile(const T* const* v, int32_t a, int32_t b, const float* const* p, float* const* out, int32_t d0,
                   int32_t n) {
  using V = typename Ops::V;
  V acc[R][D];
  for (int r = 0; r < R; ++r)
    for (int i = 0; i < D; ++i) acc[r][i] = Ops::zero();
  for (int32_t j = a; j < b; ++j) {
    V w[R];
    for (int r = 0; r < R; ++r) w[r] = Ops::bcast(p[r][j]);
    for (int i = 0; i < D; ++i) {
      const V x = value_vector<VT, PART>(v[j], d0 + i * Ops::W, n);
      for (int r = 0; r < R; ++r) acc[r][i] = Ops::fma(w[r], x, acc[r][i]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int i = 0; i < D; ++i) {
      if (PART)
        Ops::store_part(out[r] + d0, acc[r][i], n);
      else
        Ops::store(out[r] + d0 + i * Ops::W, acc[r][i]);
    }
}

template <int R, KvType VT, typename T>
TD_FN void pv_rows(const T* const* v, int32_t a, int32_t b, const float* const* p, float* const* out, int32_t hdv) {
  int32_t d = 0;
  for (; d + Ops::PD * Ops::W <= hdv; d += Ops::PD * Ops::W) pv_tile<R, Ops::PD, false, VT>(v, a, b, p, out, d, 0);
  for (; d + Ops::W <= hdv; d += Ops::W) pv_tile<R, 1, false, VT>(v, a, b, p, out, d, 0);
  // Quantized heads are multiples of 32 elements, and so of W (attention_kv.h).
  if constexpr (!kv_type_quantized(VT))
    if (d < hdv) pv_tile<R, 1, true, VT>(v, a, b, p, out, d, hdv - d);
}

// pv_rows for n <= R rows.
template <int R, KvType VT, typename T>
TD_FN void pv_rows_n(int32_t n, const T* const* v, int32_t a, int32_t b, const float* const* p, float* const* out,
                     int32_t hdv) {
  if constexpr (R > 1)
    if (n < R) return pv_rows_n<R - 1, VT>(n, v, a, b, p, out, hdv);
  pv_rows<R, VT>(v, a, b, p, out, hdv);
}

// Turns row r's scores in [a, b) into exp(score - max) in place, zeroes
// [za, zb) outside [a, b) (the span the value tile will read), and returns
// the sum. The sum runs over vectors aligned to the chunk start, so it is a
// function of (a, b) and the scores alone.
TD_FN float softmax_row(float* s, int32_t a, int32_t b, int32_t za, int32_t zb, float* m_out) {
  using V = typename Ops::V;
  // m = s[a], then m = s[i] > m ? s[i] : m in any order: the same maximum
  // (a NaN first stays, later NaNs are skipped; which of two equal zeros
  // is kept does not change exp(s - m)). A scalar chain here was 10% of
  // prefill attention, one max latency per score.
  float m = s[a];
  if (b - a - 1 >= Ops::W) {
    V mv = Ops::bcast(m);
    for (int32_t i = a + 1; i + Ops::W <= b; i += Ops::W) mv = Ops::max(Ops::load(s + i), mv);
    mv = Ops::max(Ops::load(s + b - Ops::W), mv);  // the last W again: max is idempotent
    m = Ops::reduce_max(mv);
  } else {
    for (int32_t i = a + 1; i < b; ++i) m = s[i] > m ? s[i] : m;
  }
  const int32_t a0 = a / Ops::W * Ops::W, b1 = (b + Ops::W - 1) / Ops::W * Ops::W;
  const V mv = Ops::bcast(m);
  for (int32_t i = a0; i < b1; i += Ops::W) Ops::store(s + i, Ops::exp(Ops::sub(Ops::load(s + i), mv)));
  for (int32_t i = a0 < za ? a0 : za; i < a; ++i) s[i] = 0.0f;
  for (int32_t i = b; i < (b1 > zb ? b1 : zb); ++i) s[i] = 0.0f;
  V sum = Ops::zero();
  for (int32_t i = a0; i < b1; i += Ops::W) sum = Ops::add(sum, Ops::load(s + i));
  *m_out = m;
  return Ops::reduce(sum);
}

template <KvType KT, KvType VT>
TD_FN void run_chunk(const ChunkJob& job) {
  constexpr bool KQ = kv_type_quantized(KT);
  // Quantized keys are addressed as bytes (attention_kv.h's words).
  using KE = std::conditional_t<KQ, uint8_t, kv_elem_t<KT>>;
  // Quantized value rows are addressed as bytes (their blocks mix f16 and int8).
  using VE = std::conditional_t<kv_type_quantized(VT), uint8_t, kv_elem_t<VT>>;
  static_assert(Ops::QR >= 1 && Ops::QR <= 4 && Ops::PR >= 1, "the score row switch below covers 1..4");
  static_assert(kAttnChunk % Ops::W == 0, "softmax vectors must stay inside the chunk");
  const int32_t C = kAttnChunk, c0 = job.c0, n = job.n_rows;
  const KvLayerView& kv = *job.kv;
  int32_t ka = C, kb = 0;  // union of the rows' ranges, chunk-relative
  for (int32_t r = 0; r < n; ++r) {
    ka = job.lo[r] - c0 < ka ? job.lo[r] - c0 : ka;
    kb = job.hi[r] - c0 > kb ? job.hi[r] - c0 : kb;
  }
  // Value rows: one block lookup per block, consecutive slots a row apart.
  const VE* vp[kAttnChunk];
  const size_t v_row = kv_bytes(VT, size_t(kv.v_head)) / sizeof(VE);
  for (int32_t j = ka; j < kb;) {
    const VE* row = kv.value<VE>(c0 + j, job.kv_head);
    const int32_t in_block = kv.block_size - (c0 + j) % kv.block_size;
    const int32_t end = kb - j < in_block ? kb : j + in_block;
    for (; j < end; ++j, row += v_row) vp[j] = row;
  }
  // Key vectors straight from the cache when W consecutive slots of a block
  // hold them (the block size a multiple of W: always for 16-slot blocks,
  // and required of quantized caches); otherwise the chunk's keys are first
  // gathered into a [d][chunk] copy.
  constexpr int W = Ops::W;
  const int32_t va = ka / W * W, vb = (kb + W - 1) / W * W;
  const KE* kbase[kAttnChunk / W];
  const uint16_t* kscale[kAttnChunk / W];
  int64_t stride = kv.block_size;
  if (KQ || kv.block_size % W == 0) {
    for (int32_t j = va; j < vb; j += W) {
      if constexpr (KQ) {
        kbase[j / W] = kv.key_words(c0 + j, job.kv_head);
        kscale[j / W] = kv.key_scales(c0 + j, job.kv_head);
      } else {
        kbase[j / W] = kv.key_column<KE>(c0 + j, job.kv_head);
      }
    }
  } else if constexpr (!KQ) {
    thread_local std::vector<KE> copy;
    const int32_t hd = job.head_dim;
    copy.assign(size_t(hd) * C, KE{});
    for (int32_t j = ka; j < kb; ++j) {
      const KE* col = kv.key_column<KE>(c0 + j, job.kv_head);
      for (int32_t d = 0; d < hd; ++d) copy[size_t(d) * C + j] = col[size_t(d) * kv.block_size];
    }
    for (int32_t j = va; j < vb; j += W) kbase[j / W] = copy.data() + j;
    stride = C;
  }
  const KeyVectors<KE> keys{kbase, kscale, stride};

  // Row tiles cover consecutive rows; the driver orders rows by position, so
  // a tile's ranges nearly coincide.
  auto tile_range = [&](int32_t r0, int32_t R, int32_t& a, int32_t& b) {
    a = C;
    b = 0;
    for (int32_t r = r0; r < r0 + R; ++r) {
      a = job.lo[r] - c0 < a ? job.lo[r] - c0 : a;
      b = job.hi[r] - c0 > b ? job.hi[r] - c0 : b;
    }
  };
  for (int32_t r0 = 0; r0 < n; r0 += Ops::QR) {
    const int32_t R = n - r0 < Ops::QR ? n - r0 : Ops::QR;
    int32_t a, b;
    tile_range(r0, R, a, b);
    switch (R) {
      case 1: qk_rows<1, KT>(job, r0, keys, a, b); break;
      case 2: if constexpr (Ops::QR >= 2) qk_rows<2, KT>(job, r0, keys, a, b); break;
      case 3: if constexpr (Ops::QR >= 3) qk_rows<3, KT>(job, r0, keys, a, b); break;
      default: if constexpr (Ops::QR >= 4) qk_rows<Ops::QR, KT>(job, r0, keys, a, b); break;
    }
  }

  for (int32_t r0 = 0; r0 < n; r0 += Ops::PR) {
    const int32_t R = n - r0 < Ops::PR ? n - r0 : Ops::PR;
    int32_t a, b;
    tile_range(r0, R, a, b);
    const float* p[Ops::PR];
    float* out[Ops::PR];
    for (int32_t r = r0; r < r0 + R; ++r) {
      float* s = job.scores + size_t(r) * C;
      job.l[r] = softmax_row(s, job.lo[r] - c0, job.hi[r] - c0, a, b, &job.m[r]);
      p[r - r0] = s;
      out[r - r0] = job.acc + size_t(r) * job.head_dim_v;
    }
    pv_rows_n<Ops::PR, VT>(R, vp, a, b, p, out, job.head_dim_v);
  }
}

template <KvType KT>
TD_FN void chunk_kernel_k(const ChunkJob& job) {
  switch (job.kv->v_type) {
    case KvType::kF16: return run_chunk<KT, KvType::kF16>(job);
    case KvType::kF32: return run_chunk<KT, KvType::kF32>(job);
    case KvType::kQ8_0: return run_chunk<KT, KvType::kQ8_0>(job);
    case KvType::kQ4_0: return run_chunk<KT, KvType::kQ4_0>(job);
  }
}

TD_FN void chunk_kernel(const ChunkJob& job) {
  switch (job.kv->k_type) {
    case KvType::kF16: return chunk_kernel_k<KvType::kF16>(job);
    case KvType::kF32: return chunk_kernel_k<KvType::kF32>(job);
    case KvType::kQ8_0: return chunk_kernel_k<KvType::kQ8_0>(job);
    case KvType::kQ4_0: return chunk_kernel_k<KvType::kQ4_0>(job);
  }
}

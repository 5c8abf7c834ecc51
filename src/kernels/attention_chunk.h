// The chunk kernel of attention_impl.h, written once over a vector "Ops"
// type and included by each instruction-set file inside its own namespace
// (after defining Ops and TD_FN, the function attributes of that level):
// attention_ref.cpp, attention_avx2.cpp, attention_avx512.cpp. No includes
// here: the includer provides them.
//
// Ops provides: V (vector of W floats), W, zero(), bcast(f),
// load(const float*), load(const uint16_t*) (f16 -> f32), load_part(p, n)
// for both (lanes >= n are zero), store(float*, V), store_part(float*, V, n),
// add(V, V), sub(V, V), mul(V, V), abs(V), fma(a, b, c) = a*b+c, reduce(V)
// (fixed lane order), max(x, m) = lane-wise x > m ? x : m, reduce_max(V),
// exp(V); tile sizes QR x QK for scores (rows x vectors of W keys), QKQ
// vectors for quantized keys, PR x PD for the value sum (rows x vectors),
// PRQ x PDQ for quantized values' (PRQ <= PR). For the quantized types: I (W int32), ibcast(int), iadd(I, I),
// ireduce(I), to_float(I), round_int(V) (to nearest, ties to even),
// store_i8(int8_t*, I) (W lanes in [-127, 127]), KW (W words of 4 bytes)
// and load_words(p), nibbles_lo / nibbles_hi(KW) (each byte's low / high
// nibble), dot_u8(I, KW, q) (per lane: + the 4 unsigned bytes times the 4
// signed bytes of q), KS / signed_words(KW) / dot_s8(I, KS, q) (the same
// for signed bytes, each read as the byte + kS8Bias).
//
// Quantized keys are read as stored (int8 or nibbles, attention_kv.h) and
// scored against the query quantized to int8 (QuantizedQuery): an exact
// integer sum per group of 32 dimensions, then the groups' sums folded by
// their scales in order -- again a function of the query and the key alone.
// Quantized values are summed the same way, the softmax weights in the
// role of the query (quantize_weights, pv_tile_q).
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

// The next chunk's K and V regions, asked for a few lines at a time between
// this chunk's tiles: reads that overlap the arithmetic, where one burst of
// prefetches would wait for free miss buffers with nothing else to do.
struct Prefetch {
  const std::byte* region[2 * kAttnChunk];
  size_t bytes[2 * kAttnChunk];
  int32_t n = 0, i = 0;
  size_t at = 0;
  int32_t lines = 0;  // in all
  void add(const std::byte* p, size_t b) {
    region[n] = p;
    bytes[n++] = b;
    lines += static_cast<int32_t>((b + 63) / 64);
  }
  void step(int32_t count) {
    for (; count > 0 && i < n; --count) {
      __builtin_prefetch(region[i] + at, 0, 1);
      if ((at += 64) >= bytes[i]) {
        at = 0;
        ++i;
      }
    }
  }
  void rest() { step(lines); }
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
TD_FN void qk_rows(const ChunkJob& job, int32_t r0, const KeyVectors<T>& keys, int32_t a, int32_t b, Prefetch& pf,
                   int32_t pf_per_tile) {
  constexpr int W = Ops::W, NK = kv_type_quantized(KT) ? Ops::QKQ : Ops::QK;
  const int32_t C = kAttnChunk, hd = job.head_dim;
  float* s[R];
  for (int r = 0; r < R; ++r) s[r] = job.scores + size_t(r0 + r) * C;
  const float* const* q = job.q + r0;
  const QuantizedQuery* qq = job.qq ? job.qq + r0 : nullptr;
  int32_t j = a / W * W;
  const int32_t end = (b + W - 1) / W * W;
  for (; j + NK * W <= end; j += NK * W) {
    qk_any<R, NK, KT>(q, qq, keys, hd, s, j);
    pf.step(pf_per_tile);
  }
  const int32_t left = (end - j) / W;
  if constexpr (NK > 1)
    if (left == 1) qk_any<R, 1, KT>(q, qq, keys, hd, s, j);
  if constexpr (NK > 2)
    if (left == 2) qk_any<R, 2, KT>(q, qq, keys, hd, s, j);
  if constexpr (NK > 3)
    if (left == 3) qk_any<R, 3, KT>(q, qq, keys, hd, s, j);
  static_assert(NK <= 4, "the tail cases above cover 1..3 vectors");
}

// acc_out[r][d0 .. d0 + D*W) = sum over keys j in [a, b) of p[r][j] * v[j][..],
// in key order. PART: one vector of `n` (< W) lanes instead (D must be 1).
template <int R, int D, bool PART, typename T>
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
      const T* row = v[j] + d0 + i * Ops::W;
      const V x = PART ? Ops::load_part(row, n) : Ops::load(row);
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

template <int R, typename T>
TD_FN void pv_rows(const T* const* v, int32_t a, int32_t b, const float* const* p, float* const* out, int32_t hdv) {
  int32_t d = 0;
  for (; d + Ops::PD * Ops::W <= hdv; d += Ops::PD * Ops::W) pv_tile<R, Ops::PD, false>(v, a, b, p, out, d, 0);
  for (; d + Ops::W <= hdv; d += Ops::W) pv_tile<R, 1, false>(v, a, b, p, out, d, 0);
  if (d < hdv) pv_tile<R, 1, true>(v, a, b, p, out, d, hdv - d);
}

// pv_rows for n <= R rows.
template <int R, typename T>
TD_FN void pv_rows_n(int32_t n, const T* const* v, int32_t a, int32_t b, const float* const* p, float* const* out,
                     int32_t hdv) {
  if constexpr (R > 1)
    if (n < R) return pv_rows_n<R - 1>(n, v, a, b, p, out, hdv);
  pv_rows<R>(v, a, b, p, out, hdv);
}

// The value sum over quantized V. Per row, group g of 32 dimensions and run
// of kWeightRun positions (aligned to the chunk), the weights times the
// values' scales, x[j] = p[j] * d_g(j), are quantized to int8 with one scale
// (max |x| / 127, to nearest with ties to even): llama.cpp's q8_0 applied to
// the weights, as quantize_query is to the query. Each run's integer sum over
// its words (4 slots each, attention_kv.h) is exact; its float value, times
// the run's scale, is added to the row's sums, runs in order. A row's weights
// are zero outside its range, so what a run adds is a function of the row
// and the cache alone.

// One row's weights p[za, zb) (za, zb multiples of kWeightRun) against the
// values' scales vs[g][j] (groups x kAttnChunk floats, zero where no value
// is read): q[g][j] int8, and per group and run the scale and the sum of q.
TD_FN void quantize_weights(const float* p, const float* vs, int32_t groups, int32_t za, int32_t zb, int8_t* q,
                            float* scale, int32_t* sum) {
  using V = typename Ops::V;
  constexpr int32_t C = kAttnChunk, RUN = kWeightRun;
  for (int32_t g = 0; g < groups; ++g) {
    const float* d = vs + size_t(g) * C;
    for (int32_t j0 = za; j0 < zb; j0 += RUN) {
      V mx = Ops::zero();
      for (int32_t j = j0; j < j0 + RUN; j += Ops::W)
        mx = Ops::max(Ops::abs(Ops::mul(Ops::load(p + j), Ops::load(d + j))), mx);
      float m = Ops::reduce_max(mx);
      if (!(m >= kMinRunWeight)) m = 0.0f;  // the run adds nothing (attention_impl.h)
      const V inv = Ops::bcast(m > 0.0f ? 127.0f / m : 0.0f);
      typename Ops::I total = Ops::ibcast(0);
      for (int32_t j = j0; j < j0 + RUN; j += Ops::W) {
        const typename Ops::I x = Ops::round_int(Ops::mul(Ops::mul(Ops::load(p + j), Ops::load(d + j)), inv));
        Ops::store_i8(q + size_t(g) * C + j, x);
        total = Ops::iadd(total, x);
      }
      scale[g * (C / RUN) + j0 / RUN] = m / 127.0f;
      sum[g * (C / RUN) + j0 / RUN] = Ops::ireduce(total);
    }
  }
}

// The value sums of R rows over the value words of slots [qa, qb)
// (multiples of 4): words[i] is the row of words of slots 4i..4i+3, q /
// scale / sum the rows' quantize_weights output. D vectors of W words from
// word v0 * W of each row: a q8_0 word vector is W dimensions, a q4_0 one
// two (its low nibbles W dimensions of a group of 32, its high nibbles the
// W dimensions 16 further on; attention_kv.h). The rows of words are read
// in address order; the float sums live in out, one update per run.
template <int R, int D, KvType VT>
TD_FN void pv_tile_q(const uint8_t* const* words, int32_t qa, int32_t qb, const int8_t* const* q,
                     const float* const* scale, const int32_t* const* sum, float* const* out, int32_t v0) {
  using I = typename Ops::I;
  constexpr bool Q4 = VT == KvType::kQ4_0;
  constexpr int NO = Q4 ? 2 : 1;  // output vectors per word vector
  constexpr int32_t bias = Q4 ? 8 : Ops::kS8Bias;
  constexpr int32_t C = kAttnChunk, RUN = kWeightRun, W = Ops::W;
  int32_t g[D], o[D][NO];  // each word vector's group and output dimensions
  for (int i = 0; i < D; ++i) {
    const int32_t wv = (v0 + i) * W;  // its first word in the row
    g[i] = Q4 ? wv / 16 : wv / kKvGroup;
    o[i][0] = Q4 ? g[i] * kKvGroup + wv % 16 : wv;
    if constexpr (Q4) o[i][NO - 1] = o[i][0] + 16;
  }
  for (int r = 0; r < R; ++r)
    for (int i = 0; i < D; ++i)
      for (int k = 0; k < NO; ++k) Ops::store(out[r] + o[i][k], Ops::zero());
  for (int32_t j0 = qa / RUN * RUN; j0 < qb; j0 += RUN) {
    I part[R][D][NO];
    for (int r = 0; r < R; ++r)
      for (int i = 0; i < D; ++i)
        for (int k = 0; k < NO; ++k) part[r][i][k] = Ops::ibcast(-bias * sum[r][g[i] * (C / RUN) + j0 / RUN]);
    const int32_t end = j0 + RUN < qb ? j0 + RUN : qb;
    for (int32_t j = j0 > qa ? j0 : qa; j < end; j += 4) {
      const uint8_t* w = words[j / 4] + size_t(v0) * W * 4;
      if constexpr (Q4) {
        typename Ops::KW lo[D], hi[D];
        for (int i = 0; i < D; ++i) {
          const typename Ops::KW x = Ops::load_words(w + i * W * 4);
          lo[i] = Ops::nibbles_lo(x);
          hi[i] = Ops::nibbles_hi(x);
        }
        for (int r = 0; r < R; ++r)
          for (int i = 0; i < D; ++i) {
            int32_t q0;
            std::memcpy(&q0, q[r] + size_t(g[i]) * C + j, 4);
            part[r][i][0] = Ops::dot_u8(part[r][i][0], lo[i], q0);
            part[r][i][NO - 1] = Ops::dot_u8(part[r][i][NO - 1], hi[i], q0);
          }
      } else {
        typename Ops::KS x[D];
        for (int i = 0; i < D; ++i) x[i] = Ops::signed_words(Ops::load_words(w + i * W * 4));
        for (int r = 0; r < R; ++r)
          for (int i = 0; i < D; ++i) {
            int32_t q0;
            std::memcpy(&q0, q[r] + size_t(g[i]) * C + j, 4);
            part[r][i][0] = Ops::dot_s8(part[r][i][0], x[i], q0);
          }
      }
    }
    for (int r = 0; r < R; ++r)
      for (int i = 0; i < D; ++i) {
        const auto s = Ops::bcast(scale[r][g[i] * (C / RUN) + j0 / RUN]);
        for (int k = 0; k < NO; ++k) {
          float* to = out[r] + o[i][k];
          Ops::store(to, Ops::fma(Ops::to_float(part[r][i][k]), s, Ops::load(to)));
        }
      }
  }
}

// pv_tile_q over the whole head (a multiple of 32 elements) for n <= R rows.
template <int R, KvType VT>
TD_FN void pv_rows_q(int32_t n, const uint8_t* const* words, int32_t qa, int32_t qb, const int8_t* const* q,
                     const float* const* scale, const int32_t* const* sum, float* const* out, int32_t hdv) {
  if constexpr (R > 1)
    if (n < R) return pv_rows_q<R - 1, VT>(n, words, qa, qb, q, scale, sum, out, hdv);
  constexpr bool Q4 = VT == KvType::kQ4_0;
  constexpr int D = Q4 ? (Ops::PDQ > 1 ? Ops::PDQ / 2 : 1) : Ops::PDQ;
  const int32_t nv = (Q4 ? hdv / 2 : hdv) / Ops::W;  // word vectors in a row
  int32_t v = 0;
  for (; v + D <= nv; v += D) pv_tile_q<R, D, VT>(words, qa, qb, q, scale, sum, out, v);
  for (; v < nv; ++v) pv_tile_q<R, 1, VT>(words, qa, qb, q, scale, sum, out, v);
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
  constexpr bool VQ = kv_type_quantized(VT);
  using VE = std::conditional_t<VQ, uint8_t, kv_elem_t<VT>>;  // unused for VQ
  static_assert(Ops::QR >= 1 && Ops::QR <= 4 && Ops::PR >= 1, "the score row switch below covers 1..4");
  static_assert(kAttnChunk % Ops::W == 0, "softmax vectors must stay inside the chunk");
  const int32_t C = kAttnChunk, c0 = job.c0, n = job.n_rows;
  const KvLayerView& kv = *job.kv;
  int32_t ka = C, kb = 0;  // union of the rows' ranges, chunk-relative
  for (int32_t r = 0; r < n; ++r) {
    ka = job.lo[r] - c0 < ka ? job.lo[r] - c0 : ka;
    kb = job.hi[r] - c0 > kb ? job.hi[r] - c0 : kb;
  }
  constexpr int W = Ops::W, RUN = kWeightRun;
  // Value rows: one block lookup per block, consecutive slots a row apart.
  // Quantized values: the rows of words over the chunk's slots, and below
  // their scales as floats over the runs covering [ka, kb), zero outside it
  // (slots there may never have been written; their codes are read, but only
  // times zero weights, which is exact).
  const VE* vp[kAttnChunk];
  const uint8_t* vwords[kAttnChunk / 4];
  constexpr int32_t per_row = 4;  // slots per row of value words
  const int32_t groups = kv.v_head / kKvGroup;
  if constexpr (VQ) {
    // Asked for now, read after the scores: a chunk reads a block's words a
    // few lines at a time, a pattern the hardware prefetchers do not run
    // ahead of.
    for (int32_t j = ka / per_row * per_row; j < kb; j += per_row) vwords[j / per_row] = kv.value_words(c0 + j, job.kv_head);
    for (int32_t p = (c0 + ka) / kv.block_size * kv.block_size; !job.warm && p < c0 + kb; p += kv.block_size) {
      const std::byte* v = kv.v_block(p, job.kv_head);
      for (size_t o = 0; o < kv.v_region(); o += 64) __builtin_prefetch(v + o, 0, 1);
    }
  } else {
    const size_t v_row = kv_bytes(VT, size_t(kv.v_head)) / sizeof(VE);
    for (int32_t j = ka; j < kb;) {
      const VE* row = kv.value<VE>(c0 + j, job.kv_head);
      const int32_t in_block = kv.block_size - (c0 + j) % kv.block_size;
      const int32_t end = kb - j < in_block ? kb : j + in_block;
      for (; j < end; ++j, row += v_row) vp[j] = row;
    }
  }
  // Key vectors straight from the cache when W consecutive slots of a block
  // hold them (the block size a multiple of W: always for 16-slot blocks,
  // and required of quantized caches); otherwise the chunk's keys are first
  // gathered into a [d][chunk] copy.
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
  // Half of the next chunk's lines during the scores (one tile of keys at a
  // time), half during the value sums (a row at a time).
  Prefetch pf;
  for (int32_t p = c0 + C; p < job.next_hi; p += kv.block_size) {
    pf.add(kv.k_block(p, job.kv_head), kv.k_region());
    pf.add(kv.v_block(p, job.kv_head), kv.v_region());
  }
  const int32_t qk_tiles = (n + Ops::QR - 1) / Ops::QR * ((kb - ka) / (W * (KQ ? Ops::QKQ : Ops::QK)) + 1);
  const int32_t pf_qk = (pf.lines / 2 + qk_tiles - 1) / qk_tiles;
  const int32_t pf_row = (pf.lines / 2 + n - 1) / n + 1;
  for (int32_t r0 = 0; r0 < n; r0 += Ops::QR) {
    const int32_t R = n - r0 < Ops::QR ? n - r0 : Ops::QR;
    int32_t a, b;
    tile_range(r0, R, a, b);
    switch (R) {
      case 1: qk_rows<1, KT>(job, r0, keys, a, b, pf, pf_qk); break;
      case 2: if constexpr (Ops::QR >= 2) qk_rows<2, KT>(job, r0, keys, a, b, pf, pf_qk); break;
      case 3: if constexpr (Ops::QR >= 3) qk_rows<3, KT>(job, r0, keys, a, b, pf, pf_qk); break;
      default: if constexpr (Ops::QR >= 4) qk_rows<Ops::QR, KT>(job, r0, keys, a, b, pf, pf_qk); break;
    }
  }

  // Quantized values: the scales as floats (read after the scores, so that
  // the prefetches above have landed) and room for a row tile's weights.
  thread_local std::vector<float> vscale;
  thread_local std::vector<int8_t> wq;
  thread_local std::vector<float> wscale;
  thread_local std::vector<int32_t> wsum;
  if constexpr (VQ) {
    wq.resize(size_t(Ops::PR) * groups * C);
    wscale.resize(size_t(Ops::PR) * groups * (C / RUN));
    wsum.resize(wscale.size());
    vscale.resize(size_t(groups) * C);
    const size_t bs = size_t(kv.block_size);
    for (int32_t j = ka / RUN * RUN; j < (kb + RUN - 1) / RUN * RUN; j += W) {
      float* to = vscale.data() + j;
      if (j >= ka && j + W <= kb) {  // W slots of one block (quantized blocks hold multiples of 16)
        const uint16_t* from = kv.value_scales(c0 + j, job.kv_head);
        for (int32_t g = 0; g < groups; ++g) Ops::store(to + size_t(g) * C, Ops::load(from + g * bs));
        continue;
      }
      for (int32_t g = 0; g < groups; ++g) {
        uint16_t h[W];
        for (int32_t i = 0; i < W; ++i)
          h[i] = j + i >= ka && j + i < kb ? kv.value_scales(c0 + j + i, job.kv_head)[g * bs] : 0;
        Ops::store(to + size_t(g) * C, Ops::load(h));
      }
    }
  }
  for (int32_t r0 = 0; r0 < n; r0 += Ops::PR) {
    const int32_t R = n - r0 < Ops::PR ? n - r0 : Ops::PR;
    int32_t a, b;
    tile_range(r0, R, a, b);
    // Quantized values read whole runs of weights: zero them over the runs.
    const int32_t za = VQ ? a / RUN * RUN : a, zb = VQ ? (b + RUN - 1) / RUN * RUN : b;
    const float* p[Ops::PR];
    float* out[Ops::PR];
    const int8_t* q[Ops::PR];
    const float* qs[Ops::PR];
    const int32_t* qsum[Ops::PR];
    for (int32_t r = r0; r < r0 + R; ++r) {
      float* s = job.scores + size_t(r) * C;
      job.l[r] = softmax_row(s, job.lo[r] - c0, job.hi[r] - c0, za, zb, &job.m[r]);
      pf.step(pf_row);
      p[r - r0] = s;
      out[r - r0] = job.acc + size_t(r) * job.head_dim_v;
      if constexpr (VQ) {
        const size_t i = r - r0;
        int8_t* wq_i = wq.data() + i * groups * C;
        float* ws_i = wscale.data() + i * groups * (C / RUN);
        int32_t* wsum_i = wsum.data() + i * groups * (C / RUN);
        quantize_weights(s, vscale.data(), groups, za, zb, wq_i, ws_i, wsum_i);
        q[i] = wq_i;
        qs[i] = ws_i;
        qsum[i] = wsum_i;
      }
    }
    if constexpr (VQ)
      for (int32_t i = 0; i < R; i += Ops::PRQ)
        pv_rows_q<Ops::PRQ, VT>(R - i < Ops::PRQ ? R - i : Ops::PRQ, vwords, a / per_row * per_row,
                                (b + per_row - 1) / per_row * per_row, q + i, qs + i, qsum + i, out + i,
                                job.head_dim_v);
    else
      pv_rows_n<Ops::PR>(R, vp, a, b, p, out, job.head_dim_v);
  }
  pf.rest();
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

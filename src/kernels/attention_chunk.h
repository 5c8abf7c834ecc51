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
// PR x PD for the value sum (rows x vectors).
//
// Quantized keys are read as stored (int8 or nibbles, attention_kv.h): each
// score is one FMA chain per group of 32 dimensions, then the groups' sums
// folded by their scales in order -- again a function of the query and the
// key alone. Quantized values are converted in registers and scaled before
// the same value sum.
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

// The same for quantized keys (T: int8_t for q8_0, uint8_t for q4_0): per
// group of 32 dimensions an FMA chain over d in order, then the group sums
// times their scales, groups in order.
template <int R, int NK, typename T>
TD_FN void qk_tile_q(const float* const* q, const T* const* k, const uint16_t* const* sc, int64_t ks, int32_t hd,
                     float* const* s, int32_t j0) {
  using V = typename Ops::V;
  V acc[R][NK];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < NK; ++v) acc[r][v] = Ops::zero();
  for (int32_t g = 0; g < hd; g += kKvGroup) {
    V part[R][NK];
    for (int r = 0; r < R; ++r)
      for (int v = 0; v < NK; ++v) part[r][v] = Ops::zero();
    if constexpr (std::is_same_v<T, uint8_t>) {  // q4_0: two dimensions a byte
      for (int32_t d = g; d < g + kKvGroup; d += 2) {
        V lo[NK], hi[NK];
        for (int v = 0; v < NK; ++v) {
          const T* p = k[v] + d / 2 * ks;
          lo[v] = Ops::load_q4_lo(p);
          hi[v] = Ops::load_q4_hi(p);
        }
        for (int r = 0; r < R; ++r) {
          const V q0 = Ops::bcast(q[r][d]), q1 = Ops::bcast(q[r][d + 1]);
          for (int v = 0; v < NK; ++v) part[r][v] = Ops::fma(q1, hi[v], Ops::fma(q0, lo[v], part[r][v]));
        }
      }
    } else {
      for (int32_t d = g; d < g + kKvGroup; ++d) {
        V kv[NK];
        for (int v = 0; v < NK; ++v) kv[v] = Ops::load_i8(k[v] + d * ks);
        for (int r = 0; r < R; ++r) {
          const V qd = Ops::bcast(q[r][d]);
          for (int v = 0; v < NK; ++v) part[r][v] = Ops::fma(qd, kv[v], part[r][v]);
        }
      }
    }
    for (int v = 0; v < NK; ++v) {
      const V scale = Ops::load(sc[v] + g / kKvGroup * ks);
      for (int r = 0; r < R; ++r) acc[r][v] = Ops::fma(scale, part[r][v], acc[r][v]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < NK; ++v) Ops::store(s[r] + j0 + v * Ops::W, acc[r][v]);
}

// One tile of NK key vectors at j of either kind.
template <int R, int NK, bool Q, typename T>
TD_FN void qk_any(const float* const* q, const KeyVectors<T>& keys, int32_t hd, float* const* s, int32_t j) {
  const T* k[NK];
  for (int v = 0; v < NK; ++v) k[v] = keys.at(j + v * Ops::W);
  if constexpr (Q) {
    const uint16_t* sc[NK];
    for (int v = 0; v < NK; ++v) sc[v] = keys.scales[(j + v * Ops::W) / Ops::W];
    qk_tile_q<R, NK>(q, k, sc, keys.stride, hd, s, j);
  } else {
    qk_tile<R, NK>(q, k, keys.stride, hd, s, j);
  }
}

// Rows [r0, r0 + R) with R <= Ops::QR, over the key vectors that cover
// [a, b) (chunk-relative).
template <int R, bool Q, typename T>
TD_FN void qk_rows(const ChunkJob& job, int32_t r0, const KeyVectors<T>& keys, int32_t a, int32_t b) {
  constexpr int W = Ops::W, NK = Q ? Ops::QKQ : Ops::QK;
  const int32_t C = kAttnChunk, hd = job.head_dim;
  float* s[R];
  for (int r = 0; r < R; ++r) s[r] = job.scores + size_t(r0 + r) * C;
  const float* const* q = job.q + r0;
  int32_t j = a / W * W;
  const int32_t end = (b + W - 1) / W * W;
  for (; j + NK * W <= end; j += NK * W) qk_any<R, NK, Q>(q, keys, hd, s, j);
  const int32_t left = (end - j) / W;
  if constexpr (NK > 1)
    if (left == 1) qk_any<R, 1, Q>(q, keys, hd, s, j);
  if constexpr (NK > 2)
    if (left == 2) qk_any<R, 2, Q>(q, keys, hd, s, j);
  if constexpr (NK > 3)
    if (left == 3) qk_any<R, 3, Q>(q, keys, hd, s, j);
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
  using KE = kv_elem_t<KT>;
  // Quantized value rows are addressed as bytes (their blocks mix f16 and int8).
  using VE = std::conditional_t<kv_type_quantized(VT), uint8_t, kv_elem_t<VT>>;
  constexpr bool KQ = kv_type_quantized(KT);
  static_assert(Ops::QR >= 1 && Ops::QR <= 4 && Ops::PR >= 1 && Ops::PR <= 4, "the row switches below cover 1..4");
  static_assert(kAttnChunk % Ops::W == 0, "softmax vectors must stay inside the chunk");
  const int32_t C = kAttnChunk, c0 = job.c0, n = job.n_rows;
  const KvLayerView& kv = *job.kv;
  int32_t ka = C, kb = 0;  // union of the rows' ranges, chunk-relative
  for (int32_t r = 0; r < n; ++r) {
    ka = job.lo[r] - c0 < ka ? job.lo[r] - c0 : ka;
    kb = job.hi[r] - c0 > kb ? job.hi[r] - c0 : kb;
  }
  const VE* vp[kAttnChunk];
  for (int32_t j = ka; j < kb; ++j) vp[j] = kv.value<VE>(c0 + j, job.kv_head);
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
      kbase[j / W] = kv.key_column<KE>(c0 + j, job.kv_head);
      if constexpr (KQ) kscale[j / W] = kv.key_scales(c0 + j, job.kv_head);
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
      case 1: qk_rows<1, KQ>(job, r0, keys, a, b); break;
      case 2: if constexpr (Ops::QR >= 2) qk_rows<2, KQ>(job, r0, keys, a, b); break;
      case 3: if constexpr (Ops::QR >= 3) qk_rows<3, KQ>(job, r0, keys, a, b); break;
      default: if constexpr (Ops::QR >= 4) qk_rows<Ops::QR, KQ>(job, r0, keys, a, b); break;
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
    switch (R) {
      case 1: pv_rows<1, VT>(vp, a, b, p, out, job.head_dim_v); break;
      case 2: if constexpr (Ops::PR >= 2) pv_rows<2, VT>(vp, a, b, p, out, job.head_dim_v); break;
      case 3: if constexpr (Ops::PR >= 3) pv_rows<3, VT>(vp, a, b, p, out, job.head_dim_v); break;
      default: if constexpr (Ops::PR >= 4) pv_rows<Ops::PR, VT>(vp, a, b, p, out, job.head_dim_v); break;
    }
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

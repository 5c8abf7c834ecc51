// Attention over the paged K/V cache, read in place through each sequence's
// block table (the CPU KvCache layout, kv/kv_cache.h).
//
// Both kernels are online-softmax ("flash") loops over key chunks whose
// boundaries are absolute positions (multiples of the chunk size), with
// every score one FMA chain over the head dimension in order and every
// output element one chain over the chunk's keys in order. A query's result
// therefore depends only on its own query, position and K/V: not on which
// rows share its tile or its launch.
//
// Prefill: a block takes one query head and a tile of up to 32 consecutive
// queries of one sequence; chunks of 32 keys go through shared memory.
// Decode: a block takes one row, one KV head (all its query heads) and one
// of kDecodeSplits parts of the positions (chunk c of 64 to part c % 16);
// the last block of a (row, KV head) to finish folds the parts in order.
#include <cfloat>

#include "cuda/device_common.cuh"

namespace tandem::cuda {

namespace {

constexpr int kThreads = 128;
constexpr int kTQ = kPrefillTileRows;  // queries per prefill tile
constexpr int kTK = 32;                // keys per prefill chunk
static_assert(kTQ * 4 == kThreads, "four threads per query");

template <bool kF16>
__device__ __forceinline__ float kv_load(const void* base, size_t idx) {
  if constexpr (kF16) return f16_bits_to_float(static_cast<const uint16_t*>(base)[idx]);
  else return static_cast<const float*>(base)[idx];
}

// Element offsets of position p's key (dimension 0; dimension d is d *
// block_size further) and value row for KV head g.
__device__ __forceinline__ size_t key_at(const AttnArgs& a, const int32_t* table, int g, int32_t p) {
  return (size_t(g) * a.n_blocks + table[p / a.block_size]) * a.block_size * a.head_dim + p % a.block_size;
}
__device__ __forceinline__ size_t value_at(const AttnArgs& a, const int32_t* table, int g, int32_t p) {
  return (size_t(g) * a.n_blocks + table[p / a.block_size]) * a.block_size * a.head_dim_v +
         size_t(p % a.block_size) * a.head_dim_v;
}

size_t prefill_smem(int hd, int hdv) {
  return sizeof(float) * (size_t(kTQ) * (hd + 1) + size_t(kTK) * (hd + 1) + size_t(kTK) * hdv + size_t(kTQ) * (kTK + 1));
}

// ACC: value dimensions per thread (head_dim_v / 4, rounded up to the
// instantiation's size).
template <bool kF16, int ACC>
__global__ void __launch_bounds__(kThreads) prefill_kernel(AttnArgs a, const PrefillTile* tiles) {
  extern __shared__ float smem[];
  const int hd = a.head_dim, hdv = a.head_dim_v;
  float* Qs = smem;                  // [kTQ][hd + 1]
  float* Ks = Qs + kTQ * (hd + 1);   // [kTK][hd + 1]
  float* Vs = Ks + kTK * (hd + 1);   // [kTK][hdv]
  float* Ps = Vs + kTK * hdv;        // [kTQ][kTK + 1]
  pdl_launch_dependents();
  pdl_wait();
  const PrefillTile tile = tiles[blockIdx.x];
  const int h = blockIdx.y, g = h / (a.n_head / a.n_head_kv);
  const int t = threadIdx.x, qi = t >> 2, sub = t & 3;
  const int32_t pos0 = a.pos[tile.row0];
  const int32_t* table = a.tables + int64_t{a.seq[tile.row0]} * a.table_ld;

  for (int idx = t; idx < kTQ * hd; idx += kThreads) {
    const int r = idx / hd, d = idx % hd;
    Qs[r * (hd + 1) + d] = r < tile.n ? a.q[int64_t(tile.row0 + r) * a.q_ld + int64_t(h) * hd + d] : 0.0f;
  }
  const bool qvalid = qi < tile.n;
  const int32_t qp = pos0 + qi;
  const int32_t q_lo = a.window > 0 ? max(0, qp - a.window + 1) : 0;
  const int32_t tile_lo = a.window > 0 ? max(0, pos0 - a.window + 1) : 0;
  const int32_t tile_hi = pos0 + tile.n - 1;

  float m = -INFINITY, l = 0.0f;
  float acc[ACC];
#pragma unroll
  for (int j = 0; j < ACC; ++j) acc[j] = 0.0f;

  for (int32_t c = tile_lo / kTK; c <= tile_hi / kTK; ++c) {
    const int32_t kp0 = c * kTK;
    __syncthreads();  // the previous chunk's K, V and P are consumed (and Q is loaded)
    for (int idx = t; idx < kTK * hd; idx += kThreads) {
      const int kj = idx % kTK, d = idx / kTK;
      const int32_t kp = kp0 + kj;
      Ks[kj * (hd + 1) + d] = kp <= tile_hi ? kv_load<kF16>(a.k_cache, key_at(a, table, g, kp) + size_t(d) * a.block_size) : 0.0f;
    }
    for (int idx = t; idx < kTK * hdv; idx += kThreads) {
      const int d = idx % hdv, kj = idx / hdv;
      const int32_t kp = kp0 + kj;
      Vs[kj * hdv + d] = kp <= tile_hi ? kv_load<kF16>(a.v_cache, value_at(a, table, g, kp) + d) : 0.0f;
    }
    __syncthreads();

    // Scores of keys sub, sub + 4, ... for this thread's query.
    float s[kTK / 4];
#pragma unroll
    for (int i = 0; i < kTK / 4; ++i) s[i] = 0.0f;
    for (int d = 0; d < hd; ++d) {
      const float qd = Qs[qi * (hd + 1) + d];
#pragma unroll
      for (int i = 0; i < kTK / 4; ++i) s[i] = fmaf(qd, Ks[(sub + 4 * i) * (hd + 1) + d], s[i]);
    }
    float cmax = -INFINITY;
#pragma unroll
    for (int i = 0; i < kTK / 4; ++i) {
      const int32_t kp = kp0 + sub + 4 * i;
      const bool ok = qvalid && kp <= qp && kp >= q_lo;
      s[i] = ok ? s[i] : -INFINITY;
      cmax = fmaxf(cmax, s[i]);
    }
    cmax = fmaxf(cmax, __shfl_xor_sync(0xffffffffu, cmax, 1));
    cmax = fmaxf(cmax, __shfl_xor_sync(0xffffffffu, cmax, 2));
    const float m_new = fmaxf(m, cmax);
    float alpha = 1.0f, psum = 0.0f;
    if (m_new != -INFINITY) {
      alpha = expf(m - m_new);  // 0 when m is still -inf
#pragma unroll
      for (int i = 0; i < kTK / 4; ++i) {
        s[i] = s[i] == -INFINITY ? 0.0f : expf(s[i] - m_new);
        psum += s[i];
      }
    } else {
#pragma unroll
      for (int i = 0; i < kTK / 4; ++i) s[i] = 0.0f;
    }
    psum += __shfl_xor_sync(0xffffffffu, psum, 1);
    psum += __shfl_xor_sync(0xffffffffu, psum, 2);
    l = __fadd_rn(__fmul_rn(l, alpha), psum);
    m = m_new;
#pragma unroll
    for (int i = 0; i < kTK / 4; ++i) Ps[qi * (kTK + 1) + sub + 4 * i] = s[i];
    __syncwarp();  // a query's four threads share a warp

#pragma unroll
    for (int j = 0; j < ACC; ++j) acc[j] = __fmul_rn(acc[j], alpha);
    for (int kj = 0; kj < kTK; ++kj) {
      const float p = Ps[qi * (kTK + 1) + kj];
#pragma unroll
      for (int j = 0; j < ACC; ++j) {
        const int d = sub + 4 * j;
        if (d < hdv) acc[j] = fmaf(p, Vs[kj * hdv + d], acc[j]);
      }
    }
  }
  if (!qvalid) return;
  float* out = a.out + int64_t(tile.row0 + qi) * a.out_ld + int64_t(h) * hdv;
#pragma unroll
  for (int j = 0; j < ACC; ++j) {
    const int d = sub + 4 * j;
    if (d < hdv) out[d] = acc[j] / l;
  }
}

template <bool kF16, int ACC>
void launch_prefill(const AttnArgs& a, const PrefillTile* tiles, int32_t n_tiles, cudaStream_t s) {
  const size_t smem = prefill_smem(a.head_dim, a.head_dim_v);
  static bool configured = false;  // the largest shape we allow: head dims of 256
  if (!configured) {
    TD_CUDA_CHECK(cudaFuncSetAttribute(prefill_kernel<kF16, ACC>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(prefill_smem(256, 256))));
    configured = true;
  }
  launch(prefill_kernel<kF16, ACC>, dim3(static_cast<unsigned>(n_tiles), static_cast<unsigned>(a.n_head)),
         dim3(kThreads), smem, s, a, tiles);
}

// ---- decode ----

constexpr int kCd = kDecodeChunk;
constexpr int kS = kDecodeSplits;
static_assert(kCd == 64, "the softmax takes two keys per lane");

size_t decode_smem(int G, int hd) { return sizeof(float) * (size_t(G) * hd + size_t(G) * kCd + 3 * size_t(G)); }

// ACC: (query head, value dimension) pairs per thread.
template <bool kF16, int ACC>
__global__ void __launch_bounds__(kThreads) decode_kernel(AttnArgs a, int32_t row0, DecodeScratch sc) {
  extern __shared__ float smem[];
  __shared__ int last;
  const int G = a.n_head / a.n_head_kv, hd = a.head_dim, hdv = a.head_dim_v;
  float* qs = smem;            // [G][hd]
  float* ps = qs + G * hd;     // [G][kCd]
  float* mst = ps + G * kCd;   // [G] running max
  float* lst = mst + G;        // [G] running sum
  float* alph = lst + G;       // [G] this chunk's rescale
  pdl_launch_dependents();
  pdl_wait();
  const int g = blockIdx.x, split = blockIdx.z, t = threadIdx.x, warp = t / 32, lane = t % 32;
  const int64_t row = int64_t{row0} + blockIdx.y;
  const int32_t pos = a.pos[row];
  const int32_t* table = a.tables + int64_t{a.seq[row]} * a.table_ld;
  const int32_t lo = a.window > 0 ? max(0, pos - a.window + 1) : 0;

  for (int idx = t; idx < G * hd; idx += kThreads)
    qs[idx] = a.q[row * a.q_ld + int64_t(g * G + idx / hd) * hd + idx % hd];
  if (t < G) mst[t] = -INFINITY, lst[t] = 0.0f;
  float acc[ACC];
#pragma unroll
  for (int k = 0; k < ACC; ++k) acc[k] = 0.0f;
  __syncthreads();

  const int32_t c_lo = lo / kCd, c_hi = pos / kCd;
  for (int32_t c = c_lo + ((split - c_lo % kS) + kS) % kS; c <= c_hi; c += kS) {
    const int32_t kp0 = c * kCd;
    for (int idx = t; idx < G * kCd; idx += kThreads) {
      const int gi = idx / kCd, j = idx % kCd;
      const int32_t kp = kp0 + j;
      float s = -INFINITY;
      if (kp >= lo && kp <= pos) {
        const size_t k0 = key_at(a, table, g, kp);
        s = 0.0f;
        for (int d = 0; d < hd; ++d) s = fmaf(qs[gi * hd + d], kv_load<kF16>(a.k_cache, k0 + size_t(d) * a.block_size), s);
      }
      ps[gi * kCd + j] = s;
    }
    __syncthreads();
    for (int gi = warp; gi < G; gi += kThreads / 32) {
      const float x0 = ps[gi * kCd + lane], x1 = ps[gi * kCd + lane + 32];
      const float m_old = mst[gi];
      const float m_new = fmaxf(m_old, warp_max(fmaxf(x0, x1)));
      float p0 = 0.0f, p1 = 0.0f, alpha = 1.0f;
      if (m_new != -INFINITY) {
        alpha = expf(m_old - m_new);
        p0 = x0 == -INFINITY ? 0.0f : expf(x0 - m_new);
        p1 = x1 == -INFINITY ? 0.0f : expf(x1 - m_new);
      }
      const float psum = warp_sum(__fadd_rn(p0, p1));
      ps[gi * kCd + lane] = p0;
      ps[gi * kCd + lane + 32] = p1;
      if (lane == 0) {
        lst[gi] = __fadd_rn(__fmul_rn(lst[gi], alpha), psum);
        mst[gi] = m_new;
        alph[gi] = alpha;
      }
    }
    __syncthreads();
    const int32_t j_lo = max(lo, kp0) - kp0, j_hi = min(pos, kp0 + kCd - 1) - kp0;
#pragma unroll
    for (int k = 0; k < ACC; ++k) {
      const int idx = t + kThreads * k;
      if (idx < G * hdv) {
        const int gi = idx / hdv, d = idx % hdv;
        float v = __fmul_rn(acc[k], alph[gi]);
        for (int j = j_lo; j <= j_hi; ++j)
          v = fmaf(ps[gi * kCd + j], kv_load<kF16>(a.v_cache, value_at(a, table, g, kp0 + j) + d), v);
        acc[k] = v;
      }
    }
    __syncthreads();
  }

  // This part's (m, l, acc) for each query head of the group.
  const size_t part_floats = size_t(G) * (2 + hdv);
  // Scratch by the row's index in this launch.
  float* part = sc.partials + ((size_t(blockIdx.y) * a.n_head_kv + g) * kS + split) * part_floats;
  if (t < G) part[t * (2 + hdv)] = mst[t], part[t * (2 + hdv) + 1] = lst[t];
#pragma unroll
  for (int k = 0; k < ACC; ++k) {
    const int idx = t + kThreads * k;
    if (idx < G * hdv) part[(idx / hdv) * (2 + hdv) + 2 + idx % hdv] = acc[k];
  }
  __threadfence();
  __syncthreads();
  int32_t* counter = sc.counters + int64_t{blockIdx.y} * a.n_head_kv + g;
  if (t == 0) last = atomicAdd(counter, 1) == kS - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();

  // The last block folds the parts in order, as the CPU folds its chunks.
  const float* parts = sc.partials + (size_t(blockIdx.y) * a.n_head_kv + g) * kS * part_floats;
  for (int idx = t; idx < G * hdv; idx += kThreads) {
    const int gi = idx / hdv, d = idx % hdv;
    float M = 0.0f, L = 0.0f, A = 0.0f;
    bool first = true;
    for (int s = 0; s < kS; ++s) {
      const float* p = parts + s * part_floats + gi * (2 + hdv);
      const float ms = __ldcg(p), ls = __ldcg(p + 1);
      if (ls == 0.0f) continue;  // a part with no positions
      const float as = __ldcg(p + 2 + d);
      if (first) {
        M = ms, L = ls, A = as, first = false;
        continue;
      }
      const float mn = fmaxf(M, ms);
      const float fa = expf(M - mn), fb = expf(ms - mn);
      L = __fadd_rn(__fmul_rn(L, fa), __fmul_rn(ls, fb));
      A = __fadd_rn(__fmul_rn(A, fa), __fmul_rn(as, fb));
      M = mn;
    }
    a.out[row * a.out_ld + int64_t(g * G + gi) * hdv + d] = A / L;
  }
  if (t == 0) *counter = 0;  // ready for the next launch
}

template <bool kF16, int ACC>
void launch_decode(const AttnArgs& a, int32_t row0, int32_t n_rows, const DecodeScratch& sc, cudaStream_t s) {
  const int G = a.n_head / a.n_head_kv;
  launch(decode_kernel<kF16, ACC>,
         dim3(static_cast<unsigned>(a.n_head_kv), static_cast<unsigned>(n_rows), static_cast<unsigned>(kS)),
         dim3(kThreads), decode_smem(G, a.head_dim), s, a, row0, sc);
}

}  // namespace

bool attention_shape_supported(int32_t n_head, int32_t n_head_kv, int32_t head_dim, int32_t head_dim_v) {
  if (n_head_kv <= 0 || n_head % n_head_kv != 0) return false;
  const int G = n_head / n_head_kv;
  return head_dim >= 1 && head_dim <= 256 && head_dim_v >= 1 && head_dim_v <= 256 && G * head_dim_v <= kThreads * 32 &&
         decode_smem(G, head_dim) <= 48 * 1024;
}

size_t decode_scratch_floats(int32_t n_rows, int32_t n_head, int32_t head_dim_v) {
  return size_t(n_rows) * kS * n_head * (2 + size_t(head_dim_v));
}

void attention_prefill(const AttnArgs& a, const PrefillTile* tiles, int32_t n_tiles, cudaStream_t s) {
  if (n_tiles <= 0) return;
  if (!attention_shape_supported(a.n_head, a.n_head_kv, a.head_dim, a.head_dim_v))
    usage_fail("attention: unsupported head shape");
  const int per = (a.head_dim_v + 3) / 4;
  if (a.kv_f16) {
    if (per <= 16) launch_prefill<true, 16>(a, tiles, n_tiles, s);
    else if (per <= 32) launch_prefill<true, 32>(a, tiles, n_tiles, s);
    else launch_prefill<true, 64>(a, tiles, n_tiles, s);
  } else {
    if (per <= 16) launch_prefill<false, 16>(a, tiles, n_tiles, s);
    else if (per <= 32) launch_prefill<false, 32>(a, tiles, n_tiles, s);
    else launch_prefill<false, 64>(a, tiles, n_tiles, s);
  }
}

void attention_decode(const AttnArgs& a, int32_t row0, int32_t n_rows, const DecodeScratch& sc, cudaStream_t s) {
  if (n_rows <= 0) return;
  if (!attention_shape_supported(a.n_head, a.n_head_kv, a.head_dim, a.head_dim_v))
    usage_fail("attention: unsupported head shape");
  const int per = (a.n_head / a.n_head_kv * a.head_dim_v + kThreads - 1) / kThreads;
  if (a.kv_f16) {
    if (per <= 4) launch_decode<true, 4>(a, row0, n_rows, sc, s);
    else if (per <= 8) launch_decode<true, 8>(a, row0, n_rows, sc, s);
    else if (per <= 16) launch_decode<true, 16>(a, row0, n_rows, sc, s);
    else launch_decode<true, 32>(a, row0, n_rows, sc, s);
  } else {
    if (per <= 4) launch_decode<false, 4>(a, row0, n_rows, sc, s);
    else if (per <= 8) launch_decode<false, 8>(a, row0, n_rows, sc, s);
    else if (per <= 16) launch_decode<false, 16>(a, row0, n_rows, sc, s);
    else launch_decode<false, 32>(a, row0, n_rows, sc, s);
  }
}

}  // namespace tandem::cuda

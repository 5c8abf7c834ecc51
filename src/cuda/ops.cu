// Per-row operations of the forward pass on the device: residual adds, RMS
// norms, gated activations and the quantization of activations for the
// matrix-vector kernels (row_op); bias, Q/K norms, rope and the K/V writes
// (qkv_post); K/V block copies; a plain read kernel for the bandwidth probe.
//
// They follow the CPU's arithmetic (kernels/ops.cpp, kernels/dot.cpp): RMS
// norm sums float squares in double, scale = 1 / sqrtf(mean + eps), values
// (x * scale) * w; q8_0 and q8_K activations are ggml's reference quantizers;
// GELU goes through the same f16 table; rope uses the host's cos/sin tables.
#include <atomic>
#include <cstdlib>
#include <cstring>

#include "cuda/formats.cuh"

namespace tandem::cuda {

namespace {

std::atomic<bool> g_pdl{true};

}  // namespace

void set_pdl(bool on) { g_pdl.store(on); }
bool pdl_enabled() { return g_pdl.load(std::memory_order_relaxed); }

namespace {

constexpr int kRowThreads = 256;

// Sum over the block of one double per thread, in a fixed order; every
// thread gets the result.
__device__ double block_sum(double v, double* red) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, nw = blockDim.x / 32;
  v = warp_sum(v);
  __syncthreads();  // red may still be read from an earlier call
  if (lane == 0) red[warp] = v;
  __syncthreads();
  double s = 0;
  for (int w = 0; w < nw; ++w) s += red[w];
  return s;
}

__device__ float rms_scale(double sum_sq, int n, float eps) {
  const float mean = static_cast<float>(sum_sq / static_cast<double>(n));
  return 1.0f / sqrtf(mean + eps);
}

__device__ float silu_dev(float x) { return x / (1.0f + expf(-x)); }

__device__ float gelu_dev(float x, const uint16_t* table) {
  if (x <= -10.0f) return 0.0f;
  if (x >= 10.0f) return x;
  return f16_bits_to_float(table[float_to_f16_bits(x)]);
}

// ggml's nearest_int: round half to even via 1.5 * 2^23.
__device__ int nearest_int_dev(float f) {
  const float v = __fadd_rn(f, 12582912.f);
  return (__float_as_int(v) & 0x007fffff) - 0x00400000;
}

// x * (1/d) rounded half away from zero, clamped; NaN to 0 (kernels/dot.cpp's to_q8).
__device__ int8_t to_q8_dev(float scaled) {
  const float r = roundf(scaled);
  if (isnan(r)) return 0;
  return static_cast<int8_t>(fminf(fmaxf(r, -127.0f), 127.0f));
}

struct RowValues {
  const RowOp* op;
  const float* x;
  const float* gate;
  const float* up;
  float scale;
  __device__ float operator()(int64_t e) const {
    switch (op->mode) {
      case RowMode::kNorm: return __fmul_rn(__fmul_rn(x[e], scale), op->norm_w[e]);
      case RowMode::kPlain: return x[e];
      default: {
        const float g = gate[e];
        const float a = op->act == ActFn::kSilu ? silu_dev(g) : gelu_dev(g, op->gelu_table);
        return __fmul_rn(a, up[e]);
      }
    }
  }
};

__device__ void write_form(const DevActs& f, int64_t i, int E, const RowValues& val) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, nw = blockDim.x / 32;
  switch (f.type) {
    case ActType::kF32:
      for (int e = threadIdx.x; e < E; e += blockDim.x) static_cast<float*>(f.q)[i * f.ld + e] = val(e);
      return;
    case ActType::kF16:
      for (int e = threadIdx.x; e < E; e += blockDim.x) static_cast<uint16_t*>(f.q)[i * f.ld + e] = float_to_f16_bits(val(e));
      return;
    case ActType::kBF16:
      for (int e = threadIdx.x; e < E; e += blockDim.x)
        static_cast<uint16_t*>(f.q)[i * f.ld + e] = float_to_bf16_bits(val(e));
      return;
    case ActType::kQ8_0:
      for (int b = warp; b < E / 32; b += nw) {
        const float v = val(32 * b + lane);
        const float amax = warp_max(fabsf(v));
        const float d = amax / 127;
        const float id = d != 0 ? 1.0f / d : 0.0f;
        const int8_t q = to_q8_dev(__fmul_rn(v, id));
        static_cast<int8_t*>(f.q)[i * f.ld + 32 * b + lane] = q;
        int s = q;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
        if (lane == 0) {
          f.d[i * (f.ld / 32) + b] = f16_bits_to_float(float_to_f16_bits(d));
          f.sums[i * (f.ld / 32) + b] = static_cast<int16_t>(s);
        }
      }
      return;
    case ActType::kQ8_K:
      for (int b = warp; b < E / 256; b += nw) {
        float v[8];
        float amax = 0, mx = 0;
        int idx = 1 << 30;
#pragma unroll
        for (int k = 0; k < 8; ++k) {
          v[k] = val(256 * b + 8 * lane + k);
          const float ax = fabsf(v[k]);
          if (ax > amax) amax = ax, mx = v[k], idx = 8 * lane + k;
        }
        // The first element of largest magnitude, as the CPU's sequential scan.
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
          const float oa = __shfl_xor_sync(0xffffffffu, amax, o);
          const float om = __shfl_xor_sync(0xffffffffu, mx, o);
          const int oi = __shfl_xor_sync(0xffffffffu, idx, o);
          if (oa > amax || (oa == amax && oi < idx)) amax = oa, mx = om, idx = oi;
        }
        int8_t* q = static_cast<int8_t*>(f.q) + i * f.ld + 256 * b + 8 * lane;
        int s = 0;
        if (amax == 0) {
#pragma unroll
          for (int k = 0; k < 8; ++k) q[k] = 0;
        } else {
          const float iscale = -127.f / mx;
#pragma unroll
          for (int k = 0; k < 8; ++k) {
            const int t = nearest_int_dev(__fmul_rn(iscale, v[k]));
            q[k] = static_cast<int8_t>(t < 127 ? t : 127);
            s += q[k];
          }
        }
        s += __shfl_xor_sync(0xffffffffu, s, 1);  // lanes 2g, 2g+1 hold group g of 16
        if ((lane & 1) == 0) f.sums[i * (f.ld / 16) + 16 * b + lane / 2] = static_cast<int16_t>(s);
        if (lane == 0) f.d[i * (f.ld / 256) + b] = amax == 0 ? 0.0f : 1 / (-127.f / mx);
      }
      return;
  }
}

__global__ void __launch_bounds__(kRowThreads) row_op_kernel(RowOp op) {
  __shared__ double red[kRowThreads / 32];
  pdl_launch_dependents();
  pdl_wait();
  const int64_t i = blockIdx.x;
  const int64_t in = op.rows ? op.rows[i] : i;
  const int E = op.E;
  RowValues val{&op, nullptr, nullptr, nullptr, 1.0f};
  if (op.mode == RowMode::kGated) {
    val.gate = op.gate + in * op.gate_ld;
    val.up = op.up + in * op.gate_ld;
  } else {
    float* x = op.x + in * op.x_ld;
    val.x = x;
    if (op.add) {
      const float* o = op.add + in * op.add_ld;
      float so = 1.0f;
      if (op.add_w) {
        double ss = 0;
        for (int e = threadIdx.x; e < E; e += blockDim.x) ss += static_cast<double>(__fmul_rn(o[e], o[e]));
        so = rms_scale(block_sum(ss, red), E, op.eps);
      }
      for (int e = threadIdx.x; e < E; e += blockDim.x)
        x[e] = __fadd_rn(x[e], op.add_w ? __fmul_rn(__fmul_rn(o[e], so), op.add_w[e]) : o[e]);
      __syncthreads();
    }
    if (op.mode == RowMode::kNorm) {
      double ss = 0;
      for (int e = threadIdx.x; e < E; e += blockDim.x) ss += static_cast<double>(__fmul_rn(x[e], x[e]));
      val.scale = rms_scale(block_sum(ss, red), E, op.eps);
    }
  }
  for (int k = 0; k < op.n_forms; ++k)
    if (i >= op.forms[k].r0 && i < op.forms[k].r1) write_form(op.forms[k].acts, i, E, val);
}

}  // namespace

void row_op(const RowOp& op, cudaStream_t s) {
  launch(row_op_kernel, dim3(static_cast<unsigned>(op.n_rows)), dim3(kRowThreads), 0, s, op);
}

// ---- Q, K, V ----

namespace {

constexpr int kQkvWarps = 4;
constexpr int kMaxHeadDim = 512;

template <bool kF16>
__device__ void store_kv(void* base, size_t idx, float v) {
  if constexpr (kF16) static_cast<uint16_t*>(base)[idx] = float_to_f16_bits(v);
  else static_cast<float*>(base)[idx] = v;
}

template <bool kF16>
__global__ void __launch_bounds__(kQkvWarps * 32) qkv_post_kernel(QkvPost p) {
  __shared__ float buf[kQkvWarps][kMaxHeadDim];
  pdl_launch_dependents();
  pdl_wait();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t i = blockIdx.x;
  const int32_t pos = p.pos[i];
  const int32_t block = p.tables[int64_t{p.seq[i]} * p.table_ld + pos / p.block_size];
  const int32_t slot = pos % p.block_size;
  const int half = p.rope_dims / 2;
  const float* cs = p.rope_cos + int64_t{pos} * half;
  const float* sn = p.rope_sin + int64_t{pos} * half;
  float* v = buf[warp];
  const int hd = p.head_dim;
  // Heads (Q, then K, then V) spread over the blocks of this row and their warps.
  for (int t = blockIdx.y * kQkvWarps + warp; t < p.n_head + 2 * p.n_head_kv; t += gridDim.y * kQkvWarps) {
    if (t >= p.n_head + p.n_head_kv) {  // a V head: bias, then the cache row
      const int g = t - p.n_head - p.n_head_kv, hdv = p.head_dim_v;
      const float* src = p.v + i * p.v_ld + int64_t{g} * hdv;
      const size_t base = (size_t(g) * p.n_blocks + block) * p.block_size * hdv + size_t(slot) * hdv;
      for (int d = lane; d < hdv; d += 32)
        store_kv<kF16>(p.v_cache, base + d, p.bv ? __fadd_rn(src[d], p.bv[g * hdv + d]) : src[d]);
      continue;
    }
    const bool is_q = t < p.n_head;
    const int h = is_q ? t : t - p.n_head;
    const float* src = is_q ? p.q + i * p.q_ld + int64_t{h} * hd : p.k + i * p.k_ld + int64_t{h} * hd;
    const float* bias = is_q ? p.bq : p.bk;
    const float* nw = is_q ? p.q_norm : p.k_norm;
    double ss = 0;
    for (int d = lane; d < hd; d += 32) {
      const float x = bias ? __fadd_rn(src[d], bias[h * hd + d]) : src[d];
      v[d] = x;
      ss += static_cast<double>(__fmul_rn(x, x));
    }
    __syncwarp();
    if (nw) {
      const float sc = rms_scale(warp_sum(ss), hd, p.eps);
      for (int d = lane; d < hd; d += 32) v[d] = __fmul_rn(__fmul_rn(v[d], sc), nw[d]);
      __syncwarp();
    }
    // Rotated pairs and the untouched dimensions, each dimension written
    // once from the (unmodified) buffer.
    const float scale = is_q ? p.attn_scale : 1.0f;
    for (int d = lane; d < hd; d += 32) {
      float r;
      if (d < p.rope_dims) {
        const int pi = p.rope_neox ? (d < half ? d : d - half) : d / 2;
        const int d0 = p.rope_neox ? pi : 2 * pi, d1 = p.rope_neox ? pi + half : 2 * pi + 1;
        const float x0 = v[d0], x1 = v[d1];
        r = d == d0 ? __fsub_rn(__fmul_rn(x0, cs[pi]), __fmul_rn(x1, sn[pi]))
                    : __fadd_rn(__fmul_rn(x0, sn[pi]), __fmul_rn(x1, cs[pi]));
      } else {
        r = v[d];
      }
      if (is_q) {
        p.q[i * p.q_ld + int64_t{h} * hd + d] = __fmul_rn(r, scale);
      } else {
        const size_t base = (size_t(h) * p.n_blocks + block) * p.block_size * hd;
        store_kv<kF16>(p.k_cache, base + size_t(d) * p.block_size + slot, r);
      }
    }
    __syncwarp();  // the buffer is reused by this warp's next head
  }
}

}  // namespace

void qkv_post(const QkvPost& p, cudaStream_t s) {
  if (p.head_dim > kMaxHeadDim || p.head_dim_v > kMaxHeadDim) usage_fail("qkv_post: head dimension above 512");
  // One warp per head: a decode step's few rows still fill many blocks.
  const dim3 grid(static_cast<unsigned>(p.n_rows),
                  static_cast<unsigned>((p.n_head + 2 * p.n_head_kv + kQkvWarps - 1) / kQkvWarps));
  if (p.kv_f16)
    launch(qkv_post_kernel<true>, grid, dim3(kQkvWarps * 32), 0, s, p);
  else
    launch(qkv_post_kernel<false>, grid, dim3(kQkvWarps * 32), 0, s, p);
}

// ---- K/V blocks ----

namespace {

// Run r of the block (r = 2 * (layer * n_head_kv + head) + kind, kind 0 K,
// 1 V), at its place in the cache and in save_block's contiguous order.
struct RunRef {
  uint8_t* cache;
  size_t stage;
  size_t bytes;
};
__device__ RunRef run_ref(const KvBlockRuns& kv, int r, int32_t block) {
  const int lh = r / 2;
  const bool is_v = r % 2;
  const size_t n = is_v ? kv.v_run : kv.k_run;
  uint8_t* base = static_cast<uint8_t*>(is_v ? kv.v : kv.k);
  return {base + (size_t(lh) * kv.n_blocks + block) * n, size_t(lh) * (kv.k_run + kv.v_run) + (is_v ? kv.k_run : 0),
          n};
}

__device__ void copy_bytes(uint8_t* dst, const uint8_t* src, size_t n) {
  if ((reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src) | n) % 16 == 0) {
    for (size_t k = threadIdx.x; k < n / 16; k += blockDim.x)
      reinterpret_cast<uint4*>(dst)[k] = reinterpret_cast<const uint4*>(src)[k];
  } else {
    for (size_t k = threadIdx.x; k < n; k += blockDim.x) dst[k] = src[k];
  }
}

// mode 0: block src -> block dst; 1: block src -> buffer; 2: buffer -> block dst.
__global__ void kv_block_kernel(KvBlockRuns kv, int32_t src, int32_t dst, uint8_t* buf, int mode) {
  pdl_launch_dependents();
  pdl_wait();
  const int r = blockIdx.x;
  if (mode == 0) {
    const RunRef a = run_ref(kv, r, src), b = run_ref(kv, r, dst);
    copy_bytes(b.cache, a.cache, a.bytes);
  } else if (mode == 1) {
    const RunRef a = run_ref(kv, r, src);
    copy_bytes(buf + a.stage, a.cache, a.bytes);
  } else {
    const RunRef b = run_ref(kv, r, dst);
    copy_bytes(b.cache, buf + b.stage, b.bytes);
  }
}

unsigned n_runs(const KvBlockRuns& kv) { return static_cast<unsigned>(2 * kv.n_layer * kv.n_head_kv); }

}  // namespace

void kv_copy_block(const KvBlockRuns& kv, int32_t src, int32_t dst, cudaStream_t s) {
  launch(kv_block_kernel, dim3(n_runs(kv)), dim3(128), 0, s, kv, src, dst, static_cast<uint8_t*>(nullptr), 0);
}
void kv_gather_block(const KvBlockRuns& kv, int32_t block, uint8_t* out, cudaStream_t s) {
  launch(kv_block_kernel, dim3(n_runs(kv)), dim3(128), 0, s, kv, block, int32_t{-1}, out, 1);
}
void kv_scatter_block(const KvBlockRuns& kv, int32_t block, const uint8_t* in, cudaStream_t s) {
  launch(kv_block_kernel, dim3(n_runs(kv)), dim3(128), 0, s, kv, int32_t{-1}, block, const_cast<uint8_t*>(in), 2);
}

// ---- Read bandwidth ----

namespace {

__global__ void read_kernel_impl(const uint4* p, size_t n, uint32_t* sink) {
  pdl_launch_dependents();
  pdl_wait();
  uint32_t acc = 0;
  const size_t stride = size_t{gridDim.x} * blockDim.x;
  size_t i = size_t{blockIdx.x} * blockDim.x + threadIdx.x;
  // Four independent 16-byte loads in flight per thread and step.
  for (; i + 3 * stride < n; i += 4 * stride) {
    const uint4 a = __ldcs(p + i), b = __ldcs(p + i + stride), c = __ldcs(p + i + 2 * stride),
                d = __ldcs(p + i + 3 * stride);
    acc ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w ^ c.x ^ c.y ^ c.z ^ c.w ^ d.x ^ d.y ^ d.z ^ d.w;
  }
  for (; i < n; i += stride) {
    const uint4 a = __ldcs(p + i);
    acc ^= a.x ^ a.y ^ a.z ^ a.w;
  }
  if (acc == 0x9e3779b9u) atomicXor(sink, acc);  // practically never: keeps the loads alive
}

}  // namespace

void read_kernel(const void* p, size_t bytes, uint32_t* sink, cudaStream_t s) {
  int dev = 0, sms = 0;
  TD_CUDA_CHECK(cudaGetDevice(&dev));
  TD_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  launch(read_kernel_impl, dim3(static_cast<unsigned>(sms * 8)), dim3(256), 0, s, static_cast<const uint4*>(p),
         bytes / 16, sink);
}

}  // namespace tandem::cuda

// Weight layouts on the device, their upload from GGUF rows, and exact
// dequantization (embedding rows; f16 copies for cuBLAS; f32 for tests).
#include "cuda/formats.cuh"

namespace tandem::cuda {

bool weight_type_supported(GgmlType t) {
  switch (t) {
    case GgmlType::F32:
    case GgmlType::F16:
    case GgmlType::BF16:
    case GgmlType::Q8_0:
    case GgmlType::Q4_0:
    case GgmlType::Q5_0:
    case GgmlType::Q4_K:
    case GgmlType::Q5_K:
    case GgmlType::Q6_K: return true;
    default: return false;
  }
}

ActType act_type_for(GgmlType w) {
  switch (w) {
    case GgmlType::F16: return ActType::kF16;
    case GgmlType::BF16: return ActType::kBF16;
    case GgmlType::Q8_0:
    case GgmlType::Q4_0:
    case GgmlType::Q5_0: return ActType::kQ8_0;
    case GgmlType::Q4_K:
    case GgmlType::Q5_K:
    case GgmlType::Q6_K: return ActType::kQ8_K;
    default: return ActType::kF32;
  }
}

namespace {

constexpr size_t kAlign = 256;
size_t aligned(size_t x) { return (x + kAlign - 1) / kAlign * kAlign; }

}  // namespace

MatrixLayout matrix_layout(GgmlType t, int64_t rows, int64_t cols) {
  MatrixLayout l;
  size_t at = aligned(static_cast<size_t>(rows * q_row_bytes(t, cols)));
  auto part = [&](size_t bytes) {
    const size_t off = at;
    at += aligned(bytes);
    return off;
  };
  const size_t r = static_cast<size_t>(rows), c = static_cast<size_t>(cols);
  switch (t) {
    case GgmlType::Q8_0:
    case GgmlType::Q4_0: l.d = part(r * (c / 32) * 2); break;
    case GgmlType::Q5_0:
      l.qh = part(r * (c / 32) * 4);
      l.d = part(r * (c / 32) * 2);
      break;
    case GgmlType::Q6_K:
      l.qh = part(r * (c / 4));
      l.sc = part(r * (c / 16));
      l.d = part(r * (c / 256) * 2);
      break;
    default: break;
  }
  l.bytes = at + kAlign;  // a little tail: no kernel reads past its rows, but prefetches round to lines
  return l;
}

DevMatrix matrix_at(GgmlType t, int64_t rows, int64_t cols, uint8_t* base) {
  const MatrixLayout l = matrix_layout(t, rows, cols);
  DevMatrix m;
  m.type = t;
  m.rows = rows;
  m.cols = cols;
  m.q = base;
  if (l.qh) m.qh = base + l.qh;
  if (l.sc) m.sc = reinterpret_cast<const int8_t*>(base + l.sc);
  if (l.d) m.d = reinterpret_cast<const uint16_t*>(base + l.d);
  return m;
}

namespace {

__device__ uint16_t load_u16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }

// One thread per GGUF block of rows [row0, row0 + n_rows): its bytes to the
// split arrays.
__global__ void split_blocks_kernel(DevMatrix m, const uint8_t* src, int64_t row0, int64_t n_rows) {
  pdl_launch_dependents();
  pdl_wait();
  const int64_t bpr = m.type == GgmlType::Q6_K ? m.cols / 256 : m.cols / 32;  // blocks per row
  const int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (i >= n_rows * bpr) return;
  const int64_t rr = i / bpr, b = i % bpr, row = row0 + rr;
  uint8_t* q = const_cast<uint8_t*>(m.q);
  uint16_t* d = const_cast<uint16_t*>(m.d);
  switch (m.type) {
    case GgmlType::Q8_0: {
      const uint8_t* s = src + (rr * bpr + b) * 34;
      d[row * bpr + b] = load_u16(s);
      for (int k = 0; k < 32; ++k) q[row * m.cols + b * 32 + k] = s[2 + k];
      break;
    }
    case GgmlType::Q4_0: {
      const uint8_t* s = src + (rr * bpr + b) * 18;
      d[row * bpr + b] = load_u16(s);
      for (int k = 0; k < 16; ++k) q[row * (m.cols / 2) + b * 16 + k] = s[2 + k];
      break;
    }
    case GgmlType::Q5_0: {
      const uint8_t* s = src + (rr * bpr + b) * 22;
      d[row * bpr + b] = load_u16(s);
      const uint32_t qh = s[2] | (uint32_t{s[3]} << 8) | (uint32_t{s[4]} << 16) | (uint32_t{s[5]} << 24);
      reinterpret_cast<uint32_t*>(const_cast<uint8_t*>(m.qh))[row * bpr + b] = qh;
      for (int k = 0; k < 16; ++k) q[row * (m.cols / 2) + b * 16 + k] = s[6 + k];
      break;
    }
    case GgmlType::Q6_K: {
      // ql[128], qh[64], scales[16], d: ggml's block_q6_K.
      const uint8_t* s = src + (rr * bpr + b) * 210;
      for (int k = 0; k < 128; ++k) q[row * (m.cols / 2) + b * 128 + k] = s[k];
      uint8_t* qh = const_cast<uint8_t*>(m.qh) + row * (m.cols / 4) + b * 64;
      for (int k = 0; k < 64; ++k) qh[k] = s[128 + k];
      int8_t* sc = const_cast<int8_t*>(m.sc) + row * (m.cols / 16) + b * 16;
      for (int k = 0; k < 16; ++k) sc[k] = static_cast<int8_t>(s[192 + k]);
      d[row * bpr + b] = load_u16(s + 208);
      break;
    }
    default: break;
  }
}

}  // namespace

void upload_rows(const DevMatrix& m, const uint8_t* src, int64_t row0, int64_t n_rows, cudaStream_t s) {
  if (n_rows <= 0) return;
  const size_t src_row = static_cast<size_t>(row_bytes(m.type, m.cols));
  switch (m.type) {
    case GgmlType::Q8_0:
    case GgmlType::Q4_0:
    case GgmlType::Q5_0:
    case GgmlType::Q6_K: {
      const int64_t bpr = m.type == GgmlType::Q6_K ? m.cols / 256 : m.cols / 32;
      const int64_t n = n_rows * bpr;
      launch(split_blocks_kernel, dim3(static_cast<unsigned>((n + 255) / 256)), dim3(256), 0, s, m, src, row0, n_rows);
      return;
    }
    default: {
      // Stored rows, each padded to its 16-byte stride.
      const size_t ld = static_cast<size_t>(q_row_bytes(m.type, m.cols));
      TD_CUDA_CHECK(cudaMemcpy2DAsync(const_cast<uint8_t*>(m.q) + static_cast<size_t>(row0) * ld, ld, src, src_row,
                                      src_row, static_cast<size_t>(n_rows), cudaMemcpyDeviceToDevice, s));
      return;
    }
  }
}

namespace {

// One thread per 32 elements of a row; T is float or __half bits.
template <bool kHalf>
__global__ void dequant_kernel(DevMatrix m, void* out, int64_t out_ld) {
  pdl_launch_dependents();
  pdl_wait();
  const int64_t per_row = (m.cols + 31) / 32;
  const int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (i >= m.rows * per_row) return;
  const int64_t row = i / per_row, sb = i % per_row;
  float y[32];
  dequant32(m, row, sb, y);
  const int n = m.cols - sb * 32 < 32 ? static_cast<int>(m.cols - sb * 32) : 32;
  if constexpr (kHalf) {
    uint16_t* o = static_cast<uint16_t*>(out) + row * out_ld + sb * 32;
#pragma unroll
    for (int k = 0; k < 32; ++k)
      if (k < n) o[k] = float_to_f16_bits(y[k]);
  } else {
    float* o = static_cast<float*>(out) + row * out_ld + sb * 32;
#pragma unroll
    for (int k = 0; k < 32; ++k)
      if (k < n) o[k] = y[k];
  }
}

}  // namespace

void dequantize_f16(const DevMatrix& m, uint16_t* out, cudaStream_t s) {
  const int64_t n = m.rows * ((m.cols + 31) / 32);
  launch(dequant_kernel<true>, dim3(static_cast<unsigned>((n + 255) / 256)), dim3(256), 0, s, m,
         static_cast<void*>(out), round_up(m.cols, 8));
}

void dequantize_f32(const DevMatrix& m, float* out, cudaStream_t s) {
  const int64_t n = m.rows * ((m.cols + 31) / 32);
  launch(dequant_kernel<false>, dim3(static_cast<unsigned>((n + 255) / 256)), dim3(256), 0, s, m,
         static_cast<void*>(out), m.cols);
}

namespace {

// Block per row: threads over 32-element pieces of the token's row.
__global__ void embed_kernel(DevMatrix emb, const int32_t* tokens, float scale, float* x, int64_t x_ld) {
  pdl_launch_dependents();
  pdl_wait();
  const int32_t token = tokens[blockIdx.x];
  float* xr = x + int64_t{blockIdx.x} * x_ld;
  const int64_t pieces = (emb.cols + 31) / 32;
  for (int64_t sb = threadIdx.x; sb < pieces; sb += blockDim.x) {
    float y[32];
    dequant32(emb, token, sb, y);
    const int n = emb.cols - sb * 32 < 32 ? static_cast<int>(emb.cols - sb * 32) : 32;
    // The CPU multiplies only when the scale is not 1 (model.cpp); x * 1 is x anyway.
#pragma unroll
    for (int k = 0; k < 32; ++k)
      if (k < n) xr[sb * 32 + k] = scale == 1.0f ? y[k] : __fmul_rn(y[k], scale);
  }
}

}  // namespace

void embed_rows(const DevMatrix& emb, const int32_t* tokens, int32_t n_rows, float scale, float* x, int64_t x_ld,
                cudaStream_t s) {
  launch(embed_kernel, dim3(static_cast<unsigned>(n_rows)), dim3(128), 0, s, emb, tokens, scale, x, x_ld);
}

}  // namespace tandem::cuda

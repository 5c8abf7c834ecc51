// Every CUDA kernel alone against the CPU code it mirrors, on random inputs
// of odd sizes: weight upload and dequantization (bit for bit), activation
// quantization (bit for bit), the matrix-vector products (the CPU's scalar
// vec_dot on the CPU's quantized activations), RMS norm, gated activations,
// Q/K/V post-processing with the K/V writes, both attention kernels against
// kernels/attention.h, and the K/V block copies. Each failure names the
// kernel, the case and the first mismatching index.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "quant/quant.h"
#include "runtime/thread_pool.h"
#include "cuda/kernels.h"
#include "cuda/cuda_test_util.h"
#include "kernels/attention.h"
#include "kernels/vec_dot.h"
#include "kernels/ops.h"
#include "kv/kv_cache.h"

namespace tandem {
namespace {

using namespace tandem::cuda;
using namespace tandem::cudatest;

const GgmlType kTypes[] = {GgmlType::F32,  GgmlType::F16,  GgmlType::BF16, GgmlType::Q8_0, GgmlType::Q4_0,
                           GgmlType::Q5_0, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K};

std::string tname(GgmlType t) { return std::string(type_traits(t).name); }
bool is_kquant(GgmlType t) { return t == GgmlType::Q4_K || t == GgmlType::Q5_K || t == GgmlType::Q6_K; }
bool is_float(GgmlType t) { return t == GgmlType::F32 || t == GgmlType::F16 || t == GgmlType::BF16; }
// An odd width each type allows: float rows of 172 (not a multiple of 8),
// 5 blocks of 32, 2 super-blocks of 256.
int64_t width_for(GgmlType t) { return is_kquant(t) ? 512 : is_float(t) ? 172 : 160; }

// A random matrix in type t: its GGUF bytes, their exact values, and the
// device copy (uploaded in two slices, as the executor's staging does).
struct TestMatrix {
  GgmlType type;
  int64_t rows, cols;
  size_t row_bytes_ = 0;
  std::vector<uint8_t> bytes;
  std::vector<float> values;
  DevVec<uint8_t> dev;
  DevMatrix m;
};

void make_matrix(TestMatrix& w, GgmlType t, int64_t rows, int64_t cols, uint32_t seed) {
  w.type = t, w.rows = rows, w.cols = cols;
  w.row_bytes_ = row_bytes(t, cols);
  const std::vector<float> f = random_floats(size_t(rows * cols), seed, 0.5f);
  w.bytes.assign(w.row_bytes_ * rows, 0);
  w.values.assign(size_t(rows * cols), 0.0f);
  for (int64_t r = 0; r < rows; ++r) {
    quantize_row(t, f.data() + r * cols, w.bytes.data() + r * w.row_bytes_, cols);
    dequantize_row(t, w.bytes.data() + r * w.row_bytes_, w.values.data() + r * cols, cols);
  }
  const MatrixLayout l = matrix_layout(t, rows, cols);
  w.dev.resize(l.bytes);
  w.m = matrix_at(t, rows, cols, w.dev.get());
  DevVec<uint8_t> staging(w.bytes);
  const int64_t r1 = rows / 2;
  upload_rows(w.m, staging.get(), 0, r1, nullptr);
  upload_rows(w.m, staging.get() + r1 * w.row_bytes_, r1, rows - r1, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << "upload_rows " << tname(t);
}

// Activation buffers of one dot type for `rows` rows of `cols` elements.
struct TestActs {
  DevVec<uint8_t> q;
  DevVec<float> d;
  DevVec<int16_t> sums;
  DevActs acts;
};
void make_acts(TestActs& a, ActType t, int64_t rows, int64_t cols) {
  const int64_t ld = (cols + 255) / 256 * 256;
  const int esize = t == ActType::kF32 ? 4 : (t == ActType::kF16 || t == ActType::kBF16) ? 2 : 1;
  a.q.resize(size_t(rows * ld * esize));
  a.d.resize(size_t(rows * ld / 32));
  a.sums.resize(size_t(rows * ld / 16));
  a.acts.type = t;
  a.acts.ld = ld;
  a.acts.q = a.q.get();
  a.acts.d = a.d.get();
  a.acts.sums = a.sums.get();
}

// Writes rows x [rows][cols] (device) in the form `a` with row_op's kPlain.
void quantize_on_gpu(const DevVec<float>& x, int64_t rows, int64_t cols, TestActs& a) {
  RowOp op;
  op.n_rows = static_cast<int32_t>(rows);
  op.E = static_cast<int32_t>(cols);
  op.mode = RowMode::kPlain;
  op.x = x.get();
  op.x_ld = cols;
  op.n_forms = 1;
  op.forms[0] = {a.acts, 0, static_cast<int32_t>(rows)};
  row_op(op, nullptr);
}

TEST(CudaKernels, UploadAndDequantizeMatchTheCpuBitForBit) {
  TD_REQUIRE_GPU();
  for (GgmlType t : kTypes) {
    SCOPED_TRACE(tname(t));
    TestMatrix w;
    make_matrix(w, t, 37, width_for(t), 11);
    DevVec<float> out(size_t(w.rows * w.cols));
    dequantize_f32(w.m, out.get(), nullptr);
    const std::vector<float> got = out.download();
    const size_t at = first_byte_diff(got.data(), w.values.data(), got.size() * 4);
    EXPECT_EQ(at, SIZE_MAX) << "dequantize_f32 " << tname(t) << ": first differing float " << at / 4 << " (got "
                            << got[at / 4] << ", want " << w.values[at / 4] << ")";
    // f16 copies for cuBLAS: rows of round_up(cols, 8).
    const int64_t ld = (w.cols + 7) / 8 * 8;
    DevVec<uint16_t> h(size_t(w.rows * ld));
    dequantize_f16(w.m, h.get(), nullptr);
    const std::vector<uint16_t> hg = h.download();
    size_t bad = 0, first = SIZE_MAX;
    for (int64_t r = 0; r < w.rows; ++r)
      for (int64_t c = 0; c < w.cols; ++c)
        if (hg[r * ld + c] != f32_to_f16(w.values[r * w.cols + c])) {
          ++bad;
          if (first == SIZE_MAX) first = size_t(r * w.cols + c);
        }
    EXPECT_EQ(bad, 0u) << "dequantize_f16 " << tname(t) << ": first mismatch at element " << first;
  }
}

TEST(CudaKernels, EmbeddingRowsMatchTheCpu) {
  TD_REQUIRE_GPU();
  for (GgmlType t : kTypes) {
    SCOPED_TRACE(tname(t));
    TestMatrix w;
    make_matrix(w, t, 29, width_for(t), 5);
    const std::vector<int32_t> tokens = {3, 0, 28, 3, 17};
    DevVec<int32_t> tok(tokens);
    for (float scale : {1.0f, std::sqrt(static_cast<float>(w.cols))}) {
      DevVec<float> x(tokens.size() * w.cols);
      embed_rows(w.m, tok.get(), static_cast<int32_t>(tokens.size()), scale, x.get(), w.cols, nullptr);
      const std::vector<float> got = x.download();
      std::vector<float> want(got.size());
      for (size_t i = 0; i < tokens.size(); ++i)
        for (int64_t c = 0; c < w.cols; ++c) {
          const float v = w.values[tokens[i] * w.cols + c];
          want[i * w.cols + c] = scale != 1.0f ? v * scale : v;
        }
      TD_EXPECT_CLOSE(got.data(), want.data(), got.size(), 0.0, 0.0, "embed_rows " + tname(t));
    }
  }
}

// Byte offsets in ggml's block_q8_0 (34 bytes) and block_q8_K (292 bytes).
float q8_0_scale(const uint8_t* b) {
  uint16_t h;
  std::memcpy(&h, b, 2);
  return f16_to_f32(h);
}

TEST(CudaKernels, ActivationQuantizationMatchesTheCpuBitForBit) {
  TD_REQUIRE_GPU();
  const int64_t rows = 3, cols = 512;
  std::vector<float> x = random_floats(size_t(rows * cols), 21, 2.0f);
  // Ties of magnitude with opposite signs (q8_K keeps the first), an all-zero
  // block, and a block of one value.
  x[10] = 9.0f, x[200] = -9.0f;
  for (int i = 256; i < 288; ++i) x[i] = 0.0f;
  x[cols + 300] = -7.5f, x[cols + 301] = 7.5f;
  for (int i = 0; i < 32; ++i) x[2 * cols + 64 + i] = 0.25f;
  DevVec<float> dx(x);
  TestActs a8, ak, a16, abf, a32;
  make_acts(a8, ActType::kQ8_0, rows, cols);
  make_acts(ak, ActType::kQ8_K, rows, cols);
  make_acts(a16, ActType::kF16, rows, cols);
  make_acts(abf, ActType::kBF16, rows, cols);
  make_acts(a32, ActType::kF32, rows, cols);
  RowOp op;
  op.n_rows = rows;
  op.E = cols;
  op.mode = RowMode::kPlain;
  op.x = dx.get();
  op.x_ld = cols;
  op.n_forms = 5;
  op.forms[0] = {a8.acts, 0, rows};
  op.forms[1] = {ak.acts, 0, rows};
  op.forms[2] = {a16.acts, 0, rows};
  op.forms[3] = {abf.acts, 0, rows};
  op.forms[4] = {a32.acts, 1, rows};  // a range: row 0 must stay untouched
  row_op(op, nullptr);
  const auto q8 = a8.q.download(), qk = ak.q.download(), h16 = a16.q.download(), hbf = abf.q.download(),
             f32 = a32.q.download();
  const auto d8 = a8.d.download(), dk = ak.d.download();
  const auto s8 = a8.sums.download(), sk = ak.sums.download();
  const int64_t ld = a8.acts.ld;
  for (int64_t r = 0; r < rows; ++r) {
    SCOPED_TRACE("row " + std::to_string(r));
    const float* xr = x.data() + r * cols;
    std::vector<uint8_t> ref(row_bytes(GgmlType::Q8_0, cols));
    quantize_activations(GgmlType::Q8_0, xr, ref.data(), cols);
    for (int64_t b = 0; b < cols / 32; ++b) {
      const uint8_t* blk = ref.data() + b * 34;
      ASSERT_EQ(d8[r * (ld / 32) + b], q8_0_scale(blk)) << "q8_0 scale, block " << b;
      int sum = 0;
      for (int i = 0; i < 32; ++i) {
        const int8_t want = static_cast<int8_t>(blk[2 + i]);
        ASSERT_EQ(static_cast<int8_t>(q8[r * ld + b * 32 + i]), want) << "q8_0 quant, element " << b * 32 + i;
        sum += want;
      }
      ASSERT_EQ(s8[r * (ld / 32) + b], sum) << "q8_0 block sum " << b;
    }
    std::vector<uint8_t> refk(row_bytes(GgmlType::Q8_K, cols));
    quantize_activations(GgmlType::Q8_K, xr, refk.data(), cols);
    for (int64_t b = 0; b < cols / 256; ++b) {
      const uint8_t* blk = refk.data() + b * 292;
      float d;
      std::memcpy(&d, blk, 4);
      ASSERT_EQ(dk[r * (ld / 256) + b], d) << "q8_K scale, block " << b;
      for (int i = 0; i < 256; ++i)
        ASSERT_EQ(static_cast<int8_t>(qk[r * ld + b * 256 + i]), static_cast<int8_t>(blk[4 + i]))
            << "q8_K quant, element " << b * 256 + i;
      for (int g = 0; g < 16; ++g) {
        int16_t s;
        std::memcpy(&s, blk + 260 + 2 * g, 2);
        ASSERT_EQ(sk[r * (ld / 16) + b * 16 + g], s) << "q8_K group sum " << b * 16 + g;
      }
    }
    for (int64_t i = 0; i < cols; ++i) {
      uint16_t h, bf;
      std::memcpy(&h, h16.data() + (r * ld + i) * 2, 2);
      std::memcpy(&bf, hbf.data() + (r * ld + i) * 2, 2);
      ASSERT_EQ(h, f32_to_f16(xr[i])) << "f16 element " << i;
      ASSERT_EQ(bf, f32_to_bf16(xr[i])) << "bf16 element " << i;
      float f;
      std::memcpy(&f, f32.data() + (r * ld + i) * 4, 4);
      ASSERT_EQ(f, r == 0 ? 0.0f : xr[i]) << "f32 element " << i;
    }
  }
}

TEST(CudaKernels, MatrixVectorProductsMatchTheCpuDot) {
  TD_REQUIRE_GPU();
  for (GgmlType t : kTypes) {
    SCOPED_TRACE(tname(t));
    const int64_t N = 37, K = width_for(t), B = 11;  // 11 rows: one launch of 8, one of 3
    TestMatrix w;
    make_matrix(w, t, N, K, 7);
    const std::vector<float> x = random_floats(size_t(B * K), 8);
    DevVec<float> dx(x);
    TestActs a;
    make_acts(a, act_type_for(t), B, K);
    quantize_on_gpu(dx, B, K, a);
    DevVec<float> out(size_t(B * N));
    GemvJob job{w.m, out.get(), N};
    gemv(&job, 1, a.acts, 0, static_cast<int32_t>(B), nullptr);
    const std::vector<float> got = out.download();

    const GgmlType at = vec_dot_type(t);
    const VecDotFn dot = vec_dot_ref_fn(t);
    std::vector<uint8_t> q(row_bytes(at, K));
    std::vector<float> want(got.size()), tol(got.size());
    for (int64_t b = 0; b < B; ++b) {
      quantize_activations(at, x.data() + b * K, q.data(), K);
      for (int64_t n = 0; n < N; ++n) {
        want[b * N + n] = dot(K, w.bytes.data() + n * w.row_bytes_, q.data());
        double mag = 0;
        for (int64_t k = 0; k < K; ++k) mag += std::fabs(double(w.values[n * K + k]) * x[b * K + k]);
        tol[b * N + n] = static_cast<float>(1e-5 * mag + 1e-6);
      }
    }
    size_t bad = 0, first = SIZE_MAX;
    double worst = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      const double e = std::fabs(double(got[i]) - want[i]);
      worst = std::max(worst, e / tol[i]);
      if (!(e <= tol[i])) {
        ++bad;
        if (first == SIZE_MAX) first = i;
      }
    }
    EXPECT_EQ(bad, 0u) << "gemv " << tname(t) << ": worst error " << worst << "x the tolerance; first mismatch at row "
                       << (first == SIZE_MAX ? -1 : int64_t(first / N)) << " col "
                       << (first == SIZE_MAX ? -1 : int64_t(first % N)) << " (got "
                       << (first == SIZE_MAX ? 0.f : got[first]) << ", want " << (first == SIZE_MAX ? 0.f : want[first])
                       << ")";

    // The same rows alone, and the matrix as one of three in a launch: the
    // very same bits.
    for (int32_t r : {0, 5, 10}) {
      DevVec<float> one(size_t(B * N));
      GemvJob j1{w.m, one.get(), N};
      gemv(&j1, 1, a.acts, r, 1, nullptr);
      const std::vector<float> g1 = one.download();
      EXPECT_EQ(first_byte_diff(g1.data() + r * N, got.data() + r * N, N * 4), SIZE_MAX)
          << "gemv " << tname(t) << ": row " << r << " alone differs from the batch";
    }
    DevVec<float> o1(size_t(B * N)), o2(size_t(B * N)), o3(size_t(B * N));
    GemvJob three[3] = {{w.m, o1.get(), N}, {w.m, o2.get(), N}, {w.m, o3.get(), N}};
    gemv(three, 3, a.acts, 0, static_cast<int32_t>(B), nullptr);
    for (const DevVec<float>* o : {&o1, &o2, &o3}) {
      const std::vector<float> g = o->download();
      EXPECT_EQ(first_byte_diff(g.data(), got.data(), got.size() * 4), SIZE_MAX)
          << "gemv " << tname(t) << ": a job of a three-matrix launch differs";
    }
  }
}

TEST(CudaKernels, RmsNormResidualAndGatherMatchTheCpu) {
  TD_REQUIRE_GPU();
  const int64_t R = 5, E = 320;
  const std::vector<float> x0 = random_floats(size_t(R * E), 31, 3.0f), o = random_floats(size_t(R * E), 32),
                           w = random_floats(size_t(E), 33), w2 = random_floats(size_t(E), 34);
  for (bool sandwich : {false, true}) {
    SCOPED_TRACE(sandwich ? "sandwich" : "plain add");
    DevVec<float> dx(x0), dout(o), dw(w), dw2(w2);
    TestActs f;
    make_acts(f, ActType::kF32, R, E);
    const std::vector<int32_t> rows = {4, 1, 3};
    DevVec<int32_t> drows(rows);
    RowOp op;
    op.n_rows = 3;
    op.E = E;
    op.rows = drows.get();
    op.mode = RowMode::kNorm;
    op.x = dx.get();
    op.x_ld = E;
    op.add = dout.get();
    op.add_ld = E;
    op.add_w = sandwich ? dw2.get() : nullptr;
    op.norm_w = dw.get();
    op.eps = 1e-6f;
    op.n_forms = 1;
    op.forms[0] = {f.acts, 0, 3};
    row_op(op, nullptr);
    const std::vector<float> gx = dx.download();
    const std::vector<uint8_t> raw = f.q.download();
    std::vector<float> x = x0;
    for (size_t i = 0; i < rows.size(); ++i) {
      float* xr = x.data() + rows[i] * E;
      std::vector<float> add(o.begin() + rows[i] * E, o.begin() + (rows[i] + 1) * E);
      if (sandwich) rms_norm(add.data(), w2.data(), E, 1e-6f, add.data());
      for (int64_t e = 0; e < E; ++e) xr[e] += add[e];
      std::vector<float> want(E);
      rms_norm(xr, w.data(), E, 1e-6f, want.data());
      std::vector<float> got(E);
      std::memcpy(got.data(), raw.data() + i * f.acts.ld * 4, E * 4);
      TD_EXPECT_CLOSE(got.data(), want.data(), size_t(E), 1e-6, 2e-6, "rms_norm output of row " + std::to_string(rows[i]));
    }
    TD_EXPECT_CLOSE(gx.data(), x.data(), gx.size(), 1e-6, 2e-6, "residual stream");
  }
}

TEST(CudaKernels, GatedActivationsMatchTheCpu) {
  TD_REQUIRE_GPU();
  const int64_t R = 3, F = 288;
  const std::vector<float> g = random_floats(size_t(R * F), 41, 4.0f), u = random_floats(size_t(R * F), 42);
  std::vector<uint16_t> table(1 << 16);
  for (uint32_t i = 0; i < table.size(); ++i) table[i] = f32_to_f16(gelu_tanh(f16_to_f32(static_cast<uint16_t>(i))));
  DevVec<uint16_t> dt(table);
  for (ActFn act : {ActFn::kSilu, ActFn::kGeluTanh}) {
    const bool gelu = act == ActFn::kGeluTanh;
    SCOPED_TRACE(gelu ? "gelu" : "silu");
    DevVec<float> dg(g), du(u);
    TestActs f;
    make_acts(f, ActType::kF32, R, F);
    RowOp op;
    op.n_rows = R;
    op.E = F;
    op.mode = RowMode::kGated;
    op.gate = dg.get();
    op.up = du.get();
    op.gate_ld = F;
    op.act = act;
    op.gelu_table = dt.get();
    op.n_forms = 1;
    op.forms[0] = {f.acts, 0, R};
    row_op(op, nullptr);
    const std::vector<uint8_t> raw = f.q.download();
    for (int64_t r = 0; r < R; ++r) {
      std::vector<float> got(F), want(F);
      std::memcpy(got.data(), raw.data() + r * f.acts.ld * 4, F * 4);
      for (int64_t i = 0; i < F; ++i)
        want[i] = (gelu ? gelu_tanh(g[r * F + i]) : silu(g[r * F + i])) * u[r * F + i];
      // GELU is the same table: exact. SiLU: expf against libm's exp.
      TD_EXPECT_CLOSE(got.data(), want.data(), size_t(F), gelu ? 0.0 : 1e-7, gelu ? 0.0 : 2e-6,
                      "gated activation row " + std::to_string(r));
    }
  }
}

// ---- Q/K/V post-processing and attention, against a CPU KvCache ----

struct QkvCase {
  const char* name;
  int n_head, n_head_kv, head_dim, head_dim_v, rope_dims;
  bool neox, bias, qk_norm;
  KvType kv;
};

TEST(CudaKernels, QkvPostMatchesTheCpuForwardAndWritesTheCache) {
  TD_REQUIRE_GPU();
  const QkvCase cases[] = {
      {"llama", 4, 2, 64, 64, 64, false, false, false, KvType::kF16},
      {"qwen2 bias", 4, 2, 64, 64, 64, true, true, false, KvType::kF16},
      {"qwen3/gemma qk-norm, f32 cache", 8, 2, 128, 128, 128, true, false, true, KvType::kF32},
      {"partial rope, odd dims", 3, 1, 40, 24, 16, false, true, true, KvType::kF16},
  };
  const int32_t bs = 16, n_blocks = 8;
  // Two sequences: 0 on blocks {5, 2} (rows at 14..19, across a block), 1 on {7}.
  const std::vector<std::vector<int32_t>> tables = {{5, 2}, {7}};
  const std::vector<int32_t> row_seq = {0, 0, 0, 0, 0, 0, 1}, row_pos = {14, 15, 16, 17, 18, 19, 3};
  const int R = static_cast<int>(row_pos.size());
  for (const QkvCase& c : cases) {
    SCOPED_TRACE(c.name);
    const int QW = c.n_head * c.head_dim, KW = c.n_head_kv * c.head_dim, VW = c.n_head_kv * c.head_dim_v;
    std::vector<float> q = random_floats(size_t(R * QW), 51), k = random_floats(size_t(R * KW), 52),
                       v = random_floats(size_t(R * VW), 53);
    const std::vector<float> bq = random_floats(QW, 54), bk = random_floats(KW, 55), bv = random_floats(VW, 56),
                             qn = random_floats(c.head_dim, 57), kn = random_floats(c.head_dim, 58);
    RopeParams rope;
    rope.style = c.neox ? RopeStyle::kNeox : RopeStyle::kNormal;
    rope.dims = c.rope_dims;
    rope.base = 10000.0f;
    const int half = c.rope_dims / 2;
    std::vector<float> cs(32 * half), sn(32 * half);
    for (int p = 0; p < 32; ++p) rope_angles(rope, p, cs.data() + p * half, sn.data() + p * half);
    const float scale = 1.0f / std::sqrt(float(c.head_dim));

    // The CPU: Model::attention_rows's per-row code.
    const KvShape shape{1, KW, VW, c.n_head_kv};
    KvCache cpu(shape, n_blocks, bs, c.kv);
    std::vector<float> q_want = q;
    for (int r = 0; r < R; ++r) {
      float* qr = q_want.data() + r * QW;
      std::vector<float> kr(k.begin() + r * KW, k.begin() + (r + 1) * KW), vr(v.begin() + r * VW, v.begin() + (r + 1) * VW);
      if (c.bias) {
        for (int i = 0; i < QW; ++i) qr[i] += bq[i];
        for (int i = 0; i < KW; ++i) kr[i] += bk[i];
        for (int i = 0; i < VW; ++i) vr[i] += bv[i];
      }
      if (c.qk_norm) {
        for (int h = 0; h < c.n_head; ++h) rms_norm(qr + h * c.head_dim, qn.data(), c.head_dim, 1e-6f, qr + h * c.head_dim);
        for (int h = 0; h < c.n_head_kv; ++h)
          rms_norm(kr.data() + h * c.head_dim, kn.data(), c.head_dim, 1e-6f, kr.data() + h * c.head_dim);
      }
      const float* rc = cs.data() + row_pos[r] * half;
      const float* rs = sn.data() + row_pos[r] * half;
      for (int h = 0; h < c.n_head; ++h) {
        rope_apply(rope, rc, rs, qr + h * c.head_dim);
        for (int i = 0; i < c.head_dim; ++i) qr[h * c.head_dim + i] *= scale;
      }
      for (int h = 0; h < c.n_head_kv; ++h) rope_apply(rope, rc, rs, kr.data() + h * c.head_dim);
      cpu.write(0, tables[row_seq[r]][row_pos[r] / bs], row_pos[r] % bs, kr.data(), vr.data());
    }

    DevVec<float> dq(q), dk(k), dv(v), dbq(bq), dbk(bk), dbv(bv), dqn(qn), dkn(kn), dcs(cs), dsn(sn);
    DevVec<int32_t> dpos(row_pos), dseq(row_seq);
    const int32_t table_ld = 4;
    std::vector<int32_t> tab(2 * table_ld, 0);
    for (size_t s = 0; s < tables.size(); ++s) std::copy(tables[s].begin(), tables[s].end(), tab.begin() + s * table_ld);
    DevVec<int32_t> dtab(tab);
    const size_t esize = kv_bytes(c.kv, 1);
    DevVec<uint8_t> kc(size_t(n_blocks) * bs * KW * esize), vc(size_t(n_blocks) * bs * VW * esize);
    QkvPost p;
    p.n_rows = R;
    p.q = dq.get(), p.k = dk.get(), p.v = dv.get();
    p.q_ld = QW, p.k_ld = KW, p.v_ld = VW;
    if (c.bias) p.bq = dbq.get(), p.bk = dbk.get(), p.bv = dbv.get();
    if (c.qk_norm) p.q_norm = dqn.get(), p.k_norm = dkn.get();
    p.eps = 1e-6f;
    p.n_head = c.n_head, p.n_head_kv = c.n_head_kv, p.head_dim = c.head_dim, p.head_dim_v = c.head_dim_v;
    p.rope_dims = c.rope_dims;
    p.rope_neox = c.neox;
    p.rope_cos = dcs.get(), p.rope_sin = dsn.get();
    p.attn_scale = scale;
    p.pos = dpos.get(), p.seq = dseq.get(), p.tables = dtab.get(), p.table_ld = table_ld;
    p.k_cache = kc.get(), p.v_cache = vc.get();
    p.kv_f16 = c.kv == KvType::kF16;
    p.block_size = bs, p.n_blocks = n_blocks;
    qkv_post(p, nullptr);
    const std::vector<float> qg = dq.download();
    TD_EXPECT_CLOSE(qg.data(), q_want.data(), qg.size(), 1e-6, 2e-6, "rotated, scaled q");

    // The caches, slot by slot through the CPU layout.
    const std::vector<uint8_t> kg = kc.download(), vg = vc.download();
    KvCache gpu(shape, n_blocks, bs, c.kv);
    const KvLayerView view = gpu.layer_view(0, nullptr);
    // The view is read-only; the pool it shows is gpu's own, and gpu is not const.
    std::memcpy(const_cast<std::byte*>(view.keys), kg.data(), kg.size());
    std::memcpy(const_cast<std::byte*>(view.values), vg.data(), vg.size());
    for (int r = 0; r < R; ++r) {
      std::vector<float> k1(KW), v1(VW), k2(KW), v2(VW);
      const int32_t blk = tables[row_seq[r]][row_pos[r] / bs], slot = row_pos[r] % bs;
      cpu.read(0, blk, slot, k1.data(), v1.data());
      gpu.read(0, blk, slot, k2.data(), v2.data());
      const double tol = c.kv == KvType::kF16 ? 1e-3 : 2e-6;  // one f16 step where the float differs in its last bit
      TD_EXPECT_CLOSE(k2.data(), k1.data(), size_t(KW), 1e-6, tol, "K cache row " + std::to_string(r));
      TD_EXPECT_CLOSE(v2.data(), v1.data(), size_t(VW), 0.0, 0.0, "V cache row " + std::to_string(r));
    }
  }
}

struct AttnCase {
  const char* name;
  int n_head, n_head_kv, head_dim, head_dim_v, window, block_size;
  KvType kv;
};

// Random K/V in a CPU KvCache for two sequences on scattered blocks, copied
// to the device as they are (same layout).
struct AttnSetup {
  AttnCase c;
  std::unique_ptr<KvCache> cpu;
  std::vector<std::vector<int32_t>> tables;
  std::vector<int32_t> lens;
  DevVec<uint8_t> kc, vc;
  DevVec<int32_t> dtab;
  int32_t table_ld = 0;
};

void make_attn(AttnSetup& s, const AttnCase& c) {
  s.c = c;
  s.lens = {300, 77};
  const int KW = c.n_head_kv * c.head_dim, VW = c.n_head_kv * c.head_dim_v;
  int32_t need = 0;
  for (int32_t n : s.lens) need += (n + c.block_size - 1) / c.block_size;
  const int32_t n_blocks = need + 5;
  s.cpu = std::make_unique<KvCache>(KvShape{1, KW, VW, c.n_head_kv}, n_blocks, c.block_size, c.kv);
  std::vector<int32_t> ids(n_blocks);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), std::mt19937(61));
  size_t next = 0;
  std::mt19937 rng(62);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (int32_t n : s.lens) {
    std::vector<int32_t> t;
    for (int32_t b = 0; b < (n + c.block_size - 1) / c.block_size; ++b) t.push_back(ids[next++]);
    std::vector<float> k(KW), v(VW);
    for (int32_t p = 0; p < n; ++p) {
      for (float& x : k) x = nd(rng);
      for (float& x : v) x = nd(rng);
      s.cpu->write(0, t[p / c.block_size], p % c.block_size, k.data(), v.data());
    }
    s.tables.push_back(t);
  }
  const KvLayerView view = s.cpu->layer_view(0, nullptr);
  const size_t kb = size_t(n_blocks) * c.block_size * KW * kv_bytes(c.kv, 1);
  const size_t vb = size_t(n_blocks) * c.block_size * VW * kv_bytes(c.kv, 1);
  std::vector<uint8_t> hk(kb), hv(vb);
  std::memcpy(hk.data(), view.keys, kb);
  std::memcpy(hv.data(), view.values, vb);
  s.kc.upload(hk);
  s.vc.upload(hv);
  s.table_ld = 64;  // sequence 0 takes 38 blocks of 8
  std::vector<int32_t> tab(2 * s.table_ld, 0);
  for (size_t i = 0; i < s.tables.size(); ++i) std::copy(s.tables[i].begin(), s.tables[i].end(), tab.begin() + i * s.table_ld);
  s.dtab.upload(tab);
}

AttnArgs attn_args(const AttnSetup& s, const DevVec<float>& q, DevVec<float>& out, const DevVec<int32_t>& pos,
                   const DevVec<int32_t>& seq) {
  const AttnCase& c = s.c;
  AttnArgs a;
  a.q = q.get();
  a.q_ld = c.n_head * c.head_dim;
  a.out = out.get();
  a.out_ld = c.n_head * c.head_dim_v;
  a.n_head = c.n_head, a.n_head_kv = c.n_head_kv, a.head_dim = c.head_dim, a.head_dim_v = c.head_dim_v;
  a.window = c.window;
  a.k_cache = s.kc.get(), a.v_cache = s.vc.get();
  a.kv_f16 = c.kv == KvType::kF16;
  a.block_size = c.block_size;
  a.n_blocks = s.cpu->n_blocks();
  a.pos = pos.get(), a.seq = seq.get(), a.tables = s.dtab.get(), a.table_ld = s.table_ld;
  return a;
}

const AttnCase kAttnCases[] = {
    {"tinyllama-like, f16", 32, 4, 64, 64, 0, 16, KvType::kF16},
    {"gemma-like window 40, f16", 4, 1, 256, 256, 40, 16, KvType::kF16},
    {"mha, f32 cache, blocks of 8", 4, 4, 128, 128, 0, 8, KvType::kF32},
    {"odd dims, window 100", 6, 2, 40, 24, 100, 16, KvType::kF16},
};

TEST(CudaKernels, PrefillAttentionMatchesTheCpuAndIgnoresTiling) {
  TD_REQUIRE_GPU();
  ThreadPool pool(2);
  for (const AttnCase& c : kAttnCases) {
    SCOPED_TRACE(c.name);
    AttnSetup s;
    make_attn(s, c);
    // Runs: sequence 0 positions 250..299 (50 rows), sequence 1 positions 0..76.
    struct Run {
      int seq, pos0, n;
    };
    const std::vector<Run> runs = {{0, 250, 50}, {1, 0, 77}};
    int R = 0;
    for (const Run& r : runs) R += r.n;
    const int QW = c.n_head * c.head_dim, OW = c.n_head * c.head_dim_v;
    const std::vector<float> q = random_floats(size_t(R * QW), 71, 0.3f);
    std::vector<int32_t> pos, seq;
    std::vector<PrefillTile> tiles;
    for (const Run& r : runs) {
      for (int t0 = 0; t0 < r.n; t0 += kPrefillTileRows)
        tiles.push_back({static_cast<int32_t>(pos.size()) + t0, std::min(kPrefillTileRows, r.n - t0)});
      for (int i = 0; i < r.n; ++i) pos.push_back(r.pos0 + i), seq.push_back(r.seq);
    }
    DevVec<float> dq(q), dout(size_t(R * OW));
    DevVec<int32_t> dpos(pos), dseq(seq);
    DevVec<int32_t> dtiles(std::vector<int32_t>(reinterpret_cast<int32_t*>(tiles.data()),
                                                reinterpret_cast<int32_t*>(tiles.data()) + 2 * tiles.size()));
    attention_prefill(attn_args(s, dq, dout, dpos, dseq), reinterpret_cast<const PrefillTile*>(dtiles.get()),
                      static_cast<int32_t>(tiles.size()), nullptr);
    const std::vector<float> got = dout.download();
    ASSERT_EQ(cudaGetLastError(), cudaSuccess);

    std::vector<float> want(got.size());
    const AttnShape shape{c.n_head, c.n_head_kv, c.head_dim, c.head_dim_v, c.window};
    int row = 0;
    for (const Run& r : runs) {
      attention_prefill(shape, s.cpu->layer_view(0, s.tables[r.seq].data()), q.data() + row * QW, QW, r.pos0, r.n,
                        want.data() + row * OW, OW, pool);
      row += r.n;
    }
    TD_EXPECT_CLOSE(got.data(), want.data(), got.size(), 2e-5, 1e-4, "attention_prefill");

    // Sequence 1's queries 5..76 as their own run (tiles start elsewhere):
    // the same bits for the same queries.
    std::vector<PrefillTile> t2;
    for (int t0 = 50 + 5; t0 < R; t0 += kPrefillTileRows) t2.push_back({t0, std::min(kPrefillTileRows, R - t0)});
    DevVec<float> dout2(size_t(R * OW));
    DevVec<int32_t> dt2(std::vector<int32_t>(reinterpret_cast<int32_t*>(t2.data()),
                                             reinterpret_cast<int32_t*>(t2.data()) + 2 * t2.size()));
    attention_prefill(attn_args(s, dq, dout2, dpos, dseq), reinterpret_cast<const PrefillTile*>(dt2.get()),
                      static_cast<int32_t>(t2.size()), nullptr);
    const std::vector<float> got2 = dout2.download();
    EXPECT_EQ(first_byte_diff(got2.data() + 55 * OW, got.data() + 55 * OW, size_t(R - 55) * OW * 4), SIZE_MAX)
        << "a query's prefill attention depends on its tile";
  }
}

TEST(CudaKernels, DecodeAttentionMatchesTheCpuAndIsBatchInvariant) {
  TD_REQUIRE_GPU();
  ThreadPool pool(2);
  for (const AttnCase& c : kAttnCases) {
    SCOPED_TRACE(c.name);
    AttnSetup s;
    make_attn(s, c);
    // Rows: sequence 0 at 299 (5 chunks of 64), sequence 1 at 76, sequence 0
    // at 150, sequence 1 at 0 (a single position).
    const std::vector<int32_t> seq = {0, 1, 0, 1}, pos = {299, 76, 150, 0};
    const int R = static_cast<int>(pos.size());
    const int QW = c.n_head * c.head_dim, OW = c.n_head * c.head_dim_v;
    const std::vector<float> q = random_floats(size_t(R * QW), 81, 0.3f);
    DevVec<float> dq(q), dout(size_t(R * OW));
    DevVec<int32_t> dpos(pos), dseq(seq);
    DevVec<float> partials(decode_scratch_floats(R, c.n_head, c.head_dim_v));
    DevVec<int32_t> counters(size_t(R * c.n_head_kv));
    const DecodeScratch sc{partials.get(), counters.get()};
    attention_decode(attn_args(s, dq, dout, dpos, dseq), 0, R, sc, nullptr);
    const std::vector<float> got = dout.download();
    ASSERT_EQ(cudaGetLastError(), cudaSuccess);

    const AttnShape shape{c.n_head, c.n_head_kv, c.head_dim, c.head_dim_v, c.window};
    std::vector<KvLayerView> views;
    for (int r = 0; r < R; ++r) views.push_back(s.cpu->layer_view(0, s.tables[seq[r]].data()));
    std::vector<float> want(got.size());
    attention_decode(shape, views.data(), pos.data(), R, q.data(), QW, want.data(), OW, pool);
    TD_EXPECT_CLOSE(got.data(), want.data(), got.size(), 2e-5, 1e-4, "attention_decode");

    // Each row alone (and again: the counters were reset): the same bits.
    for (int r = 0; r < R; ++r) {
      DevVec<float> one(size_t(R * OW));
      attention_decode(attn_args(s, dq, one, dpos, dseq), r, 1, sc, nullptr);
      const std::vector<float> g1 = one.download();
      EXPECT_EQ(first_byte_diff(g1.data() + r * OW, got.data() + r * OW, size_t(OW) * 4), SIZE_MAX)
          << "decode row " << r << " alone differs from the batch";
    }
    const std::vector<int32_t> cg = counters.download();
    EXPECT_TRUE(std::all_of(cg.begin(), cg.end(), [](int32_t v) { return v == 0; })) << "fold counters not reset";
  }
}

TEST(CudaKernels, KvBlockCopiesMatchTheCpuCache) {
  TD_REQUIRE_GPU();
  for (KvType type : {KvType::kF16, KvType::kF32}) {
    SCOPED_TRACE(kv_type_name(type));
    const KvShape shape{3, 2 * 40, 2 * 24, 2};
    const int32_t n_blocks = 7, bs = 16;
    KvCache cpu(shape, n_blocks, bs, type);
    std::mt19937 rng(91);
    std::normal_distribution<float> nd;
    std::vector<float> k(shape.k_width), v(shape.v_width);
    for (int l = 0; l < shape.n_layer; ++l)
      for (int b = 0; b < n_blocks; ++b)
        for (int s = 0; s < bs; ++s) {
          for (float& x : k) x = nd(rng);
          for (float& x : v) x = nd(rng);
          cpu.write(l, b, s, k.data(), v.data());
        }
    const size_t esize = kv_bytes(type, 1);
    const size_t kb = size_t(n_blocks) * bs * shape.n_layer * shape.k_width * esize;
    const size_t vb = size_t(n_blocks) * bs * shape.n_layer * shape.v_width * esize;
    const KvLayerView base = cpu.layer_view(0, nullptr);
    std::vector<uint8_t> hk(kb), hv(vb);
    std::memcpy(hk.data(), base.keys, kb);
    std::memcpy(hv.data(), base.values, vb);
    DevVec<uint8_t> dk(hk), dv(hv), stage(cpu.block_bytes());
    KvBlockRuns runs;
    runs.k = dk.get(), runs.v = dv.get();
    runs.n_layer = shape.n_layer, runs.n_head_kv = shape.n_head_kv, runs.n_blocks = n_blocks;
    runs.k_run = size_t(bs) * (shape.k_width / shape.n_head_kv) * esize;
    runs.v_run = size_t(bs) * (shape.v_width / shape.n_head_kv) * esize;

    std::vector<std::byte> want(cpu.block_bytes());
    cpu.save_block(3, want.data());
    kv_gather_block(runs, 3, stage.get(), nullptr);
    const std::vector<uint8_t> got = stage.download();
    EXPECT_EQ(first_byte_diff(got.data(), want.data(), got.size()), SIZE_MAX) << "gather (save_block) of block 3";

    kv_scatter_block(runs, 5, stage.get(), nullptr);  // block 3's bytes into block 5
    cpu.load_block(5, want.data());
    kv_copy_block(runs, 1, 6, nullptr);
    cpu.copy_block(1, 6);
    const std::vector<uint8_t> gk = dk.download(), gv = dv.download();
    EXPECT_EQ(first_byte_diff(gk.data(), base.keys, kb), SIZE_MAX) << "K after scatter into 5 and copy 1 -> 6";
    EXPECT_EQ(first_byte_diff(gv.data(), base.values, vb), SIZE_MAX) << "V after scatter into 5 and copy 1 -> 6";
  }
}

TEST(CudaKernels, ReadKernelRuns) {
  TD_REQUIRE_GPU();
  DevVec<uint8_t> buf(size_t{64} << 20);
  DevVec<uint32_t> sink(1);
  read_kernel(buf.get(), buf.size(), sink.get(), nullptr);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

}  // namespace
}  // namespace tandem

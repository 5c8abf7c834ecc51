// The CUDA kernels of the GPU executor, as plain launch functions that the
// host code (cuda_executor.cpp, tests) calls with device pointers. Each one is
// testable alone against the CPU reference it mirrors (tests/cuda/).
//
// Layouts on the device:
// - Weights (DevMatrix) keep their GGUF format. Formats whose blocks are not
//   a multiple of 16 bytes (q8_0 34, q4_0 18, q5_0 22, q6_K 210) are split on
//   upload into arrays of quants, high bits, scales (the same bytes,
//   regrouped) so that every quant load is an aligned 16-byte load; q4_K,
//   q5_K (144, 176 bytes), f16, bf16 and f32 rows stay as stored.
// - Activations for the matrix-vector kernels (DevActs) are quantized as the
//   CPU quantizes them for its dot products (kernels/dot.h): q8_0 for
//   q4_0/q5_0/q8_0 weights, q8_K for the K-quants, f16 / bf16 / f32 for those
//   types; the integer sums per block are then the CPU's exactly.
// - The KV cache is the CPU KvCache's layout (kv/kv_cache.h): K as
//   [layer][head][block][head_dim][slot], V as [layer][head][block][slot][head_dim].
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

#include "quant/ggml_type.h"

namespace tandem::cuda {

// Weight types the kernels compute with.
bool weight_type_supported(GgmlType t);

struct DevMatrix {
  GgmlType type = GgmlType::F32;
  int64_t rows = 0, cols = 0;
  // Split formats: q8_0 int8 [rows][cols]; q4_0 / q5_0 nibbles [rows][cols/2];
  // q6_K low nibbles [rows][cols/2]. Others: the GGUF rows as stored.
  const uint8_t* q = nullptr;
  const uint8_t* qh = nullptr;   // q5_0: uint32 [rows][cols/32]; q6_K: [rows][cols/4]
  const int8_t* sc = nullptr;    // q6_K: [rows][cols/16]
  const uint16_t* d = nullptr;   // q8_0 / q4_0 / q5_0: f16 [rows][cols/32]; q6_K: f16 [rows][cols/256]
};

// Device bytes of a matrix in the layout above (plus tail padding), and the
// offsets of its parts inside one allocation.
struct MatrixLayout {
  size_t q = 0, qh = 0, sc = 0, d = 0;  // offsets
  size_t bytes = 0;
};
MatrixLayout matrix_layout(GgmlType t, int64_t rows, int64_t cols);
DevMatrix matrix_at(GgmlType t, int64_t rows, int64_t cols, uint8_t* base);

// Rewrites `n_rows` GGUF rows (row_bytes each, contiguous at `src`, on the
// device) into the layout of `m` starting at row `row0`. For the types kept
// as stored it is a plain copy.
void upload_rows(const DevMatrix& m, const uint8_t* src, int64_t row0, int64_t n_rows, cudaStream_t s);

// Activation rows in a dot type.
enum class ActType : int32_t { kF32, kF16, kBF16, kQ8_0, kQ8_K };
ActType act_type_for(GgmlType weight);  // the CPU's vec_dot_type

struct DevActs {
  ActType type = ActType::kF32;
  int64_t ld = 0;            // elements per row (the buffers' row stride)
  void* q = nullptr;         // f32 / f16 / bf16 values, or int8 quants
  float* d = nullptr;        // q8_0: [row][ld/32] (the f16-rounded scale); q8_K: [row][ld/256]
  int16_t* sums = nullptr;   // q8_0: sum of each block's quants [row][ld/32]; q8_K: per 16 [row][ld/16]
};

// ---- Per-row operations (ops.cu) ----

// Which rows get a form: output rows [r0, r1) of the operation.
struct ActForm {
  DevActs acts;
  int32_t r0 = 0, r1 = 0;
};

// One block per output row i (input row rows[i], or i):
//   if add:      x += add_w ? rms_norm(add) * add_w : add          (residual, in place)
//   mode kNorm:  v = rms_norm(x) * norm_w
//   mode kPlain: v = x
//   mode kGated: v = act(gate) * up                                (gate, up rows of width E)
// and v is written in every form whose row range holds i.
enum class RowMode : int32_t { kNorm, kPlain, kGated };
enum class ActFn : int32_t { kSilu, kGeluTanh };
struct RowOp {
  int32_t n_rows = 0, E = 0;
  const int32_t* rows = nullptr;  // device; null: identity
  RowMode mode = RowMode::kNorm;
  float* x = nullptr;
  int64_t x_ld = 0;
  const float* add = nullptr;
  int64_t add_ld = 0;
  const float* add_w = nullptr;
  const float* norm_w = nullptr;
  float eps = 1e-5f;
  const float* gate = nullptr;
  const float* up = nullptr;
  int64_t gate_ld = 0;
  ActFn act = ActFn::kSilu;
  const uint16_t* gelu_table = nullptr;  // 65536 f16 entries (kGeluTanh)
  ActForm forms[5];
  int32_t n_forms = 0;
};
void row_op(const RowOp& op, cudaStream_t s);

// x[i][:] = dequantized row tokens[i] of the embedding, times scale.
void embed_rows(const DevMatrix& emb, const int32_t* tokens, int32_t n_rows, float scale, float* x, int64_t x_ld,
                cudaStream_t s);

// ---- Q, K, V after their products (ops.cu) ----
struct QkvPost {
  int32_t n_rows = 0;
  float* q = nullptr;        // [row][q_ld], rotated and scaled in place
  const float* k = nullptr;  // [row][k_ld]
  const float* v = nullptr;  // [row][v_ld]
  int64_t q_ld = 0, k_ld = 0, v_ld = 0;
  const float *bq = nullptr, *bk = nullptr, *bv = nullptr;   // biases or null
  const float *q_norm = nullptr, *k_norm = nullptr;           // per-head RMS norm weights or null
  float eps = 1e-6f;
  int32_t n_head = 0, n_head_kv = 0, head_dim = 0, head_dim_v = 0;
  int32_t rope_dims = 0;
  bool rope_neox = false;
  const float* rope_cos = nullptr;  // [pos][rope_dims/2], from rope_angles()
  const float* rope_sin = nullptr;
  float attn_scale = 1.0f;
  const int32_t* pos = nullptr;     // [row]
  const int32_t* seq = nullptr;     // [row] -> block table row
  const int32_t* tables = nullptr;  // [seq][table_ld]
  int32_t table_ld = 0;
  // This layer's K and V bases in the cache layout (kv/kv_cache.h).
  void* k_cache = nullptr;
  void* v_cache = nullptr;
  bool kv_f16 = true;
  int32_t block_size = 16, n_blocks = 0;
};
void qkv_post(const QkvPost& p, cudaStream_t s);

// ---- Attention (attention.cu) ----
struct AttnArgs {
  const float* q = nullptr;  // [row][q_ld], scaled
  int64_t q_ld = 0;
  float* out = nullptr;      // [row][out_ld]
  int64_t out_ld = 0;
  int32_t n_head = 0, n_head_kv = 0, head_dim = 0, head_dim_v = 0;
  int32_t window = 0;        // > 0: a query at p sees positions > p - window
  const void* k_cache = nullptr;
  const void* v_cache = nullptr;
  bool kv_f16 = true;
  int32_t block_size = 16, n_blocks = 0;
  const int32_t* pos = nullptr;     // [row]
  const int32_t* seq = nullptr;     // [row]
  const int32_t* tables = nullptr;  // [seq][table_ld]
  int32_t table_ld = 0;
};

// Runs of consecutive rows of one sequence, cut into tiles of up to
// kPrefillTileRows queries: {first row, rows}.
inline constexpr int32_t kPrefillTileRows = 32;
struct PrefillTile {
  int32_t row0 = 0, n = 0;
};
void attention_prefill(const AttnArgs& a, const PrefillTile* tiles, int32_t n_tiles, cudaStream_t s);

// Rows [row0, row0 + n_rows), each one query over its sequence's cache up to
// its position. Split into kDecodeSplits parts along the positions (chunk c
// of kDecodeChunk positions to part c % kDecodeSplits), whatever the batch,
// then folded in part order: a row's result does not depend on the others.
inline constexpr int32_t kDecodeSplits = 16;
inline constexpr int32_t kDecodeChunk = 64;
// For the n_rows rows of one launch, indexed from its first row.
struct DecodeScratch {
  float* partials = nullptr;   // decode_scratch_floats(n_rows, ...) floats
  int32_t* counters = nullptr; // [n_rows][n_head_kv], zero at rest
};
size_t decode_scratch_floats(int32_t n_rows, int32_t n_head, int32_t head_dim_v);
void attention_decode(const AttnArgs& a, int32_t row0, int32_t n_rows, const DecodeScratch& scratch,
                      cudaStream_t s);
// Whether the kernels handle this shape (head dims, heads per KV head).
bool attention_shape_supported(int32_t n_head, int32_t n_head_kv, int32_t head_dim, int32_t head_dim_v);

// ---- Matrix-vector products (gemv_*.cu) ----
// out_j[r][n] = W_j[n] . x[r] for rows r in [row0, row0 + n_rows) of x and
// every matrix j (all of one type): one warp per weight row, the weights read
// once for up to kGemvMaxRows activation rows. A row's result does not
// depend on which other rows share the launch.
inline constexpr int32_t kGemvMaxRows = 8;
struct GemvJob {
  DevMatrix w;
  float* out = nullptr;
  int64_t out_ld = 0;
};
void gemv(const GemvJob* jobs, int32_t n_jobs, const DevActs& x, int32_t row0, int32_t n_rows, cudaStream_t s);

// ---- Dequantization (dequant.cu) ----
// Rows [0, m.rows) of m as f16 [row][cols] (for cuBLAS), or f32 (tests).
void dequantize_f16(const DevMatrix& m, uint16_t* out, cudaStream_t s);
void dequantize_f32(const DevMatrix& m, float* out, cudaStream_t s);

// ---- KV blocks (ops.cu) ----
// The runs of one block over every layer and head, in KvCache::save_block's
// order, from block `src` of the cache to `dst` (another block, when
// dst_block >= 0) or to / from a contiguous buffer.
struct KvBlockRuns {
  void* k = nullptr;  // whole-cache bases
  void* v = nullptr;
  int32_t n_layer = 0, n_head_kv = 0, n_blocks = 0;
  size_t k_run = 0, v_run = 0;  // bytes of one (layer, head) run in a block
};
void kv_copy_block(const KvBlockRuns& kv, int32_t src, int32_t dst, cudaStream_t s);
void kv_gather_block(const KvBlockRuns& kv, int32_t block, uint8_t* out, cudaStream_t s);
void kv_scatter_block(const KvBlockRuns& kv, int32_t block, const uint8_t* in, cudaStream_t s);

// ---- Memory bandwidth (ops.cu) ----
// Reads `bytes` (a multiple of 16) at p with 16-byte loads, summing into *sink.
void read_kernel(const void* p, size_t bytes, uint32_t* sink, cudaStream_t s);

// Programmatic dependent launch on or off for the kernels launched from now
// on (the executor turns it on where the device supports it, unless
// --cuda-disable pdl).
void set_pdl(bool on);
bool pdl_enabled();

}  // namespace tandem::cuda

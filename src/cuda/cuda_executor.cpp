// The model on a CUDA device: weights uploaded once in their stored formats,
// the KV pool in device memory in the CPU KvCache's layout, and the layer
// steps Model::forward follows (model/layer_recipe.h), in device kernels.
//
// Rows and paths. A forward pass first orders its rows: rows of sequences
// with two or more rows in the batch (prompt chunks, "run rows") first, then
// rows alone in their sequence (decode rows). Run rows go through cuBLASLt
// (f16 / bf16 / f32; quantized weights dequantized to f16) and the prefill
// attention kernel; decode rows through the matrix-vector kernels, which
// quantize activations as the CPU does, and the decode attention kernel.
// Both paths compute a row independently of the other rows of the batch:
// the matrix-vector kernels by construction, cuBLASLt because every shape
// runs one algorithm chosen once, without split-K (docs/cuda.md says what
// holds exactly). Decode-only steps are captured as CUDA graphs, one per
// row count, so a step is one launch.
#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <tuple>
#include <unordered_map>
#include <vector>

#include <fmt/format.h>

#include "core/error.h"
#include "quant/quant.h"
#include "cuda/cuda_check.h"
#include "cuda/kernels.h"
#include "gguf/gguf.h"
#include "kernels/ops.h"
#include "model/executor.h"
#include "model/layer_recipe.h"

namespace tandem {
namespace {

using namespace tandem::cuda;

// Rows a sequence must have in a batch for them to take the prefill path.
constexpr int32_t kRunRows = 2;
// Decode-only steps of up to this many rows run as CUDA graphs.
constexpr int32_t kMaxGraphRows = 256;
constexpr size_t kGemmWorkspace = size_t{32} << 20;
constexpr size_t kUploadChunk = size_t{64} << 20;

// Device memory, freed on destruction.
class DevBuf {
 public:
  DevBuf() = default;
  explicit DevBuf(size_t bytes) { alloc(bytes); }
  DevBuf(DevBuf&& o) noexcept : p_(o.p_), n_(o.n_) { o.p_ = nullptr, o.n_ = 0; }
  DevBuf& operator=(DevBuf&& o) noexcept {
    if (this != &o) {
      release();
      p_ = o.p_, n_ = o.n_;
      o.p_ = nullptr, o.n_ = 0;
    }
    return *this;
  }
  ~DevBuf() { release(); }
  void alloc(size_t bytes) {
    release();
    if (bytes == 0) return;
    TD_CUDA_CHECK(cudaMalloc(&p_, bytes));
    n_ = bytes;
  }
  void release() {
    if (p_) cudaFree(p_);
    p_ = nullptr, n_ = 0;
  }
  template <typename T = uint8_t>
  T* get() const { return static_cast<T*>(p_); }
  size_t bytes() const { return n_; }

 private:
  void* p_ = nullptr;
  size_t n_ = 0;
};

class PinnedBuf {
 public:
  PinnedBuf() = default;
  PinnedBuf(const PinnedBuf&) = delete;
  PinnedBuf& operator=(const PinnedBuf&) = delete;
  ~PinnedBuf() { release(); }
  void alloc(size_t bytes) {
    release();
    if (bytes == 0) return;
    TD_CUDA_CHECK(cudaMallocHost(&p_, bytes));
    n_ = bytes;
  }
  void release() {
    if (p_) cudaFreeHost(p_);
    p_ = nullptr, n_ = 0;
  }
  template <typename T = uint8_t>
  T* get() const { return static_cast<T*>(p_); }
  size_t bytes() const { return n_; }

 private:
  void* p_ = nullptr;
  size_t n_ = 0;
};

struct DevWeight {
  DevMatrix m;
  DevBuf buf;
  DevBuf f16;           // dequantized copy for cuBLAS (quantized types), when cached
  std::string name;
};

// The activation form a cuBLAS product of this weight type takes.
ActType gemm_act(GgmlType t) {
  return t == GgmlType::F32 ? ActType::kF32 : t == GgmlType::BF16 ? ActType::kBF16 : ActType::kF16;
}
bool is_float_type(GgmlType t) { return t == GgmlType::F32 || t == GgmlType::F16 || t == GgmlType::BF16; }
cudaDataType_t cuda_type(ActType t) {
  return t == ActType::kF32 ? CUDA_R_32F : t == ActType::kBF16 ? CUDA_R_16BF : CUDA_R_16F;
}

struct GraphKey {
  int32_t rows, n_out;
  bool operator<(const GraphKey& o) const { return std::tie(rows, n_out) < std::tie(o.rows, o.n_out); }
};

class CudaExecutor final : public Executor {
 public:
  CudaExecutor(Model& m, const KvPlan& plan);
  ~CudaExecutor() override;

  void forward(const Batch& batch, std::span<SeqKv* const> seqs, std::span<float> logits) override;
  void copy_block(int32_t src, int32_t dst) override;
  size_t block_bytes() const override { return KvCache::bytes_per_token(plan_.shape, plan_.format) * plan_.block_size; }
  void save_block(int32_t block, std::byte* out) override;
  void load_block(int32_t block, const std::byte* in) override;
  void copy_slots(int32_t, int32_t, int32_t, int32_t) override { no_streaming(); }
  void read_keys(const SeqKv&, int32_t, int32_t, float*) override { no_streaming(); }
  void write_keys(const SeqKv&, int32_t, int32_t, const float*, const int32_t*) override { no_streaming(); }
  [[noreturn]] static void no_streaming() {
    fail(ErrorKind::kUnsupported, "the CUDA backend has no streaming window (--kv-window)");
  }
  size_t kv_bytes() const override { return k_cache_.bytes() + v_cache_.bytes(); }
  std::string device() const override { return device_name_; }

 private:
  struct Layer {
    const DevWeight *wq, *wk, *wv, *wo, *gate, *up, *down;
    const float *attn_norm, *bq = nullptr, *bk = nullptr, *bv = nullptr, *q_norm = nullptr, *k_norm = nullptr;
    const float *post_attn_norm = nullptr, *ffn_norm, *post_ffn_norm = nullptr;
    bool swa = false;
  };
  struct Rope {
    RopeParams params;
    DevBuf cos, sin;
  };

  const DevWeight* upload(const WeightMatrix& w, const std::string& name);
  PinnedBuf upload_host_;  // staging, held during the load only
  DevBuf upload_dev_;
  const float* upload_vector(const WeightVector& v);
  void make_f16_copies();
  void ensure_capacity(int32_t rows, int32_t table_ld);
  void ensure_logits(int32_t rows);  // device logits for this many rows
  int32_t cap_logits_ = 0;
  // Decode attention's partials for this many decode rows (indexed by the
  // row's place in the batch, decode rows last: R rows in all).
  void ensure_decode(int32_t rows);
  int32_t cap_decode_ = 0;
  void ensure_rope(int32_t positions);
  void check_block(int32_t block) const;

  // The pass over the layers for the rows staged in the metadata buffer.
  void run(int32_t R, int32_t Rp, int32_t n_out, int32_t n_tiles);
  struct LayerSteps;
  std::vector<ActForm> forms_for(std::initializer_list<const DevWeight*> ws, int32_t Rp, int32_t R) const;
  DevActs acts(ActType t) const;
  void linear(std::initializer_list<std::pair<const DevWeight*, float*>> jobs, std::initializer_list<int64_t> lds,
              int32_t Rp, int32_t R);
  void gemm(const DevWeight& w, int32_t n_rows, float* out, int64_t out_ld);

  Model& model_;
  const ModelConfig& cfg_;
  KvPlan plan_;
  int device_ = 0;
  std::string device_name_;
  cudaStream_t stream_ = nullptr;
  cublasLtHandle_t lt_ = nullptr;
  DevBuf workspace_;

  // Weights.
  std::unordered_map<const uint8_t*, std::unique_ptr<DevWeight>> weights_;
  std::vector<DevBuf> vectors_;
  const DevWeight* tok_embd_ = nullptr;
  const DevWeight* output_ = nullptr;
  const float* output_norm_ = nullptr;
  std::vector<Layer> layers_;
  DevBuf gelu_table_;
  Rope rope_global_, rope_swa_;
  bool swa_rope_differs_ = false;
  int32_t rope_positions_ = 0;
  int64_t max_matrix_elems_ = 0;
  bool f16_cached_ = false;

  // K/V.
  DevBuf k_cache_, v_cache_;
  KvBlockRuns runs_;
  DevBuf block_stage_;
  PinnedBuf block_host_;

  // Scratch for `cap_rows_` rows.
  int32_t cap_rows_ = 0, cap_table_ = 0;
  int64_t act_ld_ = 0;  // row stride of every activation buffer
  DevBuf x_, xf_, q_, k_, v_, attn_, o_, gate_, up_;
  DevBuf a16_, abf16_, a8_q_, a8_d_, a8_s_, ak_q_, ak_d_, ak_s_;
  DevBuf logits_dev_;
  DevBuf dec_partials_, dec_counters_;
  DevBuf meta_;
  PinnedBuf meta_host_;
  DevBuf dequant_scratch_;
  // Offsets (int32 words) of the metadata sections.
  size_t m_tok_ = 0, m_pos_ = 0, m_seq_ = 0, m_want_ = 0, m_tiles_ = 0, m_tables_ = 0;

  // cuBLASLt: one algorithm per product shape.
  struct GemmPlan {
    cublasLtMatmulAlgo_t algo{};
    bool ok = false;
  };
  std::map<std::tuple<int, int64_t, int64_t, int64_t, int64_t>, GemmPlan> gemm_plans_;
  std::map<std::tuple<int, int64_t, int64_t, int64_t, int64_t, int32_t>, bool> gemm_checked_;

  // Decode graphs.
  std::map<GraphKey, cudaGraphExec_t> graphs_;
  bool use_graphs_ = true;
  void clear_graphs();
  // The decode pass for R rows as an instantiated graph; null (and graphs
  // off from then on) when capturing fails.
  cudaGraphExec_t capture(int32_t R, int32_t n_out);
};

CudaExecutor::CudaExecutor(Model& m, const KvPlan& plan) : model_(m), cfg_(m.config()), plan_(plan) {
  if (plan.format.k != plan.format.v || kv_type_quantized(plan.format.k))
    fail(ErrorKind::kUnsupported, "the CUDA backend stores K and V as f16 or f32, not KV cache type {}",
         kv_format_name(plan.format));
  if (plan.paging.n_groups > 1)
    fail(ErrorKind::kUnsupported, "the CUDA backend keeps every layer's blocks (run it with --swa-full)");
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0) {
    (void)cudaGetLastError();
    fail(ErrorKind::kUnsupported, "no CUDA device: {}", e != cudaSuccess ? cudaGetErrorString(e) : "none found");
  }
  TD_CUDA_CHECK(cudaSetDevice(device_));
  cudaDeviceProp prop{};
  TD_CUDA_CHECK(cudaGetDeviceProperties(&prop, device_));
  device_name_ = fmt::format("cuda:{} ({})", device_, prop.name);
  set_pdl(prop.major >= 9 && m.options().cuda_pdl);
  use_graphs_ = m.options().cuda_graphs;

  const ModelConfig& c = cfg_;
  if (c.latent_attention())
    fail(ErrorKind::kUnsupported, "the CUDA backend has no latent attention ({}); run this model on the CPU",
         c.arch_name);
  if (!attention_shape_supported(c.n_head, c.n_head_kv, c.head_dim, c.head_dim_v))
    fail(ErrorKind::kUnsupported,
         "the CUDA backend's attention handles head dimensions up to 256 and up to 4096 value elements per KV head; "
         "this model has {} heads of {} / {} over {} KV heads",
         c.n_head, c.head_dim, c.head_dim_v, c.n_head_kv);
  if (c.attn_sinks || c.attn_out_bias)
    fail(ErrorKind::kUnsupported,
         "the CUDA backend has no attention sinks or attention output bias ({}); run this model on the CPU",
         c.arch_name);
  if (c.n_expert > 0)
    fail(ErrorKind::kUnsupported, "the CUDA backend runs dense feed-forward blocks only; this model has {} experts",
         c.n_expert);
  if (plan.block_size <= 0 || plan.n_blocks <= 0)
    fail(ErrorKind::kInvalidArgument, "KV cache needs at least one block (got {} blocks of {})", plan.n_blocks,
         plan.block_size);

  // Every copy and kernel goes on this stream (a non-blocking stream does not
  // wait for the legacy default stream, so nothing may use that one).
  TD_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  TD_CUBLAS_CHECK(cublasLtCreate(&lt_));
  workspace_.alloc(kGemmWorkspace);

  // Weights, each matrix once (a tied output is the embedding).
  const ModelWeights& w = m.weights();
  tok_embd_ = upload(w.tok_embd, "token_embd.weight");
  output_ = upload(w.output, w.output.data == w.tok_embd.data ? "token_embd.weight" : "output.weight");
  output_norm_ = upload_vector(w.output_norm);
  for (int32_t il = 0; il < c.n_layer; ++il) {
    const LayerWeights& L = w.layers[il];
    auto n = [il](const char* s) { return fmt::format("blk.{}.{}", il, s); };
    Layer d{};
    d.wq = upload(L.wq, n("attn_q.weight"));
    d.wk = upload(L.wk, n("attn_k.weight"));
    d.wv = upload(L.wv, n("attn_v.weight"));
    d.wo = upload(L.wo, n("attn_output.weight"));
    d.gate = upload(L.w_gate, n("ffn_gate.weight"));
    d.up = upload(L.w_up, n("ffn_up.weight"));
    d.down = upload(L.w_down, n("ffn_down.weight"));
    d.attn_norm = upload_vector(L.attn_norm);
    d.ffn_norm = upload_vector(L.ffn_norm);
    if (c.qkv_bias) d.bq = upload_vector(L.bq), d.bk = upload_vector(L.bk), d.bv = upload_vector(L.bv);
    if (c.qk_norm) d.q_norm = upload_vector(L.q_norm), d.k_norm = upload_vector(L.k_norm);
    if (c.sandwich_norm) d.post_attn_norm = upload_vector(L.post_attn_norm), d.post_ffn_norm = upload_vector(L.post_ffn_norm);
    d.swa = c.layer_is_swa[il];
    layers_.push_back(d);
  }
  // What was read from the mapping for the upload need not stay resident.
  m.file().release_all_pages();
  upload_host_.release();
  upload_dev_.release();

  if (c.act == Activation::kGeluTanh) {
    // The CPU's table (kernels/ops.cpp): gelu_tanh of every f16 value,
    // rounded to f16; gelu_tanh(f16 value) returns exactly its entry.
    std::vector<uint16_t> table(1 << 16);
    for (uint32_t i = 0; i < table.size(); ++i) table[i] = f32_to_f16(gelu_tanh(f16_to_f32(static_cast<uint16_t>(i))));
    gelu_table_.alloc(table.size() * 2);
    TD_CUDA_CHECK(cudaMemcpyAsync(gelu_table_.get(), table.data(), table.size() * 2, cudaMemcpyHostToDevice, stream_));
  }
  auto rope_params = [&](bool swa) {
    RopeParams p;
    p.style = c.rope_style;
    p.dims = c.rope_dims;
    p.base = swa ? c.rope_base_swa : c.rope_base;
    p.scale = swa ? c.rope_scale_swa : c.rope_scale;
    return p;
  };
  rope_global_.params = rope_params(false);
  rope_swa_.params = rope_params(true);
  swa_rope_differs_ = std::any_of(c.layer_is_swa.begin(), c.layer_is_swa.end(), [](bool b) { return b; }) &&
                      (rope_swa_.params.base != rope_global_.params.base ||
                       rope_swa_.params.scale != rope_global_.params.scale);

  // The KV pool: the CPU KvCache's layout, zeroed as its calloc is.
  const KvShape& s = plan.shape;
  const size_t esize = tandem::kv_bytes(plan.format.k, 1);
  const size_t per = size_t(plan.n_blocks) * plan.block_size * s.n_layer * esize;
  k_cache_.alloc(per * s.k_width);
  v_cache_.alloc(per * s.v_width);
  TD_CUDA_CHECK(cudaMemsetAsync(k_cache_.get(), 0, k_cache_.bytes(), stream_));
  TD_CUDA_CHECK(cudaMemsetAsync(v_cache_.get(), 0, v_cache_.bytes(), stream_));
  runs_.k = k_cache_.get();
  runs_.v = v_cache_.get();
  runs_.n_layer = s.n_layer;
  runs_.n_head_kv = s.n_head_kv;
  runs_.n_blocks = plan.n_blocks;
  runs_.k_run = size_t(plan.block_size) * (s.k_width / s.n_head_kv) * esize;
  runs_.v_run = size_t(plan.block_size) * (s.v_width / s.n_head_kv) * esize;
  block_stage_.alloc(block_bytes());
  block_host_.alloc(block_bytes());

  act_ld_ = std::max<int64_t>({c.n_embd, int64_t{c.n_head} * c.head_dim_v, c.n_ff});
  act_ld_ = (act_ld_ + 255) / 256 * 256;
  make_f16_copies();
  ensure_capacity(64, 64);
  ensure_logits(16);
  ensure_decode(16);
  ensure_rope(std::min(c.n_ctx_train, 4096));
  TD_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

CudaExecutor::~CudaExecutor() {
  if (stream_) cudaStreamSynchronize(stream_);
  clear_graphs();
  if (lt_) cublasLtDestroy(lt_);
  if (stream_) cudaStreamDestroy(stream_);
}

void CudaExecutor::clear_graphs() {
  for (auto& [key, g] : graphs_) cudaGraphExecDestroy(g);
  graphs_.clear();
}

const DevWeight* CudaExecutor::upload(const WeightMatrix& w, const std::string& name) {
  if (auto it = weights_.find(w.data); it != weights_.end()) return it->second.get();
  if (!weight_type_supported(w.type))
    fail(ErrorKind::kUnsupported,
         "{}: tensor '{}' has type {}, which the CUDA backend does not compute with (it does f32, f16, bf16, q8_0, "
         "q4_0, q5_0, q4_K, q5_K, q6_K)",
         model_.file().path(), name, type_traits(w.type).name);
  auto d = std::make_unique<DevWeight>();
  d->name = name;
  const MatrixLayout l = matrix_layout(w.type, w.rows, w.cols);
  d->buf.alloc(l.bytes);
  TD_CUDA_CHECK(cudaMemsetAsync(d->buf.get(), 0, l.bytes, stream_));  // the rows' padding reads as zeros
  d->m = matrix_at(w.type, w.rows, w.cols, d->buf.get());
  // Through pinned staging in slices of whole rows: the mapping's pages are
  // read once, then released.
  PinnedBuf& host = upload_host_;
  DevBuf& dev = upload_dev_;
  const size_t chunk = std::max(kUploadChunk, w.row_stride);
  if (host.bytes() < chunk) host.alloc(chunk);
  if (dev.bytes() < chunk) dev.alloc(chunk);
  const int64_t rows_per = static_cast<int64_t>(chunk / w.row_stride);
  for (int64_t r0 = 0; r0 < w.rows; r0 += rows_per) {
    const int64_t n = std::min(rows_per, w.rows - r0);
    const size_t bytes = static_cast<size_t>(n) * w.row_stride;
    TD_CUDA_CHECK(cudaStreamSynchronize(stream_));  // the staging buffers are free again
    std::memcpy(host.get(), w.row(r0), bytes);
    TD_CUDA_CHECK(cudaMemcpyAsync(dev.get(), host.get(), bytes, cudaMemcpyHostToDevice, stream_));
    upload_rows(d->m, dev.get(), r0, n, stream_);
  }
  TD_CUDA_CHECK(cudaStreamSynchronize(stream_));
  const DevWeight* out = d.get();
  weights_.emplace(w.data, std::move(d));
  return out;
}

const float* CudaExecutor::upload_vector(const WeightVector& v) {
  if (v.empty()) return nullptr;
  DevBuf b(v.size() * sizeof(float));
  TD_CUDA_CHECK(cudaMemcpyAsync(b.get(), v.data(), v.size() * sizeof(float), cudaMemcpyHostToDevice, stream_));
  vectors_.push_back(std::move(b));
  return vectors_.back().get<float>();
}

// Dequantized f16 copies of the quantized layer matrices for cuBLAS, made
// once when they fit in a quarter of the free device memory (else each
// product dequantizes into a scratch buffer). --cuda-disable f16-copies: never.
void CudaExecutor::make_f16_copies() {
  // The embedding and the output matrix only ever take the matrix-vector path.
  size_t total = 0;
  std::vector<DevWeight*> quantized;
  for (auto& [ptr, w] : weights_) {
    if (is_float_type(w->m.type) || w.get() == tok_embd_ || w.get() == output_) continue;
    quantized.push_back(w.get());
    const size_t elems = size_t(w->m.rows) * ((w->m.cols + 7) / 8 * 8);
    total += elems * 2;
    max_matrix_elems_ = std::max<int64_t>(max_matrix_elems_, static_cast<int64_t>(elems));
  }
  size_t free_b = 0, total_b = 0;
  TD_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  f16_cached_ = model_.options().cuda_f16_copies && total <= free_b / 4;
  if (f16_cached_) {
    for (DevWeight* w : quantized) {
      w->f16.alloc(size_t(w->m.rows) * ((w->m.cols + 7) / 8 * 8) * 2);
      dequantize_f16(w->m, w->f16.get<uint16_t>(), stream_);
    }
  } else if (!quantized.empty()) {
    dequant_scratch_.alloc(size_t(max_matrix_elems_) * 2);
  }
}

void CudaExecutor::ensure_capacity(int32_t rows, int32_t table_ld) {
  if (rows <= cap_rows_ && table_ld <= cap_table_) return;
  TD_CUDA_CHECK(cudaStreamSynchronize(stream_));
  clear_graphs();
  const int32_t R = static_cast<int32_t>(std::bit_ceil(static_cast<uint32_t>(std::max({rows, cap_rows_, 64}))));
  const int32_t T = static_cast<int32_t>(std::bit_ceil(static_cast<uint32_t>(std::max({table_ld, cap_table_, 16}))));
  const ModelConfig& c = cfg_;
  const size_t r = size_t(R), f = sizeof(float);
  const int64_t QW = int64_t{c.n_head} * c.head_dim, KW = int64_t{c.n_head_kv} * c.head_dim;
  const int64_t VW = int64_t{c.n_head_kv} * c.head_dim_v, OW = int64_t{c.n_head} * c.head_dim_v;
  if (R != cap_rows_) {
    x_.alloc(r * c.n_embd * f);
    xf_.alloc(r * act_ld_ * f);
    q_.alloc(r * QW * f);
    k_.alloc(r * KW * f);
    v_.alloc(r * VW * f);
    attn_.alloc(r * OW * f);
    o_.alloc(r * c.n_embd * f);
    gate_.alloc(r * c.n_ff * f);
    up_.alloc(r * c.n_ff * f);
    a16_.alloc(r * act_ld_ * 2);
    abf16_.alloc(r * act_ld_ * 2);
    a8_q_.alloc(r * act_ld_);
    a8_d_.alloc(r * (act_ld_ / 32) * f);
    a8_s_.alloc(r * (act_ld_ / 32) * 2);
    ak_q_.alloc(r * act_ld_);
    ak_d_.alloc(r * (act_ld_ / 256) * f);
    ak_s_.alloc(r * (act_ld_ / 16) * 2);
    // Zeroed once: the row quantizers write only [0, K) of a row, and the
    // matrix-vector kernels read no further.
    for (DevBuf* b : {&xf_, &a16_, &abf16_, &a8_q_, &ak_q_}) TD_CUDA_CHECK(cudaMemsetAsync(b->get(), 0, b->bytes(), stream_));
  }
  // Metadata: token, position, sequence slot, logits rows, prefill tiles
  // (two words each), then the block tables.
  m_tok_ = 0;
  m_pos_ = r;
  m_seq_ = 2 * r;
  m_want_ = 3 * r;
  m_tiles_ = 4 * r;
  m_tables_ = 6 * r;
  const size_t words = m_tables_ + r * T;
  meta_.alloc(words * 4);
  meta_host_.alloc(words * 4);
  cap_rows_ = R;
  cap_table_ = T;
}

void CudaExecutor::ensure_logits(int32_t rows) {
  if (rows <= cap_logits_) return;
  TD_CUDA_CHECK(cudaStreamSynchronize(stream_));
  clear_graphs();
  cap_logits_ = static_cast<int32_t>(std::bit_ceil(static_cast<uint32_t>(std::max(rows, 16))));
  logits_dev_.alloc(size_t(cap_logits_) * cfg_.n_vocab * sizeof(float));
}

void CudaExecutor::ensure_decode(int32_t rows) {
  if (rows <= cap_decode_) return;
  TD_CUDA_CHECK(cudaStreamSynchronize(stream_));
  clear_graphs();
  cap_decode_ = static_cast<int32_t>(std::bit_ceil(static_cast<uint32_t>(std::max(rows, 16))));
  dec_partials_.alloc(decode_scratch_floats(cap_decode_, cfg_.n_head, cfg_.head_dim_v) * sizeof(float));
  dec_counters_.alloc(size_t(cap_decode_) * cfg_.n_head_kv * sizeof(int32_t));
  TD_CUDA_CHECK(cudaMemsetAsync(dec_counters_.get(), 0, dec_counters_.bytes(), stream_));
}

void CudaExecutor::ensure_rope(int32_t positions) {
  if (positions <= rope_positions_) return;
  TD_CUDA_CHECK(cudaStreamSynchronize(stream_));
  clear_graphs();
  const int32_t P = std::max(positions, std::max(rope_positions_ * 2, 1024));
  const int32_t half = cfg_.rope_dims / 2;
  std::vector<float> cs(size_t(P) * half), sn(size_t(P) * half);
  const WeightVector& ff = model_.weights().rope_freqs;
  for (Rope* rope : {&rope_global_, &rope_swa_}) {
    if (rope == &rope_swa_ && !swa_rope_differs_) break;
    RopeParams p = rope->params;
    p.freq_factors = ff.empty() ? nullptr : ff.data();
    // The very function the CPU calls per row (kernels/ops.h): same bits.
    for (int32_t pos = 0; pos < P; ++pos) rope_angles(p, pos, cs.data() + size_t(pos) * half, sn.data() + size_t(pos) * half);
    rope->cos.alloc(std::max<size_t>(cs.size(), 1) * sizeof(float));
    rope->sin.alloc(std::max<size_t>(sn.size(), 1) * sizeof(float));
    TD_CUDA_CHECK(cudaMemcpyAsync(rope->cos.get(), cs.data(), cs.size() * sizeof(float), cudaMemcpyHostToDevice, stream_));
    TD_CUDA_CHECK(cudaMemcpyAsync(rope->sin.get(), sn.data(), sn.size() * sizeof(float), cudaMemcpyHostToDevice, stream_));
  }
  rope_positions_ = P;
}

DevActs CudaExecutor::acts(ActType t) const {
  DevActs a;
  a.type = t;
  a.ld = act_ld_;
  switch (t) {
    case ActType::kF32: a.q = xf_.get(); break;
    case ActType::kF16: a.q = a16_.get(); break;
    case ActType::kBF16: a.q = abf16_.get(); break;
    case ActType::kQ8_0:
      a.q = a8_q_.get(), a.d = a8_d_.get<float>(), a.sums = a8_s_.get<int16_t>();
      break;
    case ActType::kQ8_K:
      a.q = ak_q_.get(), a.d = ak_d_.get<float>(), a.sums = ak_s_.get<int16_t>();
      break;
  }
  return a;
}

// The activation forms the products of `ws` read: the cuBLAS form for run
// rows [0, Rp), the dot type for decode rows [Rp, R).
std::vector<ActForm> CudaExecutor::forms_for(std::initializer_list<const DevWeight*> ws, int32_t Rp, int32_t R) const {
  std::vector<ActForm> out;
  auto add = [&](ActType t, int32_t r0, int32_t r1) {
    if (r0 >= r1) return;
    for (ActForm& f : out)
      if (f.acts.type == t) {  // one buffer per type: widen the range (rows are disjoint ranges of one pass)
        f.r0 = std::min(f.r0, r0), f.r1 = std::max(f.r1, r1);
        return;
      }
    ActForm f;
    f.acts = acts(t);
    f.r0 = r0, f.r1 = r1;
    out.push_back(f);
  };
  for (const DevWeight* w : ws) {
    add(gemm_act(w->m.type), 0, Rp);
    add(act_type_for(w->m.type), Rp, R);
  }
  return out;
}

void CudaExecutor::gemm(const DevWeight& w, int32_t n_rows, float* out, int64_t out_ld) {
  const ActType at = gemm_act(w.m.type);
  const DevActs x = acts(at);
  const void* a = w.m.q;
  int64_t lda = 0;
  switch (w.m.type) {
    case GgmlType::F32: lda = ((w.m.cols * 4 + 15) / 16 * 16) / 4; break;
    case GgmlType::F16:
    case GgmlType::BF16: lda = ((w.m.cols * 2 + 15) / 16 * 16) / 2; break;
    default:
      lda = (w.m.cols + 7) / 8 * 8;
      if (w.f16.get()) {
        a = w.f16.get();
      } else {
        dequantize_f16(w.m, dequant_scratch_.get<uint16_t>(), stream_);
        a = dequant_scratch_.get();
      }
  }
  const cudaDataType_t dt = cuda_type(at);
  const int64_t N = w.m.rows, K = w.m.cols, ldb = x.ld;
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t A = nullptr, B = nullptr, D = nullptr;
  TD_CUBLAS_CHECK(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  struct Free {
    cublasLtMatmulDesc_t& op;
    cublasLtMatrixLayout_t &A, &B, &D;
    ~Free() {
      if (A) cublasLtMatrixLayoutDestroy(A);
      if (B) cublasLtMatrixLayoutDestroy(B);
      if (D) cublasLtMatrixLayoutDestroy(D);
      if (op) cublasLtMatmulDescDestroy(op);
    }
  } free_all{op, A, B, D};
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  TD_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
  TD_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
  // Column-major views: A = W^T stored as K x N (lda), B = X^T as K x rows,
  // D = Y^T as N x rows (out_ld): Y[r][n] = W[n] . X[r].
  TD_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&A, dt, K, N, lda));
  TD_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&D, CUDA_R_32F, N, n_rows, out_ld));
  TD_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&B, dt, K, n_rows, ldb));

  // One algorithm per shape, chosen for 256 rows with no split-K: a row's
  // result then does not depend on how many rows the product has.
  const auto key = std::make_tuple(static_cast<int>(at), N, K, lda, out_ld);
  GemmPlan& plan = gemm_plans_[key];
  if (!plan.ok) {
    cublasLtMatrixLayout_t B256 = nullptr, D256 = nullptr;
    TD_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&B256, dt, K, 256, ldb));
    TD_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&D256, CUDA_R_32F, N, 256, out_ld));
    cublasLtMatmulPreference_t pref = nullptr;
    TD_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    const size_t ws = kGemmWorkspace;
    TD_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
    cublasLtMatmulHeuristicResult_t res[16] = {};
    int found = 0;
    for (int attempt = 0; attempt < 2 && !plan.ok; ++attempt) {
      if (attempt == 0) {
        const uint32_t mask = CUBLASLT_REDUCTION_SCHEME_NONE;
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &mask, sizeof mask);
      } else {
        const uint32_t mask = CUBLASLT_REDUCTION_SCHEME_MASK;
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &mask, sizeof mask);
      }
      found = 0;
      if (cublasLtMatmulAlgoGetHeuristic(lt_, op, A, B256, D256, D256, pref, 16, res, &found) != CUBLAS_STATUS_SUCCESS)
        found = 0;
      for (int i = 0; i < found && !plan.ok; ++i) {
        if (res[i].state != CUBLAS_STATUS_SUCCESS) continue;
        uint32_t splitk = 1;
        size_t written = 0;
        if (cublasLtMatmulAlgoConfigGetAttribute(&res[i].algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk, sizeof splitk,
                                                 &written) == CUBLAS_STATUS_SUCCESS &&
            splitk > 1 && attempt == 0)
          continue;
        plan.algo = res[i].algo;
        plan.ok = true;
      }
    }
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(B256);
    cublasLtMatrixLayoutDestroy(D256);
    if (!plan.ok)
      fail(ErrorKind::kUnsupported, "cuBLASLt has no algorithm for a {} x {} product of type {}", N, K,
           static_cast<int>(at));
  }
  const auto ckey = std::make_tuple(static_cast<int>(at), N, K, lda, out_ld, n_rows);
  auto it = gemm_checked_.find(ckey);
  if (it == gemm_checked_.end()) {
    if (gemm_checked_.size() > 4096) gemm_checked_.clear();
    cublasLtMatmulHeuristicResult_t r{};
    const bool ok = cublasLtMatmulAlgoCheck(lt_, op, A, B, D, D, &plan.algo, &r) == CUBLAS_STATUS_SUCCESS &&
                    r.workspaceSize <= kGemmWorkspace;
    it = gemm_checked_.emplace(ckey, ok).first;
  }
  const float alpha = 1.0f, beta = 0.0f;
  if (it->second) {
    TD_CUBLAS_CHECK(cublasLtMatmul(lt_, op, &alpha, a, A, x.q, B, &beta, out, D, out, D, &plan.algo,
                                   workspace_.get(), kGemmWorkspace, stream_));
    return;
  }
  // The pinned algorithm refuses this row count: cuBLASLt's own choice for
  // it (correct, but its rows may differ in the last bits from other counts).
  TD_CUBLAS_CHECK(cublasLtMatmul(lt_, op, &alpha, a, A, x.q, B, &beta, out, D, out, D, nullptr, workspace_.get(),
                                 kGemmWorkspace, stream_));
}

// The products of one group of matrices (Q, K, V; gate, up; one): cuBLAS for
// rows [0, Rp), matrix-vector kernels for [Rp, R), matrices of one type and
// width in one launch.
void CudaExecutor::linear(std::initializer_list<std::pair<const DevWeight*, float*>> jobs,
                          std::initializer_list<int64_t> lds, int32_t Rp, int32_t R) {
  std::vector<std::pair<const DevWeight*, float*>> js(jobs);
  std::vector<int64_t> ld(lds);
  if (Rp > 0)
    for (size_t j = 0; j < js.size(); ++j) gemm(*js[j].first, Rp, js[j].second, ld[j]);
  if (R > Rp) {
    for (size_t j = 0; j < js.size();) {
      GemvJob g[3];
      int32_t n = 0;
      const DevMatrix& first = js[j].first->m;
      while (j < js.size() && n < 3 && js[j].first->m.type == first.type && js[j].first->m.cols == first.cols) {
        g[n].w = js[j].first->m;
        g[n].out = js[j].second;
        g[n].out_ld = ld[j];
        ++n, ++j;
      }
      gemv(g, n, acts(act_type_for(first.type)), Rp, R - Rp, stream_);
    }
  }
}

// A pass's steps of decoder_layer (model/layer_recipe.h) on the device:
// rows [0, Rp) run rows, [Rp, R) decode rows, staged in the metadata buffer.
// Each norm kernel also makes the activation forms the products after it
// read, and a feed-forward's residual add joins the next norm kernel.
struct CudaExecutor::LayerSteps {
  CudaExecutor& e;
  int32_t R, Rp, n_tiles;
  bool ffn_pending = false;  // the previous layer's feed-forward output waits in o_

  // x += add (through add_w when given), then the norm of x by norm_w into
  // the forms the next products read.
  void norm(const float* add, const float* add_w, const float* norm_w, const std::vector<ActForm>& forms) {
    const ModelConfig& c = e.cfg_;
    RowOp op;
    op.n_rows = R;
    op.E = static_cast<int32_t>(c.n_embd);
    op.mode = RowMode::kNorm;
    op.x = e.x_.get<float>();
    op.x_ld = c.n_embd;
    op.add = add;
    op.add_ld = c.n_embd;
    op.add_w = add_w;
    op.norm_w = norm_w;
    op.eps = c.rms_eps;
    op.n_forms = static_cast<int32_t>(forms.size());
    for (size_t i = 0; i < forms.size(); ++i) op.forms[i] = forms[i];
    row_op(op, e.stream_);
  }

  void attention_norm(int32_t il) {
    const Layer& L = e.layers_[il];
    const Layer* prev = ffn_pending ? &e.layers_[il - 1] : nullptr;
    norm(prev ? e.o_.get<float>() : nullptr, prev ? prev->post_ffn_norm : nullptr, L.attn_norm,
         e.forms_for({L.wq, L.wk, L.wv}, Rp, R));
    ffn_pending = false;
  }

  void attention(int32_t il) {
    const ModelConfig& c = e.cfg_;
    const Layer& L = e.layers_[il];
    const int32_t* meta = e.meta_.get<int32_t>();
    const int64_t E = c.n_embd;
    const int64_t QW = int64_t{c.n_head} * c.head_dim, KW = int64_t{c.n_head_kv} * c.head_dim;
    const int64_t VW = int64_t{c.n_head_kv} * c.head_dim_v, OW = int64_t{c.n_head} * c.head_dim_v;
    const size_t esize = tandem::kv_bytes(e.plan_.format.k, 1);
    const size_t layer_k = size_t(c.n_head_kv) * e.plan_.n_blocks * e.plan_.block_size * c.head_dim * esize;
    const size_t layer_v = size_t(c.n_head_kv) * e.plan_.n_blocks * e.plan_.block_size * c.head_dim_v * esize;
    e.linear({{L.wq, e.q_.get<float>()}, {L.wk, e.k_.get<float>()}, {L.wv, e.v_.get<float>()}}, {QW, KW, VW}, Rp, R);

    const bool swa = L.swa;
    const Rope& rope = swa && e.swa_rope_differs_ ? e.rope_swa_ : e.rope_global_;
    QkvPost p;
    p.n_rows = R;
    p.q = e.q_.get<float>();
    p.k = e.k_.get<float>();
    p.v = e.v_.get<float>();
    p.q_ld = QW, p.k_ld = KW, p.v_ld = VW;
    p.bq = L.bq, p.bk = L.bk, p.bv = L.bv;
    p.q_norm = L.q_norm, p.k_norm = L.k_norm;
    p.eps = c.rms_eps;
    p.n_head = c.n_head, p.n_head_kv = c.n_head_kv, p.head_dim = c.head_dim, p.head_dim_v = c.head_dim_v;
    p.rope_dims = c.rope_dims;
    p.rope_neox = c.rope_style == RopeStyle::kNeox;
    p.rope_cos = rope.cos.get<float>();
    p.rope_sin = rope.sin.get<float>();
    p.attn_scale = c.attn_scale;
    p.pos = meta + e.m_pos_;
    p.seq = meta + e.m_seq_;
    p.tables = meta + e.m_tables_;
    p.table_ld = e.cap_table_;
    p.k_cache = e.k_cache_.get() + il * layer_k;
    p.v_cache = e.v_cache_.get() + il * layer_v;
    p.kv_f16 = e.plan_.format.k == KvType::kF16;
    p.block_size = e.plan_.block_size;
    p.n_blocks = e.plan_.n_blocks;
    qkv_post(p, e.stream_);

    AttnArgs a;
    a.q = e.q_.get<float>();
    a.q_ld = QW;
    a.out = e.attn_.get<float>();
    a.out_ld = OW;
    a.n_head = c.n_head, a.n_head_kv = c.n_head_kv, a.head_dim = c.head_dim, a.head_dim_v = c.head_dim_v;
    a.window = swa ? c.sliding_window : 0;
    a.k_cache = p.k_cache;
    a.v_cache = p.v_cache;
    a.kv_f16 = p.kv_f16;
    a.block_size = e.plan_.block_size;
    a.n_blocks = e.plan_.n_blocks;
    a.pos = p.pos;
    a.seq = p.seq;
    a.tables = p.tables;
    a.table_ld = e.cap_table_;
    if (Rp > 0) attention_prefill(a, reinterpret_cast<const PrefillTile*>(meta + e.m_tiles_), n_tiles, e.stream_);
    if (R > Rp)
      attention_decode(a, Rp, R - Rp, {e.dec_partials_.get<float>(), e.dec_counters_.get<int32_t>()}, e.stream_);

    RowOp op;
    op.n_rows = R;
    op.E = static_cast<int32_t>(OW);
    op.mode = RowMode::kPlain;
    op.x = e.attn_.get<float>();
    op.x_ld = OW;
    const auto forms = e.forms_for({L.wo}, Rp, R);
    op.n_forms = static_cast<int32_t>(forms.size());
    for (size_t i = 0; i < forms.size(); ++i) op.forms[i] = forms[i];
    row_op(op, e.stream_);
    e.linear({{L.wo, e.o_.get<float>()}}, {E}, Rp, R);
  }

  void attention_residual(int32_t il) {
    const Layer& L = e.layers_[il];
    norm(e.o_.get<float>(), L.post_attn_norm, L.ffn_norm, e.forms_for({L.gate, L.up}, Rp, R));
  }

  void feed_forward(int32_t il) {
    const ModelConfig& c = e.cfg_;
    const Layer& L = e.layers_[il];
    const int64_t F = c.n_ff;
    e.linear({{L.gate, e.gate_.get<float>()}, {L.up, e.up_.get<float>()}}, {F, F}, Rp, R);
    RowOp op;
    op.n_rows = R;
    op.E = static_cast<int32_t>(F);
    op.mode = RowMode::kGated;
    op.gate = e.gate_.get<float>();
    op.up = e.up_.get<float>();
    op.gate_ld = F;
    op.act = c.act == Activation::kGeluTanh ? ActFn::kGeluTanh : ActFn::kSilu;
    op.gelu_table = e.gelu_table_.get<uint16_t>();
    const auto forms = e.forms_for({L.down}, Rp, R);
    op.n_forms = static_cast<int32_t>(forms.size());
    for (size_t i = 0; i < forms.size(); ++i) op.forms[i] = forms[i];
    row_op(op, e.stream_);
    e.linear({{L.down, e.o_.get<float>()}}, {c.n_embd}, Rp, R);
  }

  // The add joins the next norm: the next layer's, or the output norm.
  void ffn_residual(int32_t) { ffn_pending = true; }
};

void CudaExecutor::run(int32_t R, int32_t Rp, int32_t n_out, int32_t n_tiles) {
  const ModelConfig& c = cfg_;
  const int32_t* meta = meta_.get<int32_t>();
  const int64_t E = c.n_embd;
  float* x = x_.get<float>();
  float* o = o_.get<float>();

  embed_rows(tok_embd_->m, meta + m_tok_, R, c.embed_scale, x, E, stream_);
  LayerSteps steps{*this, R, Rp, n_tiles};
  for (int32_t il = 0; il < c.n_layer; ++il) decoder_layer(steps, il);

  // The rows that want logits: the last residual add, the output norm, the
  // output matrix (matrix-vector kernels for every such row).
  RowOp op;
  op.n_rows = n_out;
  op.E = static_cast<int32_t>(E);
  op.rows = meta + m_want_;
  op.mode = RowMode::kNorm;
  op.x = x;
  op.x_ld = E;
  op.add = o;
  op.add_ld = E;
  op.add_w = layers_.back().post_ffn_norm;
  op.norm_w = output_norm_;
  op.eps = c.rms_eps;
  op.n_forms = 1;
  op.forms[0].acts = acts(act_type_for(output_->m.type));
  op.forms[0].r0 = 0;
  op.forms[0].r1 = n_out;
  if (n_out > 0) {
    row_op(op, stream_);
    GemvJob g;
    g.w = output_->m;
    g.out = logits_dev_.get<float>();
    g.out_ld = c.n_vocab;
    gemv(&g, 1, op.forms[0].acts, 0, n_out, stream_);
  }
}

void CudaExecutor::forward(const Batch& batch, std::span<SeqKv* const> seqs, std::span<float> logits) {
  const ModelConfig& c = cfg_;
  const int32_t R = static_cast<int32_t>(batch.size());
  if (R == 0) return;
  check_batch(batch, seqs, c.n_vocab, plan_.block_size, plan_.paging, logits.size());
  const size_t n_out = rows_with_logits(batch);

  // Runs of one sequence; rows of runs of kRunRows or more first. A
  // sequence's rows must be one run (the attention tiles assume it).
  std::vector<int32_t> run_len(R);
  std::vector<uint8_t> seen(seqs.size(), 0);
  for (int32_t r0 = 0; r0 < R;) {
    int32_t r1 = r0 + 1;
    while (r1 < R && batch[r1].seq == batch[r0].seq) ++r1;
    if (seen[batch[r0].seq]++)
      fail(ErrorKind::kInvalidArgument, "rows of sequence {} are not adjacent in the batch", batch[r0].seq);
    for (int32_t r = r0; r < r1; ++r) run_len[r] = r1 - r0;
    r0 = r1;
  }
  std::vector<int32_t> order;  // permuted row -> batch row
  order.reserve(R);
  for (int32_t r = 0; r < R; ++r)
    if (run_len[r] >= kRunRows) order.push_back(r);
  const int32_t Rp = static_cast<int32_t>(order.size());
  for (int32_t r = 0; r < R; ++r)
    if (run_len[r] < kRunRows) order.push_back(r);
  std::vector<int32_t> place(R);
  for (int32_t i = 0; i < R; ++i) place[order[i]] = i;

  std::vector<int32_t> slot_of(seqs.size(), -1);
  std::vector<const SeqKv*> slots;
  int32_t table_ld = 1, max_pos = 0;
  for (int32_t i = 0; i < R; ++i) {
    const BatchRow& row = batch[order[i]];
    if (slot_of[row.seq] < 0) {
      // A block id outside the pool would make the kernels write anywhere.
      for (int32_t b : seqs[row.seq]->blocks) check_block(b);
      slot_of[row.seq] = static_cast<int32_t>(slots.size());
      slots.push_back(seqs[row.seq]);
      table_ld = std::max(table_ld, static_cast<int32_t>(seqs[row.seq]->blocks.size()));
    }
    max_pos = std::max(max_pos, row.pos);
  }
  ensure_capacity(R, table_ld);
  ensure_logits(static_cast<int32_t>(n_out));
  ensure_decode(R - Rp);
  ensure_rope(max_pos + 1);

  int32_t* h = meta_host_.get<int32_t>();
  for (int32_t i = 0; i < R; ++i) {
    const BatchRow& row = batch[order[i]];
    h[m_tok_ + i] = row.token;
    h[m_pos_ + i] = row.pos;
    h[m_seq_ + i] = slot_of[row.seq];
  }
  int32_t n_want = 0;
  for (int32_t r = 0; r < R; ++r)
    if (batch[r].logits) h[m_want_ + n_want++] = place[r];
  int32_t n_tiles = 0;
  for (int32_t i = 0; i < Rp;) {
    int32_t j = i + 1;
    while (j < Rp && batch[order[j]].seq == batch[order[i]].seq) ++j;
    for (int32_t t0 = i; t0 < j; t0 += kPrefillTileRows) {
      h[m_tiles_ + 2 * n_tiles] = t0;
      h[m_tiles_ + 2 * n_tiles + 1] = std::min(kPrefillTileRows, j - t0);
      ++n_tiles;
    }
    i = j;
  }
  for (size_t s = 0; s < slots.size(); ++s) {
    int32_t* t = h + m_tables_ + s * cap_table_;
    std::copy(slots[s]->blocks.begin(), slots[s]->blocks.end(), t);
  }
  const size_t words = m_tables_ + slots.size() * cap_table_;
  TD_CUDA_CHECK(cudaMemcpyAsync(meta_.get(), h, words * 4, cudaMemcpyHostToDevice, stream_));

  const GraphKey key{R, n_want};
  if (Rp == 0 && use_graphs_ && R <= kMaxGraphRows) {
    auto it = graphs_.find(key);
    if (it == graphs_.end()) {
      if (graphs_.size() >= 64) clear_graphs();
      if (cudaGraphExec_t exec = capture(R, n_want)) it = graphs_.emplace(key, exec).first;
    }
    if (it != graphs_.end()) TD_CUDA_CHECK(cudaGraphLaunch(it->second, stream_));
    else run(R, 0, n_want, 0);
  } else {
    run(R, Rp, n_want, n_tiles);
  }
  if (n_out > 0)
    TD_CUDA_CHECK(cudaMemcpyAsync(logits.data(), logits_dev_.get(), n_out * c.n_vocab * sizeof(float),
                                  cudaMemcpyDeviceToHost, stream_));
  TD_CUDA_CHECK(cudaStreamSynchronize(stream_));

  for (int32_t r = 0; r < R; ++r) {
    SeqKv& sk = *seqs[batch[r].seq];
    sk.n_tokens = std::max(sk.n_tokens, batch[r].pos + 1);
  }
}

cudaGraphExec_t CudaExecutor::capture(int32_t R, int32_t n_out) {
  cudaGraph_t g = nullptr;
  cudaGraphExec_t exec = nullptr;
  std::string why;
  if (const cudaError_t e = cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal); e != cudaSuccess) {
    why = cudaGetErrorString(e);
  } else {
    try {
      run(R, 0, n_out, 0);
    } catch (const std::exception& err) {
      why = err.what();
    }
    const cudaError_t e_end = cudaStreamEndCapture(stream_, &g);
    if (why.empty() && e_end != cudaSuccess) why = cudaGetErrorString(e_end);
    if (why.empty()) {
      if (const cudaError_t e_inst = cudaGraphInstantiate(&exec, g, 0); e_inst != cudaSuccess) {
        why = cudaGetErrorString(e_inst);
        exec = nullptr;
      }
    }
    if (g) cudaGraphDestroy(g);
  }
  if (!exec) {
    (void)cudaGetLastError();
    std::fprintf(stderr, "warning: CUDA graph capture failed (%s); decode steps run without graphs\n", why.c_str());
    use_graphs_ = false;
  }
  return exec;
}

void CudaExecutor::check_block(int32_t block) const {
  if (block < 0 || block >= plan_.n_blocks)
    fail(ErrorKind::kInvalidArgument, "KV block {} is outside the pool of {}", block, plan_.n_blocks);
}

void CudaExecutor::copy_block(int32_t src, int32_t dst) {
  check_block(src);
  check_block(dst);
  kv_copy_block(runs_, src, dst, stream_);
}

void CudaExecutor::save_block(int32_t block, std::byte* out) {
  check_block(block);
  kv_gather_block(runs_, block, block_stage_.get(), stream_);
  TD_CUDA_CHECK(cudaMemcpyAsync(block_host_.get(), block_stage_.get(), block_bytes(), cudaMemcpyDeviceToHost, stream_));
  TD_CUDA_CHECK(cudaStreamSynchronize(stream_));
  std::memcpy(out, block_host_.get(), block_bytes());
}

void CudaExecutor::load_block(int32_t block, const std::byte* in) {
  check_block(block);
  TD_CUDA_CHECK(cudaStreamSynchronize(stream_));  // the staging buffers are free
  std::memcpy(block_host_.get(), in, block_bytes());
  TD_CUDA_CHECK(cudaMemcpyAsync(block_stage_.get(), block_host_.get(), block_bytes(), cudaMemcpyHostToDevice, stream_));
  kv_scatter_block(runs_, block, block_stage_.get(), stream_);
  TD_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

}  // namespace

std::unique_ptr<Executor> make_cuda_executor(Model& model, const KvPlan& plan) {
  return std::make_unique<CudaExecutor>(model, plan);
}

double cuda_read_bandwidth_gb_s(size_t bytes) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    (void)cudaGetLastError();
    fail(ErrorKind::kUnsupported, "no CUDA device");
  }
  bytes = bytes / 16 * 16;
  cudaStream_t s = nullptr;
  TD_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  DevBuf buf(bytes), sink(sizeof(uint32_t));
  TD_CUDA_CHECK(cudaMemsetAsync(buf.get(), 1, bytes, s));
  cudaEvent_t a = nullptr, b = nullptr;
  TD_CUDA_CHECK(cudaEventCreate(&a));
  TD_CUDA_CHECK(cudaEventCreate(&b));
  double best = 0;
  for (int rep = 0; rep < 6; ++rep) {  // the first warms up
    TD_CUDA_CHECK(cudaEventRecord(a, s));
    read_kernel(buf.get(), bytes, sink.get<uint32_t>(), s);
    TD_CUDA_CHECK(cudaEventRecord(b, s));
    TD_CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    TD_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    if (rep > 0 && ms > 0) best = std::max(best, static_cast<double>(bytes) / (ms * 1e-3) / 1e9);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  cudaStreamDestroy(s);
  return best;
}

}  // namespace tandem

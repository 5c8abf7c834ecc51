#include "model/weights.h"

#include <fmt/format.h>

#include "core/error.h"
#include "quant/quant.h"
#include "gguf/gguf.h"
#include "kernels/vec_dot.h"

namespace tandem {
namespace {

class Binder {
 public:
  Binder(const GgufFile& f) : f_(f) {}

  const GgufTensor* find(const std::string& name, bool required) const {
    const GgufTensor* t = f_.find_tensor(name);
    if (!t && required) fail(ErrorKind::kInvalidFile, "{}: missing tensor '{}'", f_.path(), name);
    return t;
  }

  WeightMatrix matrix(const std::string& name, int64_t cols, int64_t rows, bool required = true) const {
    const GgufTensor* t = find(name, required);
    if (!t) return {};
    if (t->dims.size() != 2 || t->dims[0] != cols || (rows >= 0 && t->dims[1] != rows))
      fail(ErrorKind::kInvalidFile, "{}: tensor '{}' has shape {}, expected [{}, {}]", f_.path(), name,
           shape(*t), cols, rows);
    return checked(*t);
  }

  // A tensor of the expected shape as a matrix of its type.
  WeightMatrix checked(const GgufTensor& tr) const {
    const GgufTensor* t = &tr;
    check_type(*t);
    WeightMatrix m;
    m.type = t->type;
    m.data = t->data;
    m.cols = t->dims[0];
    m.rows = t->dims[1];
    m.row_stride = row_bytes(t->type, m.cols);
    return m;
  }

  // A [cols, per, heads] tensor (llama.cpp's per-head stacks, such as
  // attn_k_b) as one matrix of per * heads rows.
  WeightMatrix stacked(const std::string& name, int64_t cols, int64_t per, int64_t heads) const {
    const GgufTensor* t = find(name, true);
    if (t->dims.size() != 3 || t->dims[0] != cols || t->dims[1] != per || t->dims[2] != heads)
      fail(ErrorKind::kInvalidFile, "{}: tensor '{}' has shape {}, expected [{}, {}, {}]", f_.path(), name,
           shape(*t), cols, per, heads);
    GgufTensor flat = *t;
    flat.dims = {cols, per * heads};
    return checked(flat);
  }

  // One 2-D view per expert of a 3-D tensor [cols, rows, n_expert]: the
  // shape is checked against the metadata here, so a file whose experts
  // disagree with expert_count or the widths is refused naming the tensor.
  std::vector<WeightMatrix> experts(const std::string& name, int64_t cols, int64_t rows, int64_t n_expert) const {
    const GgufTensor* t = find(name, true);
    if (t->dims.size() != 3 || t->dims[0] != cols || t->dims[1] != rows || t->dims[2] != n_expert)
      fail(ErrorKind::kInvalidFile, "{}: tensor '{}' has shape {}, expected [{}, {}, {}] (expert_count {})",
           f_.path(), name, shape(*t), cols, rows, n_expert, n_expert);
    check_type(*t);
    std::vector<WeightMatrix> v(static_cast<size_t>(n_expert));
    const size_t rb = row_bytes(t->type, cols);
    for (int64_t e = 0; e < n_expert; ++e) {
      WeightMatrix& m = v[static_cast<size_t>(e)];
      m.type = t->type;
      m.data = t->data + static_cast<size_t>(e) * static_cast<size_t>(rows) * rb;
      m.cols = cols;
      m.rows = rows;
      m.row_stride = rb;
    }
    return v;
  }

  // A 1-D tensor of `cols` values (or [cols, 1]) as a one-row matrix; absent: empty.
  WeightMatrix one_row(const std::string& name, int64_t cols) const {
    const GgufTensor* t = find(name, false);
    if (!t) return {};
    if (t->dims[0] != cols || t->n_elements != cols)
      fail(ErrorKind::kInvalidFile, "{}: tensor '{}' has shape {}, expected [{}]", f_.path(), name, shape(*t), cols);
    check_type(*t);
    WeightMatrix m;
    m.type = t->type;
    m.data = t->data;
    m.cols = cols;
    m.rows = 1;
    m.row_stride = row_bytes(t->type, cols);
    return m;
  }

  // A 2-D float tensor [width, n_expert] (gpt-oss's per-expert biases),
  // expert-major, its shape checked against the metadata.
  WeightVector expert_biases(const std::string& name, int64_t width, int64_t n_expert) const {
    const GgufTensor* t = find(name, true);
    if (t->dims.size() != 2 || t->dims[0] != width || t->dims[1] != n_expert)
      fail(ErrorKind::kInvalidFile, "{}: tensor '{}' has shape {}, expected [{}, {}] (expert_count {})", f_.path(),
           name, shape(*t), width, n_expert, n_expert);
    return vector(name, width * n_expert);
  }

  WeightVector vector(const std::string& name, int64_t n, bool required = true) const {
    const GgufTensor* t = find(name, required);
    if (!t) return {};
    if (t->n_elements != n)
      fail(ErrorKind::kInvalidFile, "{}: tensor '{}' has shape {}, expected {} elements", f_.path(), name,
           shape(*t), n);
    if (!type_traits(t->type).can_dequantize || n % type_traits(t->type).block_elems != 0)
      fail(ErrorKind::kUnsupported, "{}: tensor '{}' has type {}, expected a float type", f_.path(), name,
           type_traits(t->type).name);
    WeightVector v(static_cast<size_t>(n));
    dequantize_row(t->type, t->data, v.data(), n);
    return v;
  }

 private:
  void check_type(const GgufTensor& t) const {
    if (!type_traits(t.type).can_dequantize)
      fail(ErrorKind::kUnsupported, "{}: tensor '{}' has type {}, which Tandem cannot compute with", f_.path(),
           t.name, type_traits(t.type).name);
    vec_dot_type(t.type);  // throws if no kernel exists for the type
  }
  static std::string shape(const GgufTensor& t) { return fmt::format("[{}]", fmt::join(t.dims, ", ")); }
  const GgufFile& f_;
};

// Latent attention's tensors (deepseek2), in either form (config.h).
void bind_latent(const Binder& b, const ModelConfig& c, int32_t il, LayerWeights& L) {
  auto n = [il](const char* s) { return fmt::format("blk.{}.{}", il, s); };
  const int64_t E = c.n_embd, H = c.n_head, Dk = c.head_dim, Dv = c.head_dim_v;
  const int64_t R = c.rope_dims, nope = Dk - R, kvl = c.kv_lora_rank;
  if (c.q_lora_rank > 0) {
    L.wq_a = b.matrix(n("attn_q_a.weight"), E, c.q_lora_rank);
    L.q_a_norm = b.vector(n("attn_q_a_norm.weight"), c.q_lora_rank);
    L.wq = b.matrix(n("attn_q_b.weight"), c.q_lora_rank, H * Dk);
  } else {
    L.wq = b.matrix(n("attn_q.weight"), E, H * Dk);
  }
  L.wk = b.matrix(n("attn_kv_a_mqa.weight"), E, kvl + R);
  L.kv_a_norm = b.vector(n("attn_kv_a_norm.weight"), kvl);
  if (!c.kv_b_fused) {
    L.k_b = b.stacked(n("attn_k_b.weight"), nope, kvl, H);
    L.v_b = b.stacked(n("attn_v_b.weight"), kvl, Dv, H);
    L.v_b_pitch = Dv;
    return;
  }
  // attn_kv_b: per head, nope key rows then Dv value rows, each kvl wide.
  // The values are used in place; the keys are absorbed into the query,
  // which needs them transposed (kvl rows of nope per head), made here in f32.
  L.v_b = b.matrix(n("attn_kv_b.weight"), kvl, H * (nope + Dv));
  L.v_b_pitch = nope + Dv;
  L.v_b_offset = nope;
  L.k_b_owned.resize(size_t(H * kvl * nope));
  std::vector<float> row(static_cast<size_t>(kvl));
  for (int64_t h = 0; h < H; ++h)
    for (int64_t i = 0; i < nope; ++i) {
      dequantize_row(L.v_b.type, L.v_b.row(h * (nope + Dv) + i), row.data(), kvl);
      for (int64_t r = 0; r < kvl; ++r) L.k_b_owned[size_t((h * kvl + r) * nope + i)] = row[size_t(r)];
    }
  L.k_b.type = GgmlType::F32;
  L.k_b.data = reinterpret_cast<const uint8_t*>(L.k_b_owned.data());
  L.k_b.cols = nope;
  L.k_b.rows = H * kvl;
  L.k_b.row_stride = size_t(nope) * sizeof(float);
}

// Per-head Q, K and V projections (every other family).
void bind_attention(const Binder& b, const ModelConfig& c, int32_t il, LayerWeights& L) {
  auto n = [il](const char* s) { return fmt::format("blk.{}.{}", il, s); };
  const int64_t q_width = int64_t{c.n_head} * c.head_dim;
  const int64_t k_width = int64_t{c.n_head_kv} * c.head_dim;
  const int64_t v_width = int64_t{c.n_head_kv} * c.head_dim_v;
  L.wq = b.matrix(n("attn_q.weight"), c.n_embd, q_width);
  L.wk = b.matrix(n("attn_k.weight"), c.n_embd, k_width);
  L.wv = b.matrix(n("attn_v.weight"), c.n_embd, v_width);
  if (c.qkv_bias) {
    L.bq = b.vector(n("attn_q.bias"), q_width);
    L.bk = b.vector(n("attn_k.bias"), k_width);
    L.bv = b.vector(n("attn_v.bias"), v_width);
  }
  if (c.attn_out_bias) L.bo = b.vector(n("attn_output.bias"), c.n_embd);
  if (c.attn_sinks) L.sinks = b.vector(n("attn_sinks.weight"), c.n_head);
  if (c.qk_norm) {
    L.q_norm = b.vector(n("attn_q_norm.weight"), c.head_dim);
    L.k_norm = b.vector(n("attn_k_norm.weight"), c.head_dim);
  }
}

// A layer's feed-forward block as a mixture of experts, when the file has
// its router: the router's rows must be expert_count, every expert tensor
// [width, rows, expert_count] as the metadata says.
MoeWeights bind_moe(const Binder& b, const ModelConfig& c, int32_t il) {
  auto n = [il](const char* s) { return fmt::format("blk.{}.{}", il, s); };
  MoeWeights m;
  m.router = b.matrix(n("ffn_gate_inp.weight"), c.n_embd, c.n_expert);
  const int64_t F = c.n_ff_exp;
  m.gate = b.experts(n("ffn_gate_exps.weight"), c.n_embd, F, c.n_expert);
  m.up = b.experts(n("ffn_up_exps.weight"), c.n_embd, F, c.n_expert);
  m.down = b.experts(n("ffn_down_exps.weight"), F, c.n_embd, c.n_expert);
  // DeepSeek-V3-style files bias the choice of experts (not their weights).
  if (c.arch == Arch::kDeepseek2) m.select_bias = b.vector(n("exp_probs_b.bias"), c.n_expert, /*required=*/false);
  // gpt-oss: the router's bias on its logits, and each expert's biases.
  if (c.arch == Arch::kGptOss) {
    m.router_bias = b.vector(n("ffn_gate_inp.bias"), c.n_expert);
    m.gate_bias = b.expert_biases(n("ffn_gate_exps.bias"), F, c.n_expert);
    m.up_bias = b.expert_biases(n("ffn_up_exps.bias"), F, c.n_expert);
    m.down_bias = b.expert_biases(n("ffn_down_exps.bias"), c.n_embd, c.n_expert);
  }
  if (c.n_ff_shexp > 0) {
    m.sh_gate = b.matrix(n("ffn_gate_shexp.weight"), c.n_embd, c.n_ff_shexp);
    m.sh_up = b.matrix(n("ffn_up_shexp.weight"), c.n_embd, c.n_ff_shexp);
    m.sh_down = b.matrix(n("ffn_down_shexp.weight"), c.n_ff_shexp, c.n_embd);
    // qwen2moe's sigmoid gate, a vector in the file: a one-row matrix here
    // (deepseek2's shared experts have none; llama.cpp reads no gate there).
    if (c.arch != Arch::kDeepseek2) m.sh_gate_inp = b.one_row(n("ffn_gate_inp_shexp.weight"), c.n_embd);
  }
  return m;
}

}  // namespace

std::vector<WeightMatrix*> MoeWeights::matrices() {
  std::vector<WeightMatrix*> v;
  for (auto* kind : {&gate, &up, &down})
    for (WeightMatrix& W : *kind) v.push_back(&W);
  for (WeightMatrix* W : {&sh_gate, &sh_up, &sh_down})
    if (*W) v.push_back(W);
  return v;
}

std::vector<const WeightMatrix*> MoeWeights::matrices() const {
  std::vector<const WeightMatrix*> v;
  for (WeightMatrix* W : const_cast<MoeWeights*>(this)->matrices()) v.push_back(W);
  return v;
}

ModelWeights ModelWeights::bind(const GgufFile& f, ModelConfig& c) {
  Binder b(f);
  ModelWeights w;
  w.tok_embd = b.matrix("token_embd.weight", c.n_embd, -1);
  c.n_vocab = static_cast<int32_t>(w.tok_embd.rows);
  w.output_norm = b.vector("output_norm.weight", c.n_embd);
  w.output = b.matrix("output.weight", c.n_embd, c.n_vocab, /*required=*/false);
  if (!w.output) w.output = w.tok_embd;
  w.rope_freqs = b.vector("rope_freqs.weight", c.rope_dims / 2, /*required=*/false);

  const int64_t o_width = int64_t{c.n_head} * c.head_dim_v;
  for (int32_t il = 0; il < c.n_layer; ++il) {
    auto n = [il](const char* s) { return fmt::format("blk.{}.{}", il, s); };
    LayerWeights L;
    L.attn_norm = b.vector(n("attn_norm.weight"), c.n_embd);
    if (c.latent_attention()) {
      bind_latent(b, c, il, L);
    } else {
      bind_attention(b, c, il, L);
    }
    L.wo = b.matrix(n("attn_output.weight"), o_width, c.n_embd);
    if (c.sandwich_norm) {
      L.post_attn_norm = b.vector(n("post_attention_norm.weight"), c.n_embd);
      L.post_ffn_norm = b.vector(n("post_ffw_norm.weight"), c.n_embd);
    }
    // gpt-oss names its FFN input norm post_attention_norm (llama.cpp's attn_post_norm).
    L.ffn_norm = b.vector(n(c.arch == Arch::kGptOss ? "post_attention_norm.weight" : "ffn_norm.weight"), c.n_embd);
    if (c.n_expert > 0 && il >= c.n_layer_dense_lead) L.moe = bind_moe(b, c, il);
    if (!L.moe) {
      L.w_gate = b.matrix(n("ffn_gate.weight"), c.n_embd, c.n_ff);
      L.w_up = b.matrix(n("ffn_up.weight"), c.n_embd, c.n_ff);
      L.w_down = b.matrix(n("ffn_down.weight"), c.n_ff, c.n_embd);
    } else if (f.find_tensor(n("ffn_gate.weight"))) {
      fail(ErrorKind::kInvalidFile, "{}: layer {} has both a router ('{}') and a dense 'ffn_gate.weight'", f.path(),
           il, n("ffn_gate_inp.weight"));
    }
    w.layers.push_back(std::move(L));
  }
  return w;
}

}  // namespace tandem

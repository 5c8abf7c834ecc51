#include "gguf/synth.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <memory>
#include <utility>

#include <fmt/format.h>

#include "core/error.h"
#include "quant/ggml_type.h"
#include "quant/quant.h"
#include "runtime/thread_pool.h"
#include "gguf/gguf.h"

namespace tandem {
namespace {

// ---------------------------------------------------------------------------
// Random numbers. Only integer operations and IEEE-exact double operations
// (+ - * / sqrt, frexp) are used, so the bytes do not depend on the platform's
// libm (whose log/cos may differ in the last bit between implementations).

uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

constexpr uint64_t kGolden = 0x9e3779b97f4a7c15ull;

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

// ln(x) for x > 0 from its binary exponent and an atanh series on the mantissa
// reduced to [sqrt(1/2), sqrt(2)), where |s| <= 0.172 and 10 terms reach double
// precision. Horner form: multiplications only (a division per term cost more
// than the rest of the generator).
double det_log(double x) {
  int e = 0;
  double m = std::frexp(x, &e);  // exact: x = m * 2^e, m in [0.5, 1)
  if (m < 0.70710678118654752440) {
    m *= 2;
    --e;
  }
  const double s = (m - 1) / (m + 1), s2 = s * s;
  static constexpr double kInvOdd[] = {1.0 / 21, 1.0 / 19, 1.0 / 17, 1.0 / 15, 1.0 / 13, 1.0 / 11,
                                       1.0 / 9,  1.0 / 7,  1.0 / 5,  1.0 / 3,  1.0};
  double p = kInvOdd[0];
  for (int i = 1; i < 11; ++i) p = p * s2 + kInvOdd[i];
  return 2 * s * p + e * 0.69314718055994530942;
}

class Rng {
 public:
  explicit Rng(uint64_t state) : s_(state) {}
  uint64_t next() { return mix64(s_ += kGolden); }
  // Uniform in (-1, 1).
  double uniform_pm1() { return (static_cast<double>(next() >> 11) + 0.5) * 0x1p-52 - 1.0; }
  // Standard normal by the polar form of Box-Muller (no sin/cos needed).
  double normal() {
    if (have_spare_) {
      have_spare_ = false;
      return spare_;
    }
    double u, v, r;
    do {
      u = uniform_pm1();
      v = uniform_pm1();
      r = u * u + v * v;
    } while (r >= 1.0 || r == 0.0);
    const double f = std::sqrt(-2.0 * det_log(r) / r);
    spare_ = v * f;
    have_spare_ = true;
    return u * f;
  }

 private:
  uint64_t s_;
  double spare_ = 0;
  bool have_spare_ = false;
};

// ---------------------------------------------------------------------------
// Weight types.

struct TypeChoice {
  const char* cli;
  GgmlType base;
  bool mix_m;          // llama.cpp's _M rules on top of the base type
  uint32_t file_type;  // general.file_type (llama_ftype); pure K-quants take the _S number
  bool mxfp4_moe = false;  // llama.cpp's MXFP4_MOE: the experts in MXFP4, every other matrix Q8_0
};

constexpr TypeChoice kTypes[] = {
    {"f32", GgmlType::F32, false, 0},     {"f16", GgmlType::F16, false, 1},
    {"bf16", GgmlType::BF16, false, 32},  {"q8_0", GgmlType::Q8_0, false, 7},
    {"q4_0", GgmlType::Q4_0, false, 2},   {"q4_1", GgmlType::Q4_1, false, 3},
    {"q5_0", GgmlType::Q5_0, false, 8},   {"q5_1", GgmlType::Q5_1, false, 9},
    {"q2_k", GgmlType::Q2_K, false, 10},  {"q3_k", GgmlType::Q3_K, false, 11},
    {"q4_k", GgmlType::Q4_K, false, 14},  {"q5_k", GgmlType::Q5_K, false, 16},
    {"q6_k", GgmlType::Q6_K, false, 18},  {"q4_k_m", GgmlType::Q4_K, true, 15},
    {"q5_k_m", GgmlType::Q5_K, true, 17},  {"mxfp4", GgmlType::MXFP4, false, 38},
    {"mxfp4_moe", GgmlType::MXFP4, false, 38, true},
};

const TypeChoice& type_choice(const std::string& name) {
  std::string lower;
  for (char c : name) lower += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  for (const auto& t : kTypes)
    if (lower == t.cli) return t;
  fail(ErrorKind::kInvalidArgument, "synth: unknown weight type '{}' (known: {})", name,
       fmt::join(synth_type_names(), ", "));
}

bool is_float_type(GgmlType t) { return t == GgmlType::F32 || t == GgmlType::F16 || t == GgmlType::BF16; }

// llama.cpp's use_more_bits: the first and last eighth of the layers and every
// third one between get more bits in the _M mixes.
bool use_more_bits(int i_layer, int n_layer) {
  return i_layer < n_layer / 8 || i_layer >= 7 * n_layer / 8 || (i_layer - n_layer / 8) % 3 == 2;
}

// ---------------------------------------------------------------------------
// The tensor plan.

enum class Init { kMatrix, kNorm, kBias, kRopeFreqs, kSink };

struct Planned {
  std::string name;
  std::vector<int64_t> dims;  // ne0 first
  Init init;
  GgmlType type = GgmlType::F32;
  int64_t n_elements() const {
    int64_t n = 1;
    for (int64_t d : dims) n *= d;
    return n;
  }
};

struct Resolved {
  SynthSpec s;
  int32_t n_vocab = 0;
  bool tied = false;
  float rope_base = 0, rms_eps = 0;
  int64_t q_width() const { return int64_t{s.n_head} * s.head_dim; }
  int64_t kv_width() const { return int64_t{s.n_head_kv} * s.head_dim; }
};

void check_range(const char* field, int64_t v, int64_t lo, int64_t hi) {
  if (v < lo || v > hi) fail(ErrorKind::kInvalidArgument, "synth: {} = {} is outside [{}, {}]", field, v, lo, hi);
}

Resolved resolve(const SynthSpec& in) {
  Resolved r;
  r.s = in;
  SynthSpec& s = r.s;
  const bool llama = s.arch == "llama", qwen2 = s.arch == "qwen2", qwen3 = s.arch == "qwen3",
             gemma3 = s.arch == "gemma3", deepseek2 = s.arch == "deepseek2",
             qwen_moe = s.arch == "qwen2moe" || s.arch == "qwen3moe", gpt_oss = s.arch == "gpt-oss";
  if (!llama && !qwen2 && !qwen3 && !gemma3 && !deepseek2 && !qwen_moe && !gpt_oss)
    fail(ErrorKind::kInvalidArgument,
         "synth: unknown architecture '{}' (known: llama, qwen2, qwen3, gemma3, qwen2moe, qwen3moe, deepseek2, gpt-oss)",
         s.arch);
  if (deepseek2 || gpt_oss) {
    if (!std::isfinite(s.yarn_factor) || s.yarn_factor < 0 || !std::isfinite(s.yarn_log_mul))
      fail(ErrorKind::kInvalidArgument, "synth: yarn factor {} and log multiplier {} must be finite, factor >= 0",
           s.yarn_factor, s.yarn_log_mul);
    check_range("yarn-orig-ctx", s.yarn_orig_ctx, 1, 1 << 24);
  }
  if (deepseek2) {
    if (s.n_head_kv != 0 && s.n_head_kv != 1)
      fail(ErrorKind::kInvalidArgument, "synth: deepseek2 caches one latent per token; kv-heads = {} must be 1",
           s.n_head_kv);
    s.n_head_kv = 1;
    if (s.head_dim == 0) s.head_dim = 192;
    if (s.kv_lora_rank == 0) s.kv_lora_rank = 512;
    if (s.rope_dim == 0) s.rope_dim = 64;
    if (s.head_dim_v == 0) s.head_dim_v = 128;
    check_range("kv-lora", s.kv_lora_rank, 2, 1 << 16);
    check_range("q-lora", s.q_lora_rank, 0, 1 << 20);
    check_range("head-dim-v", s.head_dim_v, 1, 4096);
    check_range("rope-dim", s.rope_dim, 2, s.head_dim - 1);
    if (s.rope_dim % 2 != 0)
      fail(ErrorKind::kInvalidArgument, "synth: rope-dim = {} is odd; RoPE rotates pairs", s.rope_dim);
    if (s.n_expert > 0) {
      if (s.n_layer_dense_lead < 0) s.n_layer_dense_lead = std::min(1, s.n_layer);
      if (s.n_expert_shared < 0) s.n_expert_shared = 2;
      check_range("dense-lead", s.n_layer_dense_lead, 0, s.n_layer);
      check_range("experts-shared", s.n_expert_shared, 0, 1024);
      if (!std::isfinite(s.expert_weights_scale) || s.expert_weights_scale <= 0)
        fail(ErrorKind::kInvalidArgument, "synth: expert scale {} must be a positive number", s.expert_weights_scale);
    } else {
      if (s.n_layer_dense_lead >= 0 && s.n_layer_dense_lead != s.n_layer)
        fail(ErrorKind::kInvalidArgument, "synth: dense-lead = {} needs experts (without, every layer is dense)",
             s.n_layer_dense_lead);
      s.n_layer_dense_lead = s.n_layer;
      s.n_expert_shared = 0;
    }
  } else if (s.kv_lora_rank != 0 || s.q_lora_rank != 0 || s.rope_dim != 0 || s.head_dim_v != 0 ||
             (s.yarn_factor != 0 && !gpt_oss) || s.n_layer_dense_lead >= 0 || s.n_expert_shared >= 0 ||
             s.expert_weights_scale != 1.0f || s.expert_weights_norm) {
    fail(ErrorKind::kInvalidArgument,
         "synth: kv-lora, q-lora, rope-dim, head-dim-v, yarn (gpt-oss has it too), dense-lead, experts-shared, "
         "expert-scale and expert-norm are deepseek2's, not {}",
         s.arch);
  }
  if (s.name.empty()) s.name = "synth-" + s.arch;
  constexpr int64_t kBig = 1 << 20;
  check_range("layers", s.n_layer, 1, 1024);
  check_range("embd", s.n_embd, 1, kBig);
  check_range("ff", s.n_ff, 1, kBig);
  check_range("heads", s.n_head, 1, 4096);
  if (s.n_head_kv == 0) s.n_head_kv = s.n_head;
  check_range("kv-heads", s.n_head_kv, 1, s.n_head);
  if (s.n_head % s.n_head_kv != 0)
    fail(ErrorKind::kInvalidArgument, "synth: heads = {} is not a multiple of kv-heads = {}", s.n_head,
         s.n_head_kv);
  if (s.head_dim == 0) {
    if (s.n_embd % s.n_head != 0)
      fail(ErrorKind::kInvalidArgument,
           "synth: embd = {} is not a multiple of heads = {}; give head-dim explicitly", s.n_embd, s.n_head);
    s.head_dim = s.n_embd / s.n_head;
  }
  check_range("head-dim", s.head_dim, 2, 4096);
  if (s.head_dim % 2 != 0)
    fail(ErrorKind::kInvalidArgument, "synth: head-dim = {} is odd; RoPE rotates pairs", s.head_dim);
  check_range("ctx", s.n_ctx, 1, 1 << 24);
  if ((qwen_moe || gpt_oss) && s.n_expert == 0) s.n_expert = 8;
  if (s.n_expert != 0 && !llama && !qwen_moe && !deepseek2 && !gpt_oss)
    fail(ErrorKind::kInvalidArgument,
         "synth: experts are supported for llama, qwen2moe, qwen3moe, deepseek2 and gpt-oss, not {}", s.arch);
  if (s.n_expert != 0) {
    check_range("experts", s.n_expert, 1, 1 << 16);
    if (s.n_expert_used == 0) s.n_expert_used = std::min(2, s.n_expert);
    check_range("experts-used", s.n_expert_used, 1, s.n_expert);
    if (s.n_ff_exp == 0 || llama) s.n_ff_exp = s.n_ff;  // Mixtral's experts are feed_forward_length wide
    check_range("ff-exp", s.n_ff_exp, 1, kBig);
    if (s.arch == "qwen2moe" && s.n_ff_shexp == 0) s.n_ff_shexp = s.n_ff;
  } else if (s.n_expert_used != 0 || s.n_ff_exp != 0) {
    fail(ErrorKind::kInvalidArgument, "synth: experts-used and ff-exp need experts");
  }
  if (s.n_ff_shexp != 0 && s.arch != "qwen2moe")
    fail(ErrorKind::kInvalidArgument, "synth: a shared expert (ff-shexp) is only supported for qwen2moe, not {}",
         s.arch);
  if (s.n_ff_shexp != 0) check_range("ff-shexp", s.n_ff_shexp, 1, kBig);

  if (gemma3 || gpt_oss) {
    if (s.sliding_window == 0) s.sliding_window = gemma3 ? 512 : 128;
    check_range("window", s.sliding_window, 1, 1 << 24);
  } else if (s.sliding_window != 0) {
    fail(ErrorKind::kInvalidArgument, "synth: a sliding window is only supported for gemma3 and gpt-oss, not {}",
         s.arch);
  }
  if (s.rope_freqs && !llama)
    fail(ErrorKind::kInvalidArgument, "synth: rope_freqs factors are only supported for llama, not {}", s.arch);

  r.rope_base = s.rope_base.value_or(llama || deepseek2 ? 10000.0f : gpt_oss ? 150000.0f : 1000000.0f);
  r.rms_eps = s.rms_eps.value_or(llama || gpt_oss ? 1e-5f : 1e-6f);
  if (!std::isfinite(r.rope_base) || r.rope_base <= 0)
    fail(ErrorKind::kInvalidArgument, "synth: rope base {} must be a positive number", r.rope_base);
  if (!std::isfinite(r.rms_eps) || r.rms_eps <= 0)
    fail(ErrorKind::kInvalidArgument, "synth: rms epsilon {} must be a positive number", r.rms_eps);
  // llama.cpp's qwen2moe and gpt-oss need output.weight.
  r.tied = s.tied.value_or(!llama && !deepseek2 && !qwen_moe && !gpt_oss);
  type_choice(s.type);  // validates
  if (s.vocab_from.empty())
    fail(ErrorKind::kInvalidArgument,
         "synth: a vocabulary is required: give a GGUF with a tokenizer (--vocab-from), e.g. "
         "ggml-vocab-llama-spm.gguf or stories260K.gguf");
  return r;
}

// Assigns each matrix its type the way llama.cpp's llama_tensor_get_type would
// for this ftype, then applies llama.cpp's fallback for rows a K-quant block
// does not divide.
GgmlType matrix_type(const Resolved& r, const TypeChoice& tc, const std::string& name, int layer, int64_t ne0) {
  GgmlType t = tc.base;
  const bool is_output = name == "output.weight" || (r.tied && name == "token_embd.weight");
  if (tc.mxfp4_moe) t = name.ends_with("_exps.weight") ? GgmlType::MXFP4 : GgmlType::Q8_0;
  if (tc.mix_m) {
    const int64_t qk = type_traits(tc.base).block_elems;
    if (is_output) {
      t = ne0 % qk != 0 ? GgmlType::Q8_0 : GgmlType::Q6_K;
    } else if (name.ends_with("attn_v.weight") && r.s.n_expert == 8) {
      t = GgmlType::Q8_0;  // llama.cpp's rule for 8-expert models
    } else if ((name.ends_with("attn_v.weight") || name.find("ffn_down") != std::string::npos) &&
               use_more_bits(layer, r.s.n_layer)) {
      t = GgmlType::Q6_K;  // ffn_down, ffn_down_exps, ffn_down_shexp
    }
  }
  const TypeTraits& tt = type_traits(t);
  if (ne0 % tt.block_elems != 0) {
    switch (t) {
      case GgmlType::Q4_K: t = GgmlType::Q5_0; break;
      case GgmlType::Q5_K: t = GgmlType::Q5_1; break;
      case GgmlType::Q6_K: t = GgmlType::Q8_0; break;
      default: break;  // Q2_K/Q3_K fall back to iq4_nl in llama.cpp, which Tandem lacks
    }
    const TypeTraits& ft = type_traits(t);
    if (ne0 % ft.block_elems != 0)
      fail(ErrorKind::kInvalidArgument,
           "synth: tensor '{}' has rows of {} elements, which is not a multiple of the {} block size {}", name,
           ne0, ft.name, ft.block_elems);
  }
  return t;
}

std::vector<Planned> plan_tensors(const Resolved& r) {
  const SynthSpec& s = r.s;
  const TypeChoice& tc = type_choice(s.type);
  const bool qkv_bias = s.arch == "qwen2" || s.arch == "qwen2moe";
  const bool qk_norm = s.arch == "qwen3" || s.arch == "qwen3moe" || s.arch == "gemma3";
  const bool sandwich = s.arch == "gemma3";
  const int64_t E = s.n_embd, V = r.n_vocab, F = s.n_ff, D = s.head_dim;
  const int64_t QW = r.q_width(), KW = r.kv_width();

  std::vector<Planned> p;
  auto matrix = [&](std::string name, int64_t cols, int64_t rows, int layer) {
    GgmlType t = matrix_type(r, tc, name, layer, cols);
    p.push_back({std::move(name), {cols, rows}, Init::kMatrix, t});
  };
  auto vec = [&](std::string name, int64_t n, Init init) { p.push_back({std::move(name), {n}, init, GgmlType::F32}); };
  // The experts: one 3-D tensor per kind, [cols, rows, n_expert].
  auto experts = [&](std::string name, int64_t cols, int64_t rows, int layer) {
    GgmlType t = matrix_type(r, tc, name, layer, cols);
    p.push_back({std::move(name), {cols, rows, s.n_expert}, Init::kMatrix, t});
  };

  matrix("token_embd.weight", E, V, -1);
  vec("output_norm.weight", E, Init::kNorm);
  if (!r.tied) matrix("output.weight", E, V, -1);
  if (s.rope_freqs) vec("rope_freqs.weight", D / 2, Init::kRopeFreqs);
  // A per-head stack of matrices, [cols, per, heads].
  auto stack = [&](std::string name, int64_t cols, int64_t per, int64_t heads, int layer) {
    GgmlType t = matrix_type(r, tc, name, layer, cols);
    p.push_back({std::move(name), {cols, per, heads}, Init::kMatrix, t});
  };
  // A layer's router and routed experts; the router stays f32, as
  // llama-quantize leaves it.
  auto routed = [&](int il) {
    auto n = [il](const char* t) { return fmt::format("blk.{}.{}", il, t); };
    p.push_back({n("ffn_gate_inp.weight"), {E, s.n_expert}, Init::kMatrix, GgmlType::F32});
    experts(n("ffn_gate_exps.weight"), E, s.n_ff_exp, il);
    experts(n("ffn_up_exps.weight"), E, s.n_ff_exp, il);
    experts(n("ffn_down_exps.weight"), s.n_ff_exp, E, il);
  };
  for (int il = 0; il < s.n_layer; ++il) {
    auto n = [il](const char* t) { return fmt::format("blk.{}.{}", il, t); };
    vec(n("attn_norm.weight"), E, Init::kNorm);
    if (s.arch == "deepseek2") {
      const int64_t H = s.n_head, KL = s.kv_lora_rank, R = s.rope_dim, Dv = s.head_dim_v;
      if (s.q_lora_rank > 0) {
        matrix(n("attn_q_a.weight"), E, s.q_lora_rank, il);
        vec(n("attn_q_a_norm.weight"), s.q_lora_rank, Init::kNorm);
        matrix(n("attn_q_b.weight"), s.q_lora_rank, QW, il);
      } else {
        matrix(n("attn_q.weight"), E, QW, il);
      }
      matrix(n("attn_kv_a_mqa.weight"), E, KL + R, il);
      vec(n("attn_kv_a_norm.weight"), KL, Init::kNorm);
      stack(n("attn_k_b.weight"), D - R, KL, H, il);
      stack(n("attn_v_b.weight"), KL, Dv, H, il);
      matrix(n("attn_output.weight"), H * Dv, E, il);
      vec(n("ffn_norm.weight"), E, Init::kNorm);
      if (il >= s.n_layer_dense_lead) {
        routed(il);
        const int64_t SH = int64_t{s.n_expert_shared} * s.n_ff_exp;  // the shared experts as one FFN
        if (SH > 0) {
          matrix(n("ffn_gate_shexp.weight"), E, SH, il);
          matrix(n("ffn_up_shexp.weight"), E, SH, il);
          matrix(n("ffn_down_shexp.weight"), SH, E, il);
        }
      } else {
        matrix(n("ffn_gate.weight"), E, F, il);
        matrix(n("ffn_up.weight"), E, F, il);
        matrix(n("ffn_down.weight"), F, E, il);
      }
      continue;
    }
    if (s.arch == "gpt-oss") {
      // As llama.cpp loads gpt-oss: biased q/k/v/o, a sink logit per head,
      // post_attention_norm as the FFN's input norm, a biased router and
      // biased experts ([width, n_expert] per kind).
      matrix(n("attn_q.weight"), E, QW, il);
      matrix(n("attn_k.weight"), E, KW, il);
      matrix(n("attn_v.weight"), E, KW, il);
      matrix(n("attn_output.weight"), QW, E, il);
      vec(n("attn_q.bias"), QW, Init::kBias);
      vec(n("attn_k.bias"), KW, Init::kBias);
      vec(n("attn_v.bias"), KW, Init::kBias);
      vec(n("attn_output.bias"), E, Init::kBias);
      vec(n("attn_sinks.weight"), s.n_head, Init::kSink);
      vec(n("post_attention_norm.weight"), E, Init::kNorm);
      routed(il);
      vec(n("ffn_gate_inp.bias"), s.n_expert, Init::kBias);
      p.push_back({n("ffn_gate_exps.bias"), {s.n_ff_exp, s.n_expert}, Init::kBias, GgmlType::F32});
      p.push_back({n("ffn_up_exps.bias"), {s.n_ff_exp, s.n_expert}, Init::kBias, GgmlType::F32});
      p.push_back({n("ffn_down_exps.bias"), {E, s.n_expert}, Init::kBias, GgmlType::F32});
      continue;
    }
    matrix(n("attn_q.weight"), E, QW, il);
    matrix(n("attn_k.weight"), E, KW, il);
    matrix(n("attn_v.weight"), E, KW, il);
    matrix(n("attn_output.weight"), QW, E, il);
    if (qkv_bias) {
      vec(n("attn_q.bias"), QW, Init::kBias);
      vec(n("attn_k.bias"), KW, Init::kBias);
      vec(n("attn_v.bias"), KW, Init::kBias);
    }
    if (qk_norm) {
      vec(n("attn_q_norm.weight"), D, Init::kNorm);
      vec(n("attn_k_norm.weight"), D, Init::kNorm);
    }
    if (sandwich) vec(n("post_attention_norm.weight"), E, Init::kNorm);
    vec(n("ffn_norm.weight"), E, Init::kNorm);
    if (s.n_expert > 0) {
      routed(il);
      if (s.n_ff_shexp > 0) {
        vec(n("ffn_gate_inp_shexp.weight"), E, Init::kMatrix);
        matrix(n("ffn_gate_shexp.weight"), E, s.n_ff_shexp, il);
        matrix(n("ffn_up_shexp.weight"), E, s.n_ff_shexp, il);
        matrix(n("ffn_down_shexp.weight"), s.n_ff_shexp, E, il);
      }
    } else {
      matrix(n("ffn_gate.weight"), E, F, il);
      matrix(n("ffn_up.weight"), E, F, il);
      matrix(n("ffn_down.weight"), F, E, il);
    }
    if (sandwich) vec(n("post_ffw_norm.weight"), E, Init::kNorm);
  }
  return p;
}

// One row of a tensor's values. Matrices get std 1/sqrt(fan_in) so every
// projection keeps activations near unit RMS; norm weights scatter around 1
// (GGUF norms are multiplicative, Gemma's +1 included); rope factors follow
// Llama 3's shape: 1 for the fast dimensions, 8 for the slow ones, a ramp between.
void fill_row(const Planned& t, uint64_t tensor_seed, int64_t row, float* out) {
  const int64_t n = t.dims[0];
  if (t.init == Init::kRopeFreqs) {
    for (int64_t i = 0; i < n; ++i) {
      const double lo = n / 4.0, hi = 3.0 * n / 4.0;
      const double x = i <= lo ? 0.0 : i >= hi ? 1.0 : (i - lo) / (hi - lo);
      out[i] = static_cast<float>(1.0 + 7.0 * x);
    }
    return;
  }
  Rng rng(mix64(tensor_seed + static_cast<uint64_t>(row + 1) * kGolden));
  // Sinks N(0, 1): logits of the size of the scores, so that they matter.
  const double std_dev = t.init == Init::kMatrix ? 1.0 / std::sqrt(static_cast<double>(n))
                         : t.init == Init::kBias ? 0.2
                         : t.init == Init::kSink ? 1.0
                                                 : 0.1;
  const double mean = t.init == Init::kNorm ? 1.0 : 0.0;
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<float>(mean + std_dev * rng.normal());
}

std::vector<uint8_t> make_tensor(const Planned& t, uint64_t seed, ThreadPool& pool) {
  const int64_t cols = t.dims[0], rows = t.n_elements() / cols;
  const size_t rb = row_bytes(t.type, cols);
  std::vector<uint8_t> data(rb * static_cast<size_t>(rows));
  const uint64_t tensor_seed = mix64(seed ^ mix64(fnv1a(t.name)));
  // Grain of at least ~64K elements per chunk keeps the pool's overhead small.
  const int64_t grain = std::max<int64_t>(1, 65536 / cols);
  pool.parallel_for(rows, grain, [&](int64_t r0, int64_t r1) {
    std::vector<float> buf(static_cast<size_t>(cols));
    for (int64_t r = r0; r < r1; ++r) {
      fill_row(t, tensor_seed, r, buf.data());
      quantize_row(t.type, buf.data(), data.data() + static_cast<size_t>(r) * rb, cols);
    }
  });
  return data;
}

int32_t copy_tokenizer(const std::string& path, GgufWriter& w) {
  std::unique_ptr<GgufFile> f = GgufFile::open(path);
  auto tokens = f->get_string_array("tokenizer.ggml.tokens");
  if (!tokens || tokens->empty())
    fail(ErrorKind::kInvalidFile, "{}: no tokenizer.ggml.tokens: not a GGUF with a vocabulary", path);
  if (tokens->size() > (1u << 24))
    fail(ErrorKind::kInvalidFile, "{}: {} tokens is more than synth supports", path, tokens->size());
  for (const GgufKV& kv : f->metadata())
    if (kv.key.starts_with("tokenizer.")) w.add(kv.key, kv.value);
  return static_cast<int32_t>(tokens->size());
}

}  // namespace

std::vector<std::string> synth_type_names() {
  std::vector<std::string> v;
  for (const auto& t : kTypes) v.push_back(t.cli);
  return v;
}

std::vector<std::string> synth_preset_names() {
  return {"tinyllama-1.1b", "qwen3-0.6b",   "gemma3-270m",      "qwen3-30b-a3b",
          "mixtral-8x7b",  "qwen1.5-moe-a2.7b", "deepseek-v2-lite-dense", "deepseek-v2-lite", "gpt-oss-20b"};
}

SynthSpec synth_preset(const std::string& name) {
  SynthSpec s;
  if (name == "tinyllama-1.1b") {
    s.arch = "llama";
    s.n_layer = 22, s.n_embd = 2048, s.n_ff = 5632, s.n_head = 32, s.n_head_kv = 4;
  } else if (name == "qwen3-0.6b") {
    s.arch = "qwen3";
    s.n_layer = 28, s.n_embd = 1024, s.n_ff = 3072, s.n_head = 16, s.n_head_kv = 8, s.head_dim = 128;
  } else if (name == "gemma3-270m") {
    s.arch = "gemma3";
    s.n_layer = 18, s.n_embd = 640, s.n_ff = 2048, s.n_head = 4, s.n_head_kv = 1, s.head_dim = 256;
    s.sliding_window = 512;
  } else if (name == "deepseek-v2-lite-dense" || name == "deepseek-v2-lite") {
    s.arch = "deepseek2";
    s.n_layer = 27, s.n_embd = 2048, s.n_ff = 10944, s.n_head = 16, s.n_ctx = 163840;
    s.yarn_factor = 40, s.yarn_orig_ctx = 4096, s.yarn_log_mul = 0.0707f;
    if (name == "deepseek-v2-lite") {
      s.n_expert = 64, s.n_expert_used = 6, s.n_ff_exp = 1408;
      s.n_layer_dense_lead = 1, s.n_expert_shared = 2, s.expert_weights_scale = 1.0f, s.expert_weights_norm = false;
    }
  } else if (name == "gpt-oss-20b") {
    // openai/gpt-oss-20b's config: 24 layers, 2880 wide, 64 heads (8 KV) of
    // 64, 32 experts of 2880, 4 used, window 128, YaRN 32 over 4096.
    s.arch = "gpt-oss";
    s.n_layer = 24, s.n_embd = 2880, s.n_ff = 2880, s.n_head = 64, s.n_head_kv = 8, s.head_dim = 64;
    s.n_expert = 32, s.n_expert_used = 4, s.n_ff_exp = 2880, s.sliding_window = 128;
    s.n_ctx = 131072, s.yarn_factor = 32, s.yarn_orig_ctx = 4096;
  } else if (name == "qwen3-30b-a3b") {
    s.arch = "qwen3moe";
    s.n_layer = 48, s.n_embd = 2048, s.n_ff = 6144, s.n_head = 32, s.n_head_kv = 4, s.head_dim = 128;
    s.n_expert = 128, s.n_expert_used = 8, s.n_ff_exp = 768;
    s.tied = false;
  } else if (name == "mixtral-8x7b") {
    s.arch = "llama";
    s.n_layer = 32, s.n_embd = 4096, s.n_ff = 14336, s.n_head = 32, s.n_head_kv = 8;
    s.n_expert = 8, s.n_expert_used = 2;
  } else if (name == "qwen1.5-moe-a2.7b") {
    s.arch = "qwen2moe";
    s.n_layer = 24, s.n_embd = 2048, s.n_ff = 5632, s.n_head = 16, s.n_head_kv = 16;
    s.n_expert = 60, s.n_expert_used = 4, s.n_ff_exp = 1408, s.n_ff_shexp = 5632;
    s.tied = false;
  } else {
    fail(ErrorKind::kInvalidArgument, "synth: unknown preset '{}' (known: {})", name,
         fmt::join(synth_preset_names(), ", "));
  }
  s.name = "synth-" + name;
  return s;
}

SynthReport synth_model(const SynthSpec& spec, const std::string& out_path, int n_threads) {
  Resolved r = resolve(spec);
  const SynthSpec& s = r.s;
  const TypeChoice& tc = type_choice(s.type);

  GgufWriter w;
  w.add_string("general.architecture", s.arch);
  w.add_string("general.name", s.name);
  w.add_u32("general.file_type", tc.file_type);
  if (!is_float_type(tc.base)) w.add_u32("general.quantization_version", 2);
  const std::string a = s.arch + ".";
  w.add_u32(a + "context_length", static_cast<uint32_t>(s.n_ctx));
  w.add_u32(a + "embedding_length", static_cast<uint32_t>(s.n_embd));
  w.add_u32(a + "block_count", static_cast<uint32_t>(s.n_layer));
  w.add_u32(a + "feed_forward_length", static_cast<uint32_t>(s.n_ff));
  w.add_u32(a + "attention.head_count", static_cast<uint32_t>(s.n_head));
  w.add_u32(a + "attention.head_count_kv", static_cast<uint32_t>(s.n_head_kv));
  w.add_f32(a + "attention.layer_norm_rms_epsilon", r.rms_eps);
  w.add_f32(a + "rope.freq_base", r.rope_base);
  if (s.n_expert > 0) {
    w.add_u32(a + "expert_count", static_cast<uint32_t>(s.n_expert));
    w.add_u32(a + "expert_used_count", static_cast<uint32_t>(s.n_expert_used));
    if (s.arch != "llama" && s.arch != "deepseek2")
      w.add_u32(a + "expert_feed_forward_length", static_cast<uint32_t>(s.n_ff_exp));
    if (s.n_ff_shexp > 0) w.add_u32(a + "expert_shared_feed_forward_length", static_cast<uint32_t>(s.n_ff_shexp));
  }
  if (s.arch == "deepseek2") {
    // As llama.cpp's converter writes DeepSeek-V2: key/value_length are what
    // the cache holds per token (latent + rope, latent), the _mla ones the
    // per-head widths. The expert keys llama.cpp requires are written even
    // when every layer is dense (then no expert tensor exists).
    w.add_u32(a + "attention.key_length", static_cast<uint32_t>(s.kv_lora_rank + s.rope_dim));
    w.add_u32(a + "attention.value_length", static_cast<uint32_t>(s.kv_lora_rank));
    w.add_u32(a + "attention.key_length_mla", static_cast<uint32_t>(s.head_dim));
    w.add_u32(a + "attention.value_length_mla", static_cast<uint32_t>(s.head_dim_v));
    w.add_u32(a + "attention.kv_lora_rank", static_cast<uint32_t>(s.kv_lora_rank));
    w.add_u32(a + "attention.q_lora_rank", static_cast<uint32_t>(s.q_lora_rank));
    w.add_u32(a + "rope.dimension_count", static_cast<uint32_t>(s.rope_dim));
    w.add_u32(a + "leading_dense_block_count", static_cast<uint32_t>(s.n_layer_dense_lead));
    w.add_u32(a + "expert_feed_forward_length", static_cast<uint32_t>(s.n_expert > 0 ? s.n_ff_exp : s.n_ff));
    w.add_u32(a + "expert_shared_count", static_cast<uint32_t>(s.n_expert_shared));
    if (s.n_expert > 0) {
      w.add_f32(a + "expert_weights_scale", s.expert_weights_scale);
      w.add_bool(a + "expert_weights_norm", s.expert_weights_norm);
      w.add_u32(a + "expert_gating_func", 1);  // softmax, as the converter writes V2's
    }
    if (s.yarn_factor > 0) {
      w.add_string(a + "rope.scaling.type", "yarn");
      w.add_f32(a + "rope.scaling.factor", s.yarn_factor);
      w.add_u32(a + "rope.scaling.original_context_length", static_cast<uint32_t>(s.yarn_orig_ctx));
      w.add_f32(a + "rope.scaling.yarn_log_multiplier", s.yarn_log_mul);
    }
  } else if (s.arch == "qwen3" || s.arch == "qwen3moe" || s.arch == "gemma3" || s.arch == "gpt-oss" ||
             s.head_dim * s.n_head != s.n_embd) {
    // Qwen3 and Gemma 3 converters always write the head width; the others
    // only need it when it is not n_embd / n_head.
    w.add_u32(a + "attention.key_length", static_cast<uint32_t>(s.head_dim));
    w.add_u32(a + "attention.value_length", static_cast<uint32_t>(s.head_dim));
  }
  if (s.arch == "llama") w.add_u32(a + "rope.dimension_count", static_cast<uint32_t>(s.head_dim));
  if (s.arch == "gemma3" || s.arch == "gpt-oss")
    w.add_u32(a + "attention.sliding_window", static_cast<uint32_t>(s.sliding_window));
  if (s.arch == "gpt-oss" && s.yarn_factor > 0) {
    // As the converter writes gpt-oss's YaRN (no log multiplier).
    w.add_string(a + "rope.scaling.type", "yarn");
    w.add_f32(a + "rope.scaling.factor", s.yarn_factor);
    w.add_u32(a + "rope.scaling.original_context_length", static_cast<uint32_t>(s.yarn_orig_ctx));
  }
  r.n_vocab = copy_tokenizer(s.vocab_from, w);

  const std::vector<Planned> plan = plan_tensors(r);
  SynthReport rep;
  rep.n_vocab = r.n_vocab;
  ThreadPool pool(n_threads);
  for (const Planned& t : plan) {
    rep.n_params += t.n_elements();
    ++rep.n_tensors;
    ++rep.tensors_per_type[std::string(type_traits(t.type).name)];
    w.add_tensor(t.name, t.type, t.dims, make_tensor(t, s.seed, pool));
  }
  w.write(out_path);
  std::error_code ec;
  rep.file_bytes = std::filesystem::file_size(out_path, ec);
  return rep;
}

}  // namespace tandem

#include "model/config.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "core/error.h"
#include "gguf/gguf.h"

namespace tandem {

const char* arch_name(Arch a) {
  switch (a) {
    case Arch::kLlama: return "llama";
    case Arch::kQwen2: return "qwen2";
    case Arch::kQwen3: return "qwen3";
    case Arch::kGemma3: return "gemma3";
    case Arch::kDeepseek2: return "deepseek2";
    case Arch::kQwen2Moe: return "qwen2moe";
    case Arch::kQwen3Moe: return "qwen3moe";
    case Arch::kGptOss: return "gpt-oss";
  }
  return "?";
}

namespace {

struct Keys {
  const GgufFile& f;
  std::string prefix;

  std::string k(std::string_view suffix) const { return prefix + "." + std::string(suffix); }

  int32_t req_int(std::string_view suffix, int64_t lo, int64_t hi) const {
    auto v = f.get_int(k(suffix));
    if (!v) fail(ErrorKind::kInvalidFile, "{}: missing metadata key '{}'", f.path(), k(suffix));
    return check(suffix, *v, lo, hi);
  }
  int32_t opt_int(std::string_view suffix, int64_t def, int64_t lo, int64_t hi) const {
    auto v = f.get_int(k(suffix));
    return v ? check(suffix, *v, lo, hi) : static_cast<int32_t>(def);
  }
  float opt_float(std::string_view suffix, double def) const {
    auto v = f.get_float(k(suffix));
    double x = v ? *v : def;
    if (!std::isfinite(x)) fail(ErrorKind::kInvalidFile, "{}: '{}' is not finite", f.path(), k(suffix));
    return static_cast<float>(x);
  }
  int32_t check(std::string_view suffix, int64_t v, int64_t lo, int64_t hi) const {
    if (v < lo || v > hi)
      fail(ErrorKind::kInvalidFile, "{}: '{}' = {} is outside [{}, {}]", f.path(), k(suffix), v, lo, hi);
    return static_cast<int32_t>(v);
  }
};

// YaRN as llama.cpp applies it to deepseek2 (llama-context.cpp and the
// deepseek2 graph): beta_fast 32, beta_slow 1; the GGUF's
// yarn_log_multiplier carries the converter's factor 0.1, taken off again.
// Its attention factor cancels against the rope's own magnitude factor, so
// the rotated parts keep magnitude rope_mscale (1 for DeepSeek-V2), and the
// softmax scale takes mscale^2 with mscale = 1 + 0.1 * log_mul * ln(factor).
// gpt-oss (no log multiplier): llama.cpp's rope multiplies every query and
// key element by rope_mscale = 1 + 0.1 ln(factor); as all of a head is
// rotated there, the plain attention path takes that as rope_mscale^2 in the
// softmax scale (yarn_attn_mscale = rope_mscale) and rotates without it.
void read_yarn(const GgufFile& f, const Keys& k, ModelConfig& c) {
  const float factor = k.opt_float("rope.scaling.factor", 1.0);
  if (factor <= 0) fail(ErrorKind::kInvalidFile, "{}: rope.scaling.factor {} <= 0", f.path(), factor);
  const int32_t orig = k.opt_int("rope.scaling.original_context_length", c.n_ctx_train, 1, 1 << 24);
  const float log_mul = k.opt_float("rope.scaling.yarn_log_multiplier", 0.0) / 0.1f;
  const float attn = k.opt_float("rope.scaling.attn_factor", 1.0);
  c.rope_scale = 1.0f / factor;
  c.rope_yarn = true;
  const auto corr_dim = [&](float n_rot) {
    return static_cast<float>(c.rope_dims) * std::log(static_cast<float>(orig) / (n_rot * 2.0f * std::numbers::pi_v<float>)) /
           (2.0f * std::log(c.rope_base));
  };
  c.yarn_low = std::max(0.0f, std::floor(corr_dim(32.0f)));
  c.yarn_high = std::min(static_cast<float>(c.rope_dims - 1), std::ceil(corr_dim(1.0f)));
  const auto get_mscale = [](float s, float m) { return s <= 1.0f ? 1.0f : 0.1f * m * std::log(s) + 1.0f; };
  const float ratio = log_mul != 0.0f ? 1.0f : get_mscale(factor, 1.0f);
  c.rope_mscale = ratio * attn;
  c.yarn_attn_mscale = c.rope_mscale * (1.0f + 0.1f * log_mul * std::log(factor));
}

// deepseek2's latent attention, in either form converters write: the split
// per-head up-projections (attention.key_length_mla set; key_length is then
// the cached latent + rope width, value_length the latent's, one KV head),
// or the older fused attn_kv_b (key_length / value_length are per head).
void read_latent_attention(const GgufFile& f, const Keys& k, ModelConfig& c) {
  c.rope_style = RopeStyle::kNormal;
  c.kv_lora_rank = k.req_int("attention.kv_lora_rank", 1, 1 << 16);
  c.q_lora_rank = k.opt_int("attention.q_lora_rank", 0, 0, 1 << 20);
  if (f.get_int(k.k("attention.key_length_mla"))) {
    const int32_t cached_k = c.head_dim, cached_v = c.head_dim_v;
    c.head_dim = k.req_int("attention.key_length_mla", 2, 4096);
    c.head_dim_v = k.req_int("attention.value_length_mla", 1, 4096);
    if (cached_k != c.kv_lora_rank + c.rope_dims || cached_v != c.kv_lora_rank || c.n_head_kv != 1)
      fail(ErrorKind::kInvalidFile,
           "{}: latent attention expects key_length = kv_lora_rank + rope dims ({} + {}), value_length = "
           "kv_lora_rank and one KV head; the file has {}, {} and {}",
           f.path(), c.kv_lora_rank, c.rope_dims, cached_k, cached_v, c.n_head_kv);
  } else {
    c.kv_b_fused = true;
  }
  if (c.rope_dims >= c.head_dim || c.rope_dims % 2 != 0)
    fail(ErrorKind::kInvalidFile, "{}: rope dims {} must be even and below the query head width {}", f.path(),
         c.rope_dims, c.head_dim);
  c.n_head_kv = 1;  // the cache holds one latent per token, shared by every head
  c.n_layer_dense_lead = k.opt_int("leading_dense_block_count", 0, 0, c.n_layer);
}

// deepseek2's experts, read as llama.cpp reads DeepSeek-V2: routed experts
// expert_feed_forward_length wide, expert_shared_count shared experts as one
// dense FFN of count x that width (no gate), the gating function (absent:
// softmax, as V2 and V2.5 files predate the key), optional renormalisation
// and the routed scaling factor (0 or absent: none, as build_moe_ffn skips it).
void read_deepseek2_experts(const GgufFile& f, const Keys& k, ModelConfig& c) {
  if (c.n_expert == 0) {
    if (c.n_layer_dense_lead < c.n_layer)
      fail(ErrorKind::kInvalidFile,
           "{}: deepseek2 layers {}..{} are mixture-of-experts layers (leading_dense_block_count = {} of {} "
           "blocks) but '{}' is missing or 0",
           f.path(), c.n_layer_dense_lead, c.n_layer - 1, c.n_layer_dense_lead, c.n_layer, k.k("expert_count"));
    return;
  }
  c.n_ff_exp = k.req_int("expert_feed_forward_length", 1, 1 << 20);
  const int32_t n_shared = k.req_int("expert_shared_count", 0, 1024);
  c.n_ff_shexp = n_shared * c.n_ff_exp;
  c.moe_gating = {};
  c.moe_gating.normalize = f.get_bool(k.k("expert_weights_norm")).value_or(false);
  const float scale = k.opt_float("expert_weights_scale", 0.0);
  c.moe_gating.scale = scale == 0.0f ? 1.0f : scale;
  // llama.cpp's llama_expert_gating_func_type: 0 none, 1 softmax, 2 sigmoid.
  const int32_t func = k.opt_int("expert_gating_func", 0, 0, 1 << 16);
  if (func == 0 || func == 1) c.moe_gating.func = MoeGating::Func::kSoftmax;
  else if (func == 2) c.moe_gating.func = MoeGating::Func::kSigmoid;
  else
    fail(ErrorKind::kUnsupported, "{}: '{}' = {} is not supported (1: softmax, 2: sigmoid)", f.path(),
         k.k("expert_gating_func"), func);
  // Grouped routing (DeepSeek-V2/V3's top groups first) is not implemented;
  // one group, as V2-Lite has, is plain top-k.
  const int32_t groups = k.opt_int("expert_group_count", 0, 0, c.n_expert);
  const int32_t groups_used = k.opt_int("expert_group_used_count", 0, 0, c.n_expert);
  if (groups > 1)
    fail(ErrorKind::kUnsupported,
         "{}: grouped expert routing ('{}' = {}, '{}' = {}) is not supported; only files with one expert group load",
         f.path(), k.k("expert_group_count"), groups, k.k("expert_group_used_count"), groups_used);
}

// The experts' counts and widths, and the router's gating as llama.cpp's
// build_moe_ffn runs it for the family: softmax, then top-k; qwen3moe and
// Mixtral (llama with experts) renormalise the k weights, qwen2moe does not
// (its shared expert comes with a sigmoid gate, found by its tensors);
// deepseek2 reads its own keys.
void read_moe(const GgufFile& f, ModelConfig& c, const Keys& k) {
  const bool moe_arch = c.arch == Arch::kQwen2Moe || c.arch == Arch::kQwen3Moe || c.arch == Arch::kGptOss;
  c.n_expert = k.opt_int("expert_count", 0, 0, 1 << 16);
  if (moe_arch && c.n_expert == 0) k.req_int("expert_count", 1, 1 << 16);  // names the missing key
  if (c.n_expert > 0) c.n_expert_used = k.req_int("expert_used_count", 1, c.n_expert);
  if (c.arch == Arch::kDeepseek2) return read_deepseek2_experts(f, k, c);
  if (c.n_expert == 0) return;
  // Mixtral's experts are feed_forward_length wide; the Qwen MoE files say so apart.
  c.n_ff_exp = moe_arch ? k.req_int("expert_feed_forward_length", 1, 1 << 20) : c.n_ff;
  c.n_ff_shexp = k.opt_int("expert_shared_feed_forward_length", 0, 0, 1 << 20);
  c.moe_gating = {};
  c.moe_gating.normalize = c.arch != Arch::kQwen2Moe && c.arch != Arch::kGptOss;
  // gpt-oss: the k largest router logits, then a softmax over those k
  // (llama.cpp's LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX_WEIGHT), no renormalising.
  if (c.arch == Arch::kGptOss) c.moe_gating.func = MoeGating::Func::kSoftmaxTopK;
}

}  // namespace

ModelConfig ModelConfig::from_gguf(const GgufFile& f) {
  ModelConfig c;
  auto arch = f.get_string("general.architecture");
  if (!arch) fail(ErrorKind::kInvalidFile, "{}: missing 'general.architecture'", f.path());
  c.arch_name = *arch;
  if (*arch == "llama") c.arch = Arch::kLlama;
  else if (*arch == "qwen2") c.arch = Arch::kQwen2;
  else if (*arch == "qwen3") c.arch = Arch::kQwen3;
  else if (*arch == "gemma3") c.arch = Arch::kGemma3;
  else if (*arch == "deepseek2") c.arch = Arch::kDeepseek2;
  else if (*arch == "qwen2moe") c.arch = Arch::kQwen2Moe;
  else if (*arch == "qwen3moe") c.arch = Arch::kQwen3Moe;
  else if (*arch == "gpt-oss") c.arch = Arch::kGptOss;
  else
    fail(ErrorKind::kUnsupported,
         "{}: architecture '{}' is not supported (supported: llama, qwen2, qwen3, gemma3, deepseek2, qwen2moe, "
         "qwen3moe, gpt-oss)",
         f.path(), *arch);
  c.name = f.get_string("general.name").value_or(*arch);

  Keys k{f, *arch};
  constexpr int64_t kBig = 1 << 20;
  c.n_embd = k.req_int("embedding_length", 1, kBig);
  c.n_layer = k.req_int("block_count", 1, 1024);
  c.n_head = k.req_int("attention.head_count", 1, 4096);
  c.n_head_kv = k.opt_int("attention.head_count_kv", c.n_head, 1, c.n_head);
  if (c.n_head % c.n_head_kv != 0)
    fail(ErrorKind::kInvalidFile, "{}: head_count {} is not a multiple of head_count_kv {}", f.path(), c.n_head,
         c.n_head_kv);
  c.n_ff = k.req_int("feed_forward_length", 1, kBig);
  c.n_ctx_train = k.opt_int("context_length", 2048, 1, 1 << 24);
  c.head_dim = k.opt_int("attention.key_length", c.n_embd / c.n_head, 1, 4096);
  c.head_dim_v = k.opt_int("attention.value_length", c.head_dim, 1, 4096);
  if (c.head_dim % 2 != 0) fail(ErrorKind::kInvalidFile, "{}: head dimension {} is odd", f.path(), c.head_dim);
  c.rms_eps = k.opt_float("attention.layer_norm_rms_epsilon", 1e-5);
  c.rope_dims = k.opt_int("rope.dimension_count", c.head_dim, 2, c.head_dim);
  c.rope_base = k.opt_float("rope.freq_base", 10000.0);

  // Linear position scaling (rope.scaling.type = linear). Llama 3's
  // frequency-dependent scaling comes as a rope_freqs tensor instead.
  auto scaling = f.get_string(k.k("rope.scaling.type"));
  if (scaling && *scaling == "linear") {
    float factor = k.opt_float("rope.scaling.factor", 1.0);
    if (factor <= 0) fail(ErrorKind::kInvalidFile, "{}: rope.scaling.factor {} <= 0", f.path(), factor);
    c.rope_scale = 1.0f / factor;
  } else if (scaling && *scaling == "yarn" && (c.arch == Arch::kDeepseek2 || c.arch == Arch::kGptOss)) {
    read_yarn(f, k, c);
  } else if (scaling && *scaling != "none" && !scaling->empty()) {
    fail(ErrorKind::kUnsupported, "{}: rope scaling type '{}' is not supported", f.path(), *scaling);
  }
  c.rope_base_swa = c.rope_base;
  c.rope_scale_swa = c.rope_scale;
  c.layer_is_swa.assign(c.n_layer, false);

  switch (c.arch) {
    case Arch::kLlama:
      c.rope_style = RopeStyle::kNormal;
      break;
    case Arch::kQwen2:
    case Arch::kQwen2Moe:
      c.rope_style = RopeStyle::kNeox;
      c.qkv_bias = true;
      break;
    case Arch::kQwen3:
    case Arch::kQwen3Moe:
      c.rope_style = RopeStyle::kNeox;
      c.qk_norm = true;
      break;
    case Arch::kGemma3: {
      c.rope_style = RopeStyle::kNeox;
      c.qk_norm = true;
      c.sandwich_norm = true;
      c.act = Activation::kGeluTanh;
      c.embed_scale = std::sqrt(static_cast<float>(c.n_embd));
      // Five sliding-window layers, then one global layer; local layers use
      // their own rope base and no scaling (as Gemma 3 was trained).
      c.sliding_window = k.opt_int("attention.sliding_window", 4096, 1, 1 << 24);
      int32_t pattern = k.opt_int("attention.sliding_window_pattern", 6, 1, 1024);
      for (int32_t il = 0; il < c.n_layer; ++il) c.layer_is_swa[il] = (il % pattern) < pattern - 1;
      c.rope_base_swa = k.opt_float("rope.freq_base_swa", 10000.0);
      c.rope_scale_swa = 1.0f;
      break;
    }
    case Arch::kDeepseek2:
      read_latent_attention(f, k, c);
      break;
    case Arch::kGptOss: {
      // As llama.cpp 0.3.36 reads gpt-oss: NEOX rope, biased q/k/v/o,
      // attention sinks, the clamped SwiGLU in the experts; every other layer
      // (0, 2, 4, ...) attends over a sliding window (its SWA pattern 2), the
      // window from the file (the key is required there too).
      c.rope_style = RopeStyle::kNeox;
      c.qkv_bias = true;
      c.attn_out_bias = true;
      c.attn_sinks = true;
      c.act = Activation::kSwigluOai;
      c.sliding_window = k.req_int("attention.sliding_window", 1, 1 << 24);
      for (int32_t il = 0; il < c.n_layer; ++il) c.layer_is_swa[il] = il % 2 == 0;
      break;
    }
  }
  read_moe(f, c, k);
  // Gemma 3 27B scales queries by 1/sqrt(n_embd/n_head); the others by 1/sqrt(head_dim).
  c.attn_scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  if (c.rope_yarn) c.attn_scale = c.yarn_attn_mscale * c.yarn_attn_mscale / std::sqrt(static_cast<float>(c.head_dim));
  if (c.arch == Arch::kGemma3 && c.n_layer == 62)
    c.attn_scale = 1.0f / std::sqrt(static_cast<float>(c.n_embd / c.n_head));
  return c;
}

std::string ModelConfig::summary() const {
  std::string s = fmt::format("{} ({}): {} layers, {} wide, {} heads ({} kv, dim {}), ffn {}, vocab {}, ctx {}", name,
                              tandem::arch_name(arch), n_layer, n_embd, n_head, n_head_kv, head_dim, n_ff, n_vocab,
                              n_ctx_train);
  if (n_expert > 0) {
    s += fmt::format(", {} experts ({} used, ffn {})", n_expert, n_expert_used, n_ff_exp);
    if (n_ff_shexp > 0) s += fmt::format(" + shared expert (ffn {})", n_ff_shexp);
  }
  return s;
}

}  // namespace tandem

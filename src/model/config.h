// Hyperparameters of a decoder-only transformer, read from GGUF metadata.
// One struct covers every supported family; the family-specific switches
// (QKV bias, QK-norm, sandwich norms, sliding windows...) are plain fields so
// the forward pass reads as one algorithm with a few branches.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/ops.h"

namespace tandem {

class GgufFile;

enum class Arch { kLlama, kQwen2, kQwen3, kGemma3, kDeepseek2, kQwen2Moe, kQwen3Moe, kGptOss };

// How a mixture-of-experts router turns its logits into the weights of the
// experts it picks (model/moe_ffn.h runs it). The families differ only here.
struct MoeGating {
  enum class Func : uint8_t {
    kSoftmax,        // p = softmax(logits); top-k of p; weights p[top-k]
    kSigmoid,        // p = sigmoid(logits); top-k of p (+ selection bias); weights p[top-k]
    kSoftmaxTopK,    // top-k of the logits, then softmax over those k (gpt-oss)
  };
  Func func = Func::kSoftmax;
  bool normalize = false;   // weights /= their sum (qwen3moe, Mixtral), the sum clamped as llama.cpp does
  float scale = 1.0f;       // weights *= scale after normalising (deepseek2's routed scaling factor)
};

struct ModelConfig {
  Arch arch = Arch::kLlama;
  std::string arch_name;
  std::string name;

  int32_t n_vocab = 0;
  int32_t n_embd = 0;
  int32_t n_layer = 0;
  int32_t n_head = 0;
  int32_t n_head_kv = 0;
  int32_t head_dim = 0;     // key/query width per head
  int32_t head_dim_v = 0;   // value width per head
  int32_t n_ff = 0;
  int32_t n_ctx_train = 0;
  float rms_eps = 1e-5f;

  RopeStyle rope_style = RopeStyle::kNormal;
  int32_t rope_dims = 0;          // rotated dims per head (<= head_dim)
  float rope_base = 10000.0f;     // global layers
  float rope_scale = 1.0f;        // position multiplier (1/linear factor)
  // YaRN (deepseek2, gpt-oss): rope_scale is 1/factor; the ramp's pair range; the
  // factor the rotated parts' magnitude is multiplied by (ggml's mscale).
  bool rope_yarn = false;
  float yarn_low = 0.0f, yarn_high = 0.0f;
  float rope_mscale = 1.0f;
  float yarn_attn_mscale = 1.0f;  // the softmax scale is its square / sqrt(head_dim)
  float rope_base_swa = 10000.0f; // sliding-window layers (gemma3)
  float rope_scale_swa = 1.0f;

  int32_t sliding_window = 0;     // 0: none
  std::vector<bool> layer_is_swa; // per layer

  Activation act = Activation::kSilu;
  float embed_scale = 1.0f;       // gemma multiplies embeddings by sqrt(n_embd)
  float attn_scale = 0.0f;        // multiplier on QK^T
  bool qkv_bias = false;          // qwen2
  bool qk_norm = false;           // qwen3, gemma3
  bool sandwich_norm = false;     // gemma3: norms after attention and FFN too
  // gpt-oss: attn_output.bias, and one learned logit per query head
  // (attn_sinks) that joins each softmax's denominator, never its numerator.
  bool attn_out_bias = false;
  bool attn_sinks = false;

  // Multi-head latent attention (deepseek2): > 0 turns it on. Each token's
  // keys and values are one kv_lora_rank-wide latent plus rope_dims rotated
  // values shared by every head; head_dim (key_length_mla) is the per-head
  // query width, its first head_dim - rope_dims unrotated, and head_dim_v
  // (value_length_mla) the per-head value width after the up-projection.
  int32_t kv_lora_rank = 0;
  int32_t q_lora_rank = 0;        // > 0: queries through attn_q_a / attn_q_b
  bool kv_b_fused = false;        // the file has attn_kv_b instead of attn_k_b / attn_v_b
  bool latent_attention() const { return kv_lora_rank > 0; }
  // Mixture of experts (0 experts: every layer dense). With experts, every
  // layer from n_layer_dense_lead on is MoE and must have its router.
  int32_t n_expert = 0;
  int32_t n_layer_dense_lead = 0;  // leading dense layers (deepseek2's leading_dense_block_count)
  int32_t n_expert_used = 0;      // top-k
  int32_t n_ff_exp = 0;           // one expert's hidden width
  int32_t n_ff_shexp = 0;         // the shared expert's (qwen2moe), 0: none
  MoeGating moe_gating;

  // Builds and validates the config. Throws tandem::Error naming the key.
  static ModelConfig from_gguf(const GgufFile& f);
  std::string summary() const;
};

const char* arch_name(Arch a);

}  // namespace tandem

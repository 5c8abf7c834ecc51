// Binds a model's tensors, by GGUF name, to the layer structure the forward
// pass walks. Weights stay in the mapped file in their stored format.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "quant/tensor.h"
#include "model/config.h"

namespace tandem {

class GgufFile;

// A 1-D float vector (norm weights, biases), converted to f32 at load.
using WeightVector = std::vector<float>;

// A mixture-of-experts feed-forward block (model/moe_ffn.h). The expert
// tensors are 3-D in the file (one matrix per expert, contiguous); each
// expert is bound as its own 2-D view of its slice, so products read only the
// experts a row picked.
struct MoeWeights {
  WeightMatrix router;                        // ffn_gate_inp: n_expert rows of n_embd
  WeightVector router_bias;                   // added to the router's logits (gpt-oss), may be empty
  WeightVector select_bias;                   // added for the top-k choice only (deepseek's exp_probs_b), may be empty
  std::vector<WeightMatrix> gate, up, down;   // per expert: ffn_{gate,up,down}_exps slices
  WeightVector gate_bias, up_bias, down_bias; // per-expert biases, expert-major (gpt-oss), may be empty
  WeightMatrix sh_gate, sh_up, sh_down;       // the shared expert (qwen2moe, deepseek2), may be absent
  WeightMatrix sh_gate_inp;                   // ffn_gate_inp_shexp: one row of n_embd, its sigmoid gates the shared expert
  explicit operator bool() const { return static_cast<bool>(router); }
  // Every expert's and the shared expert's matrices (the router apart).
  std::vector<WeightMatrix*> matrices();
  std::vector<const WeightMatrix*> matrices() const;
};

struct LayerWeights {
  WeightVector attn_norm;
  WeightMatrix wq, wk, wv, wo;
  WeightVector bq, bk, bv;          // qwen2, gpt-oss
  WeightVector bo;                  // gpt-oss: attn_output.bias
  WeightVector sinks;               // gpt-oss: attn_sinks, one logit per query head
  WeightVector q_norm, k_norm;      // qwen3, gemma3 (per head, head_dim wide)
  WeightVector post_attn_norm;      // gemma3
  WeightVector ffn_norm;            // gpt-oss: post_attention_norm (its FFN input norm)
  WeightMatrix w_gate, w_up, w_down;
  WeightVector post_ffn_norm;       // gemma3
  MoeWeights moe;                   // set on a mixture-of-experts layer (w_gate/up/down then absent)

  // Latent attention (deepseek2): wq is attn_q, or attn_q_b after attn_q_a
  // and its norm; wk is attn_kv_a_mqa (the latent, then the rope part).
  // k_b and v_b are the per-head up-projections, one head's rows after
  // another ([kv_lora_rank x qk_nope] and [head_dim_v x kv_lora_rank] each),
  // read per head in the file's rows and never repacked.
  WeightMatrix wq_a;
  WeightVector q_a_norm, kv_a_norm;
  WeightMatrix k_b, v_b;
  std::vector<float> k_b_owned;     // k_b transposed out of a fused attn_kv_b, f32
  // Head h's value up-projection is v_b's rows [h * v_b_pitch + v_b_offset,
  // + head_dim_v): attn_v_b's heads follow each other, attn_kv_b's
  // interleave each head's key rows with its value rows.
  int64_t v_b_pitch = 0, v_b_offset = 0;

  // The linear layers, in forward order (empty ones have no rows).
  std::array<WeightMatrix*, 8> matrices() { return {&wq_a, &wq, &wk, &wv, &wo, &w_gate, &w_up, &w_down}; }
  std::array<const WeightMatrix*, 8> matrices() const { return {&wq_a, &wq, &wk, &wv, &wo, &w_gate, &w_up, &w_down}; }
};

struct ModelWeights {
  WeightMatrix tok_embd;            // [n_vocab rows of n_embd]
  WeightVector output_norm;
  WeightMatrix output;              // tied to tok_embd when the file has no output.weight
  WeightVector rope_freqs;          // llama 3 frequency factors (rope_dims/2), may be empty
  std::vector<LayerWeights> layers;

  // Finds every tensor the config needs and checks its type and shape;
  // sets cfg.n_vocab. Throws tandem::Error naming a missing or misshapen tensor.
  static ModelWeights bind(const GgufFile& f, ModelConfig& cfg);
};

}  // namespace tandem

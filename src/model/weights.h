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

struct LayerWeights {
  WeightVector attn_norm;
  WeightMatrix wq, wk, wv, wo;
  WeightVector bq, bk, bv;          // qwen2
  WeightVector q_norm, k_norm;      // qwen3, gemma3 (per head, head_dim wide)
  WeightVector post_attn_norm;      // gemma3
  WeightVector ffn_norm;
  WeightMatrix w_gate, w_up, w_down;
  WeightVector post_ffn_norm;       // gemma3

  // The seven linear layers, in forward order.
  std::array<WeightMatrix*, 7> matrices() { return {&wq, &wk, &wv, &wo, &w_gate, &w_up, &w_down}; }
  std::array<const WeightMatrix*, 7> matrices() const { return {&wq, &wk, &wv, &wo, &w_gate, &w_up, &w_down}; }
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

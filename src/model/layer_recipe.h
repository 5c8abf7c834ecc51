// One decoder layer, step by step: the order every runner follows (the CPU
// runner's Model::forward, the CUDA runner's pass in src/cuda/). A runner
// says how each step runs on its device; the sequence is written here once.
//
// Every supported architecture (llama, qwen2, qwen3, gemma3) is this layer;
// the config switches a step's parts on or off (biases, Q/K norms, the
// sandwich norms, the activation).
#pragma once

#include <cstdint>

namespace tandem {

// Steps provides the five steps over the rows in flight: x (the residual
// stream, one row per batch row), xn (its normed copy), o (a block's output).
template <typename Steps>
void decoder_layer(Steps& s, int32_t il) {
  // xn = RMS norm of x (attn_norm).
  s.attention_norm(il);
  // q, k, v = xn Wq, Wk, Wv; their biases; the Q and K norms; rope, the
  // query scale; K and V written to the cache at each row's position;
  // attention over the sequence's cache; o = its output Wo.
  s.attention(il);
  // o through post_attn_norm (sandwich norms); x += o; xn = ffn_norm of x.
  s.attention_residual(il);
  // o = (act(xn W_gate) * xn W_up) W_down.
  s.feed_forward(il);
  // o through post_ffn_norm (sandwich norms); x += o.
  s.ffn_residual(il);
}

}  // namespace tandem

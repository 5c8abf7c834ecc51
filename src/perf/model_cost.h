// What one forward pass of a model costs in bytes and arithmetic, the
// numerators of the roofline.
//
// Counted: the weight matrices of every linear layer (q, k, v, o, gate, up,
// down of each layer) and the output matrix, at their stored size. Not
// counted: the embedding row lookup (one row per token), norm vectors and the
// KV cache (reported separately), which are small next to the weights at the
// context lengths benchmarked.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "quant/ggml_type.h"

namespace tandem {

class Model;

// The instruction family a weight type's dot products run on.
enum class ComputeFamily { kFp32, kInt8, kBf16 };
const char* compute_family_name(ComputeFamily f);
// int8 for the block-quantized formats (they dot against int8 activations),
// bf16 for bf16, fp32 for f32 and f16 (widened to f32).
ComputeFamily compute_family(GgmlType t);

struct ModelCost {
  uint64_t decode_weight_bytes = 0;  // linear layers + output matrix, read once per decode step
  uint64_t layer_macs_per_token = 0; // multiply-adds of the linear layers (all layers) for one row
  uint64_t output_macs = 0;          // the output matrix for one row
  // The last layer's attention output and feed-forward for one row: a
  // prefill runs them for the rows that want logits only (Model::forward).
  uint64_t last_layer_tail_macs = 0;
  std::map<std::string, uint64_t> bytes_by_type;  // of decode_weight_bytes, by type name
  GgmlType main_type = GgmlType::F32;     // the type holding the most of those bytes
  GgmlType prefill_type = GgmlType::F32;  // the type doing the most layer multiply-adds
  ComputeFamily family = ComputeFamily::kFp32;  // of prefill_type: the prefill ceiling
  std::string file_type;  // general.file_type as llama.cpp names it ("q4_k_m"), "" when absent

  // Attention shape, for its share of the arithmetic and the KV reads.
  int32_t n_layer = 0, n_head = 0, n_head_kv = 0, head_dim = 0, head_dim_v = 0;
  int32_t sliding_window = 0;
  int32_t n_swa_layers = 0;

  // Multiply-adds of QK^T and PV for queries at positions [start, start+n),
  // each over its causal (and, on sliding-window layers, windowed) prefix.
  uint64_t attention_macs(int64_t start, int64_t n) const;
  // A P-token prefill from position 0: the linear layers for all P rows but
  // the last layer's tail (the last row only), the output matrix for the last
  // row only (the only logits computed), attention.
  uint64_t prefill_macs(int64_t P) const;
  // K and V bytes that decode steps at positions [start, start+n) read (each
  // step reads all cached positions it attends to), per step on average, for
  // a cache of K and V elements of k_bytes and v_bytes each (q8_0: 34 / 32).
  double kv_read_bytes_per_step(int64_t start, int64_t n, double k_bytes, double v_bytes) const;
};

ModelCost model_cost(const Model& m);

// llama.cpp's name for a general.file_type value ("q4_k_m"); "ftype N" for others.
std::string file_type_name(int64_t ftype);

}  // namespace tandem

// A layer's multi-head latent attention (deepseek2) on the CPU: the rows'
// buffers, and the step itself as Model::latent_attention_rows
// (latent_attention.cpp). The cache holds, per token and layer, the normed
// latent (as V) and the rotated shared key part (as K): kv_lora_rank +
// rope_dims values instead of n_head x (head_dim + head_dim_v).
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/matmul.h"

namespace tandem {

struct LatentScratch {
  std::vector<float> q_a, q, kva, qcat, lat, rope_cos, rope_sin;
  Matmul mm;
  LatentScratch(KernelLevel level, const StreamTuning& tuning) : mm(level, tuning) {}
};

}  // namespace tandem

// Attention over a latent cache (multi-head latent attention, deepseek2).
//
// Each cached position holds one latent vector (`latent` wide, in the
// cache's V part) and one rotated vector (`rope` wide, in its K part, one KV
// head), shared by every query head. The model absorbs each head's key
// up-projection into its query, so a head's query is `latent + rope` wide
// (latent part first) and scores q . [latent, rope] directly; its output is
// the softmax-weighted sum of the latents (`latent` wide), which the model
// then multiplies by the head's value up-projection. Multi-query attention
// over 576-wide keys with the 512-wide latent as values, for V2-Lite's shape.
//
// A query's result depends only on its own row and the cache: positions are
// taken in blocks at fixed absolute boundaries, heads one at a time, so the
// same token gives the same bits in prefill or decode, in any batch, on any
// thread count.
#pragma once

#include <cstdint>

#include "kernels/attention_kv.h"

namespace tandem {

class ThreadPool;

struct LatentShape {
  int32_t n_head = 0;
  int32_t latent = 0;  // kv_lora_rank
  int32_t rope = 0;    // rope dims of the shared key part
};

// n queries of one sequence at positions pos0 .. pos0+n-1, each attending to
// positions [0, its own]: row r's head h is q[r * q_stride + h * (latent + rope)]
// (already scaled), its output out[r * out_stride + h * latent]. Positions up
// to pos0+n-1 must be written. Throws kInvalidArgument for a view whose widths
// are not the shape's.
void latent_attention(const LatentShape& s, const KvLayerView& kv, const float* q, int64_t q_stride, int32_t pos0,
                      int32_t n, float* out, int64_t out_stride, ThreadPool& pool);

// The same, one query at a time in double precision with a plain two-pass
// softmax: the reference the kernel is tested against.
void latent_attention_ref(const LatentShape& s, const KvLayerView& kv, const float* q, int64_t q_stride, int32_t pos0,
                          int32_t n, float* out, int64_t out_stride);

// Position pos's latent and rope parts as f32, as attention reads them.
void latent_read(const KvLayerView& kv, int32_t pos, float* latent, float* rope);

}  // namespace tandem

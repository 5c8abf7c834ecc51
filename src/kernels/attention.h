// Scaled dot-product attention over a block-paged KV cache.
//
// Prefill: a chunk of consecutive queries of one sequence, each attending to
// the cached past plus its own causal prefix of the chunk (the N x N
// triangle). Decode: one query per sequence over everything cached. Both call
// the same per-query routine, so a token's attention output is bit-identical
// whichever phase computed it; the phases differ in how the work is spread.
#pragma once

#include <cstddef>
#include <cstdint>

namespace tandem {

class ThreadPool;

// Where one layer's K/V for one sequence live.
struct KvLayerView {
  const float* keys = nullptr;    // layer base: [block][slot][k_width]
  const float* values = nullptr;  // layer base: [block][slot][v_width]
  int32_t block_size = 0;
  int32_t k_width = 0, v_width = 0;
  const int32_t* blocks = nullptr;  // the sequence's block table
  const float* key(int32_t pos) const {
    return keys + (size_t(blocks[pos / block_size]) * block_size + pos % block_size) * k_width;
  }
  const float* value(int32_t pos) const {
    return values + (size_t(blocks[pos / block_size]) * block_size + pos % block_size) * v_width;
  }
};

struct AttnShape {
  int32_t n_head = 0, n_head_kv = 0, head_dim = 0, head_dim_v = 0;
  int32_t window = 0;  // > 0: a query at p sees only positions > p - window
};

// A chunk of n queries of one sequence at positions pos0 .. pos0+n-1.
void attention_prefill(const AttnShape& s, const KvLayerView& kv, const float* q, int64_t q_stride, int32_t pos0,
                       int32_t n, float* out, int64_t out_stride, ThreadPool& pool);

}  // namespace tandem

namespace tandem {

// Decode: one query per sequence (B sequences), query b at positions[b] over
// views[b]. Work is spread over (sequence, head) pairs.
void attention_decode(const AttnShape& s, const KvLayerView* views, const int32_t* positions, int32_t n_seqs,
                      const float* q, int64_t q_stride, float* out, int64_t out_stride, ThreadPool& pool);

}  // namespace tandem

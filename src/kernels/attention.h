// Scaled dot-product attention over a block-paged KV cache, fused: scores
// never exist beyond one chunk of keys at a time (flash-attention style), in
// both phases.
//
// Prefill: a chunk of consecutive queries of one sequence, each attending to
// the cached past plus its own causal prefix. Decode: one query per sequence
// over everything cached, split across threads along the KV length.
//
// Bit-identity between the phases: a query at position p attends to
// [first(p), p]; that range is cut at fixed absolute boundaries, multiples of
// kAttnChunk. For each piece, a per-level kernel computes (max, sum of exps,
// exp-weighted V sum) with an order of operations that depends only on the
// query, the piece, and the K/V rows -- not on which other queries share the
// call. The pieces are then folded in position order by one routine. Prefill
// tiles (many queries x one piece) and decode splits (one query x pieces on
// different threads) are different schedules of that same arithmetic, so a
// token's attention output is the same bits whichever phase, batch, or
// thread count computed it. (Different instruction-set levels round
// differently; the level is fixed per process.)
#pragma once

#include <cstddef>
#include <cstdint>

#include "runtime/cpu_features.h"
#include "kernels/attention_kv.h"

namespace tandem {

class ThreadPool;

// Absolute-position granularity of the split (see above). Also the most keys
// a kernel call scores at once.
inline constexpr int32_t kAttnChunk = 128;

struct AttnShape {
  int32_t n_head = 0, n_head_kv = 0, head_dim = 0, head_dim_v = 0;
  int32_t window = 0;  // > 0: a query at p sees only positions > p - window
  // Attention sinks (gpt-oss), n_head logits or null: head h's softmax
  // denominator gains e^sinks[h], as a key whose value is zero would add. It
  // is folded in once, after a row's last chunk, by the one routine every
  // level and schedule shares; null leaves every result as it was.
  const float* sinks = nullptr;
};

// A chunk of n queries of one sequence at positions pos0 .. pos0+n-1. Query
// rows are already scaled (softmax(q.k) is taken as is). The KV rows of all
// positions up to pos0+n-1 must be written.
void attention_prefill(const AttnShape& s, const KvLayerView& kv, const float* q, int64_t q_stride, int32_t pos0,
                       int32_t n, float* out, int64_t out_stride, ThreadPool& pool, float* mass = nullptr);

// Attention mass (heavy-hitter eviction, engine/llm_engine.cpp): given
// `mass` (one array per sequence in decode), each position's attention
// weight summed over the query rows and heads is added to mass[position],
// in an order fixed by the call's rows alone (not the threads).

// Decode: one query per sequence (B sequences), query b at positions[b] over
// views[b]. Work is spread over (sequence, KV head, chunk) triples, then the
// chunk partials of each head are folded in order.
void attention_decode(const AttnShape& s, const KvLayerView* views, const int32_t* positions, int32_t n_seqs,
                      const float* q, int64_t q_stride, float* out, int64_t out_stride, ThreadPool& pool,
                      float* const* mass = nullptr);

// The same at a given level (which the CPU must support; throws
// kInvalidArgument otherwise). The functions above use active_kernel_level().
void attention_prefill_at(KernelLevel level, const AttnShape& s, const KvLayerView& kv, const float* q,
                          int64_t q_stride, int32_t pos0, int32_t n, float* out, int64_t out_stride, ThreadPool& pool,
                          float* mass = nullptr);
void attention_decode_at(KernelLevel level, const AttnShape& s, const KvLayerView* views, const int32_t* positions,
                         int32_t n_seqs, const float* q, int64_t q_stride, float* out, int64_t out_stride,
                         ThreadPool& pool, float* const* mass = nullptr);

}  // namespace tandem

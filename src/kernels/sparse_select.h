// Sparse attention's block selection (Quest, docs/kv-cache.md): which blocks
// of a sequence a decode row attends to, per KV head, given the per-block key
// bounds (kv/key_bounds.h).
//
// A row at position p (block cur = p / block_size) always reads the sink
// blocks [0, sinks / bs) and the window [cur - window / bs + 1, cur]; of the
// blocks between, the ones ranked highest fill the rest of the budget. The
// bound of one query head over a block is
//   sum_c max(q_c * min_c, q_c * max_c)  >=  q.k for every key of the block.
// A KV head ranks a block by the largest bound over its group of query heads
// (a block is read if any head of the group could weigh it); ties go to the
// earlier block. (Each head's bound less its highest over the candidates, and
// the sum over the heads, chose worse on Gemma 3 270M: docs/benchmarks.md.)
// The selected blocks, in position order, form a table of their own per head,
// and the row attends to it as a sequence of budget / bs blocks at the same
// offset in its last block: the same kernels and the same online softmax over
// fewer blocks (attention_decode with KvLayerView's per-head tables).
#pragma once

#include <cstddef>
#include <cstdint>

#include "runtime/cpu_features.h"
#include "runtime/options.h"

namespace tandem {

// Blocks of each head's table for a row at `pos`, or 0 when every block
// fits the budget (the row reads its sequence's table as it is: dense).
int32_t sparse_table_blocks(const SparseAttention& o, int32_t pos, int32_t block_size);

// The bound of q.k over each of n blocks, the largest over n_q query heads
// (rows q_stride floats apart, dim channels): scores[i] for block blocks[i],
// whose f16 minima are at bounds + blocks[i] * stride and maxima dim values
// on (kv/key_bounds.h). A head's bound that is not a number (an infinite
// bound times a zero channel) counts as +inf: the block could weigh anything.
// The vector kernel reads a block's bounds once for all the group's heads and
// reduces their sums together.
void block_bound_scores(KernelLevel level, const float* q, int32_t n_q, int64_t q_stride, int32_t dim,
                        const uint16_t* bounds, size_t stride, const int32_t* blocks, int32_t n, float* scores);
// The reference: the channels summed in order, one product at a time.
void block_bound_scores_ref(const float* q, int32_t n_q, int64_t q_stride, int32_t dim, const uint16_t* bounds,
                            size_t stride, const int32_t* blocks, int32_t n, float* scores);

// One KV head's table for a row at `pos` (sparse_table_blocks(...) = n_table
// > 0 blocks): sinks, the top-scoring blocks between, the window, from the
// sequence's table `seq_table`. `scratch` holds at least pos / block_size
// floats and as many ints.
void select_blocks(KernelLevel level, const SparseAttention& o, int32_t pos, int32_t block_size,
                   const int32_t* seq_table, const float* q, int32_t n_q, int64_t q_stride, int32_t dim,
                   const uint16_t* bounds, size_t stride, float* score_scratch, int32_t* index_scratch,
                   int32_t* table);

}  // namespace tandem

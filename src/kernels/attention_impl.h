// Internals of the attention kernels, shared by the levels' files and exposed
// for tests.
#pragma once

#include <cstdint>

#include "kernels/attention.h"
#include "kernels/vec_dot_impl.h"

namespace tandem {

namespace attn_detail {

// A query row as the integer Q.K of quantized keys reads it: per group of
// kKvGroup dimensions a scale d and the values round(x / d) in [-127, 127]
// (llama.cpp's q8_0 activations, with ties to even), and the sum of those
// values (what the unsigned operand's offset costs, attention_chunk.h).
struct QuantizedQuery {
  const int8_t* q = nullptr;   // head_dim values
  const float* d = nullptr;    // head_dim / kKvGroup scales
  const int32_t* sum = nullptr;
};

// The one quantizer of query rows, shared by every level and the tests:
// head_dim (a multiple of kKvGroup) floats of x into q, d and sum.
void quantize_query(const float* x, int32_t head_dim, int8_t* q, float* d, int32_t* sum);

// Positions per scale of the softmax weights quantized against quantized
// values (attention_chunk.h, quantize_weights), aligned to the chunk.
inline constexpr int32_t kWeightRun = 32;
static_assert(kAttnChunk % kWeightRun == 0);
// A run whose largest weight times value scale is below this adds nothing
// (127 / max would overflow near FLT_MIN; the chunk's largest weight is 1,
// so such weights are far below a float sum's resolution).
inline constexpr float kMinRunWeight = 1e-30f;

// One kernel call: some query rows of one KV head against the keys of one
// chunk [c0, c0 + kAttnChunk). Row r attends to positions [lo[r], hi[r]),
// a non-empty range inside the chunk. For each row the kernel produces
//   m[r]   = max of the scores,
//   l[r]   = sum of exp(score - m[r]),
//   acc[r] = sum of exp(score - m[r]) * v   (head_dim_v floats),
// each computed in an order fixed by (row's query, lo, hi, c0, K/V) alone.
struct ChunkJob {
  const KvLayerView* kv = nullptr;
  int32_t kv_head = 0, head_dim = 0, head_dim_v = 0;
  int32_t c0 = 0;
  int32_t n_rows = 0;
  const float* const* q = nullptr;  // [n_rows] query rows
  const QuantizedQuery* qq = nullptr;  // [n_rows] the same, quantized (keys of a quantized type)
  const int32_t* lo = nullptr;
  const int32_t* hi = nullptr;
  float* scores = nullptr;          // scratch, n_rows * kAttnChunk floats
  float* m = nullptr;
  float* l = nullptr;
  float* acc = nullptr;             // [n_rows][head_dim_v]
  int32_t next_hi = 0;  // the next call reads positions [c0 + kAttnChunk, next_hi): worth prefetching
  bool warm = false;    // the previous call prefetched this one's positions
};
using ChunkFn = void (*)(const ChunkJob& job);

// The element a view's pointers address for each type (attention_kv.h).
template <KvType t> struct KvElem;
template <> struct KvElem<KvType::kF32> { using type = float; };
template <> struct KvElem<KvType::kF16> { using type = uint16_t; };
template <> struct KvElem<KvType::kQ8_0> { using type = int8_t; };
template <> struct KvElem<KvType::kQ4_0> { using type = uint8_t; };
template <KvType t> using kv_elem_t = typename KvElem<t>::type;


}  // namespace attn_detail
}  // namespace tandem

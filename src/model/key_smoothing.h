// The key smoothing a q4_0 key cache stores its keys through
// (KvCache::set_key_smoothing, KvFormat::smooth_k): an offset mu and a scale
// s per layer and key element, keys stored as (k - mu) * s, queries / s.
//
// Both are exact in arithmetic: q / s . (k - mu) * s = q.k - q.mu, the same
// shift for every key a query reads, which the softmax cancels. Both must be
// the same for every key of every sequence (prefix blocks are shared), so
// they are measured once at start-up, on a built-in paragraph run through
// the model into a plain cache.
//
// mu, centering: keys share a large part. On Gemma 3 270M's global layers
// the mean key carries two thirds of a key's energy and sets the scale of
// every 4-bit group. RoPE turns a key with its position, so only the pairs
// of elements that turn by at most pi/3 over max_positions keep their mean
// (turned to the middle of the context); the others get zero. A key beyond
// max_positions (a streaming window runs on) is attended as exactly as any
// other, only less well centered.
//
// s, scaling (SmoothAttention, QServe): a key element's quantization error
// costs in proportion to the query elements it meets, so s = (E q^2 /
// E (k - mu)^2)^(1/4) per element, which minimizes the expected score error
// for a fixed error per stored element; both energies are averaged over each
// RoPE pair (a pair's energy does not change as it turns), so s does not
// depend on positions.
#pragma once

#include <cstdint>

#include "kv/kv_cache.h"

namespace tandem {

class Model;
class ThreadPool;

// n_layer x k_width offsets and scales (the model's KvShape).
KeySmoothing key_smoothing(Model& model, ThreadPool& pool, int32_t max_positions);

}  // namespace tandem

// The offsets a centered KV cache subtracts from every key
// (KvCache::set_key_offsets, KvFormat::center_k).
//
// Keys share a large common part: on Gemma 3 270M's global layers the mean
// key carries two thirds of a key's energy, and that part sets the scale of
// every 4-bit group. Subtracting one vector from all the keys a query sees
// moves each of its scores by the same q.mu, which the softmax cancels, so
// the vector may be anything that is the same for every key: one per layer
// and head, measured once at start-up on a built-in text (prefix blocks are
// shared between sequences, so it cannot depend on one).
//
// RoPE turns a key with its position, so only the part of the mean that
// turns little over the context is kept: each pair of elements that turns
// by at most pi/3 over max_positions, turned to the middle of the context.
// The other pairs' offsets are zero; a key beyond max_positions (a streaming
// window runs on) is attended exactly as ever, only less well centered.
#pragma once

#include <cstdint>
#include <vector>

namespace tandem {

class Model;
class ThreadPool;

// n_layer x k_width floats (the model's KvShape), the keys' mean over the
// built-in text's positions after the first (a sink), in the model's space.
std::vector<float> key_offsets(Model& model, ThreadPool& pool, int32_t max_positions);

}  // namespace tandem

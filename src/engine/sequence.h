// One sequence in the serving engine: a prompt and the tokens generated after
// it, how much of it has K/V in the cache, and its generation state.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/json_grammar.h"
#include "engine/request.h"
#include "engine/sampler.h"
#include "engine/speculation.h"
#include "kv/block_manager.h"
#include "tokenizer/tokenizer.h"

namespace tandem {

enum class SeqStatus { kWaiting, kRunning, kSwapped, kFinished };

// Shared by the choices of one request.
struct RequestState {
  uint64_t id = 0;
  RequestParams params;
  EventSink sink;
  int32_t n_prompt = 0;
  double arrival_s = 0;
  bool cancelled = false;
  int32_t choices_left = 0;
};

struct Sequence {
  uint64_t id = 0;
  std::shared_ptr<RequestState> req;
  int32_t choice = 0;
  SeqStatus status = SeqStatus::kWaiting;
  uint64_t arrival_order = 0;        // FIFO order within a priority; kept across preemption

  std::vector<int32_t> tokens;       // prompt + generated
  int32_t n_prompt = 0;
  int32_t n_cached_prompt = 0;       // prompt tokens that came from the prefix cache
  SeqBlocks blocks;                  // blocks.n_computed: tokens whose K/V is in the cache
  bool fork_pending = false;         // choice 0 of an n > 1 request, until its prompt is done
  // Swapped out (preempted with swap space): the K/V of positions
  // [0, swapped_computed), whole blocks, as KvCache::save_block wrote them.
  std::vector<std::byte> swapped_kv;
  int32_t swapped_computed = 0;

  // Prompt scoring (params.prompt_logprobs >= 0, or on_prompt_row): prompt
  // positions from score_next on still want the logits of the row before
  // them, and no prefix-cache hits. prompt_lp holds the logprobs of positions
  // [0, score_next) (position 0 is NaN).
  int32_t score_next = 0;
  std::vector<TokenLogprob> prompt_lp;
  std::vector<std::vector<TokenLogprob>> prompt_top;

  std::unique_ptr<Sampler> sampler;
  std::unique_ptr<OutputConstraint> json;  // params.json_object, json_schema or tool_calls
  std::unique_ptr<StreamDecoder> decoder;
  std::string text;                  // generated text so far
  size_t emitted = 0;                // bytes of `text` already sent
  double first_token_s = -1;
  double last_token_s = -1;
  // Speculation: the tokens drafted for this step (after the last token), and
  // the sequence's drafting record.
  std::vector<int32_t> draft;
  SpecState spec;
  // A progressive prefill session's logits for this whole prompt: the first
  // token is sampled from them at admission, without a step.
  std::shared_ptr<const std::vector<float>> start_logits;
  double first_step_s = -1;          // when a step first computed its prompt
  double prefill_s = 0;              // forward time of the steps that computed its prompt
  int32_t preemptions = 0;

  int32_t n_generated() const { return static_cast<int32_t>(tokens.size()) - n_prompt; }
  // A streaming window (--kv-window): positions evicted after the sinks, so
  // that position p past them sits in cache slot p - evicted. The keys of
  // the first slots (the sinks, and with --kv-heavy the kept blocks) as first
  // read, [slot][layer][k_width], and the rotation each was read at: each
  // eviction turns the keys before its gap on from these (rounding never
  // accumulates). Heavy hitters: each slot's attention so far.
  int32_t evicted = 0;
  std::vector<float> kept_keys;
  std::vector<int32_t> kept_rotation;
  std::vector<float> attn_mass;

  int32_t n_computed() const { return blocks.n_computed + evicted; }
  int32_t n_uncomputed() const { return static_cast<int32_t>(tokens.size()) - n_computed(); }
  int32_t slot(int32_t pos) const { return pos - evicted; }  // for positions past the sinks
  int32_t priority() const { return req->params.priority; }
  // Whether prompt positions still need their logprobs computed.
  bool wants_prompt_logits() const {
    return (req->params.prompt_logprobs >= 0 || req->params.on_prompt_row) && score_next < n_prompt;
  }
};

}  // namespace tandem

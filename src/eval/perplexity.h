// Perplexity of a text under a model, computed the way llama.cpp's
// llama-perplexity computes it, so that the two numbers compare on the same
// file (the usual check of what a quantization costs): the tokens (BOS first)
// are cut into chunks of n_ctx; each chunk runs alone with BOS in its first
// position, and the tokens of its second half are scored, each by the logits
// of the position before it (the first half is context).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "kv/kv_cache.h"

namespace tandem {

class Model;

struct PerplexityOptions {
  int32_t n_ctx = 512;
  int32_t max_chunks = -1;  // < 0: every whole chunk of the text
  KvCacheTypes kv_cache = {};
  int32_t threads = 0;      // 0: physical cores
  // When set, each chunk also runs with this cache (a second engine on the
  // same model), and the result compares the two token distributions: what
  // a compressed cache costs, as llama-perplexity's --kl-divergence reports.
  std::optional<KvCacheTypes> kl_reference;
};

struct PerplexityResult {
  int32_t n_tokens = 0;  // of the whole text
  int32_t n_chunks = 0;
  int64_t n_scored = 0;
  double nll = 0;        // mean negative log-likelihood of the scored tokens
  double ppl = 0;        // exp(nll)
  double ppl_error = 0;  // one standard error, as llama.cpp reports it
  double seconds = 0;    // forward passes and scoring
  // With a reference cache: its perplexity, the mean KL divergence
  // KL(reference || this) per scored token with one standard error, and the
  // share of tokens whose most likely next token is the same.
  double ref_ppl = 0, kl_mean = 0, kl_error = 0, same_top = 0;
};

// Each chunk is one request to the serving engine (its prompt scored through
// RequestParams::on_prompt_row, no token generated). Throws kInvalidArgument
// when the text has fewer than 2 * n_ctx tokens (as llama.cpp refuses it) or
// n_ctx is outside [4, the model's context]. on_chunk(k, running) after
// chunk k (1-based) with the perplexity so far.
PerplexityResult perplexity(Model& model, const std::vector<int32_t>& tokens, const PerplexityOptions& opts,
                            const std::function<void(int32_t, const PerplexityResult&)>& on_chunk = {});

}  // namespace tandem

#include "eval/perplexity.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "core/error.h"
#include "engine/llm_engine.h"
#include "kernels/ops.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

namespace tandem {
namespace {

constexpr int32_t kBlockSize = 16;

}  // namespace

PerplexityResult perplexity(Model& model, const std::vector<int32_t>& tokens, const PerplexityOptions& opts,
                            const std::function<void(int32_t, const PerplexityResult&)>& on_chunk) {
  const ModelConfig& c = model.config();
  const int32_t n_ctx = opts.n_ctx;
  if (n_ctx < 4 || n_ctx > c.n_ctx_train)
    fail(ErrorKind::kInvalidArgument, "perplexity: context {} is outside [4, {}] (the model's context)", n_ctx,
         c.n_ctx_train);
  PerplexityResult res;
  res.n_tokens = static_cast<int32_t>(tokens.size());
  if (static_cast<int64_t>(tokens.size()) < 2 * int64_t{n_ctx})
    fail(ErrorKind::kInvalidArgument,
         "perplexity: the text has {} tokens; a context of {} needs at least {} (two chunks)", tokens.size(), n_ctx,
         2 * n_ctx);
  const int32_t max_chunks = static_cast<int32_t>(tokens.size() / static_cast<size_t>(n_ctx));
  res.n_chunks = opts.max_chunks < 0 ? max_chunks : std::min(opts.max_chunks, max_chunks);

  // One chunk at a time, each prompt in as few steps as its scored rows allow.
  EngineConfig ec;
  ec.threads = opts.threads;
  ec.max_context = n_ctx;
  ec.kv_tokens = n_ctx + kBlockSize - 1;
  ec.block_size = kBlockSize;
  ec.kv_type = opts.kv_type;
  ec.max_seqs = 1;
  ec.max_waiting = 0;
  ec.policy = SchedulePolicy::kThroughput;
  ec.max_batch_tokens = n_ctx;
  ec.prefix_caching = false;
  Engine engine(model, ec);

  const Tokenizer& tok = model.tokenizer();
  const int32_t nv = c.n_vocab;
  const int32_t first = n_ctx / 2;
  std::vector<double> lp(static_cast<size_t>(n_ctx - 1 - first));  // one chunk's scored log-probabilities
  double sum = 0, sum2 = 0;
  const auto t0 = std::chrono::steady_clock::now();

  for (int32_t k = 0; k < res.n_chunks; ++k) {
    // Position 0 holds BOS whatever the text has there, as in llama.cpp.
    std::vector<int32_t> chunk(tokens.begin() + static_cast<ptrdiff_t>(k) * n_ctx,
                               tokens.begin() + static_cast<ptrdiff_t>(k + 1) * n_ctx);
    if (tok.add_bos() && tok.bos_id() >= 0) chunk[0] = tok.bos_id();
    RequestParams p;
    p.max_tokens = 0;
    p.sampling.temperature = 0;
    // Row p scores chunk[p + 1]; the rows of the first half are context.
    p.rows_from = first;
    p.on_prompt_row = [&](int32_t row, std::span<const float> logits) {
      lp[row - first] = static_cast<double>(logits[chunk[row + 1]]) - static_cast<double>(log_sum_exp(logits.data(), nv));
    };
    const Completion done = engine.run_one(chunk, p);
    if (done.finish_reason == "error") fail(ErrorKind::kResource, "perplexity: {}", done.error);
    for (double v : lp) {  // in order: the sums do not depend on the threads
      sum -= v;
      sum2 += v * v;
    }
    res.n_scored += static_cast<int64_t>(lp.size());
    res.nll = sum / static_cast<double>(res.n_scored);
    res.ppl = std::exp(res.nll);
    res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (on_chunk) on_chunk(k + 1, res);
  }
  // llama.cpp's error estimate: the standard error of the mean log-probability, through exp.
  const double n = static_cast<double>(res.n_scored);
  const double var = sum2 / n - res.nll * res.nll;
  res.ppl_error = var > 0 && n > 1 ? std::sqrt(var / (n - 1)) * res.ppl : 0.0;
  return res;
}

}  // namespace tandem

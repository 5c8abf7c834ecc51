#include "eval/perplexity.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <vector>

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
  ec.kv_cache = opts.kv_cache;
  ec.max_seqs = 1;
  ec.max_waiting = 0;
  ec.policy = SchedulePolicy::kThroughput;
  ec.max_batch_tokens = n_ctx;
  ec.prefix_caching = false;
  Engine engine(model, ec);
  std::unique_ptr<Engine> ref_engine;
  if (opts.kl_reference) {
    EngineConfig rc = ec;
    rc.kv_cache = *opts.kl_reference;
    ref_engine = std::make_unique<Engine>(model, rc);
  }

  const Tokenizer& tok = model.tokenizer();
  const int32_t nv = c.n_vocab;
  const int32_t first = n_ctx / 2;
  std::vector<double> lp(static_cast<size_t>(n_ctx - 1 - first));  // one chunk's scored log-probabilities
  double sum = 0, sum2 = 0;
  // The reference's log-probabilities of one chunk's scored rows (rows x
  // vocabulary floats: 1 GiB for 1024 rows of Gemma 3's 262k).
  std::vector<float> ref_lp;
  if (ref_engine) ref_lp.resize(lp.size() * size_t(nv));
  std::vector<double> kl(lp.size()), ref_nll(lp.size());
  std::vector<uint8_t> same(lp.size());
  double kl_sum = 0, kl_sum2 = 0, ref_sum = 0;
  int64_t same_n = 0;
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
    if (ref_engine) {
      RequestParams rp = p;
      rp.on_prompt_row = [&](int32_t row, std::span<const float> logits) {
        const float lse = log_sum_exp(logits.data(), nv);
        float* out = ref_lp.data() + size_t(row - first) * nv;
        for (int32_t i = 0; i < nv; ++i) out[i] = logits[i] - lse;
        ref_nll[row - first] = -static_cast<double>(out[chunk[row + 1]]);
      };
      const Completion ref_done = ref_engine->run_one(chunk, rp);
      if (ref_done.finish_reason == "error") fail(ErrorKind::kResource, "perplexity: {}", ref_done.error);
      p.on_prompt_row = [&](int32_t row, std::span<const float> logits) {
        const float lse = log_sum_exp(logits.data(), nv);
        const float* ref = ref_lp.data() + size_t(row - first) * nv;
        double d = 0;
        int32_t top = 0, ref_top = 0;
        for (int32_t i = 0; i < nv; ++i) {
          d += std::exp(static_cast<double>(ref[i])) * (static_cast<double>(ref[i]) - (logits[i] - lse));
          if (logits[i] > logits[top]) top = i;
          if (ref[i] > ref[ref_top]) ref_top = i;
        }
        kl[row - first] = d;
        same[row - first] = top == ref_top;
        lp[row - first] = static_cast<double>(logits[chunk[row + 1]]) - static_cast<double>(lse);
      };
    }
    const Completion done = engine.run_one(chunk, p);
    if (done.finish_reason == "error") fail(ErrorKind::kResource, "perplexity: {}", done.error);
    for (double v : lp) {  // in order: the sums do not depend on the threads
      sum -= v;
      sum2 += v * v;
    }
    if (ref_engine) {
      for (size_t i = 0; i < lp.size(); ++i) {
        kl_sum += kl[i];
        kl_sum2 += kl[i] * kl[i];
        ref_sum += ref_nll[i];
        same_n += same[i];
      }
      const double m = static_cast<double>(res.n_scored + static_cast<int64_t>(lp.size()));
      res.kl_mean = kl_sum / m;
      res.kl_error = m > 1 ? std::sqrt(std::max(0.0, kl_sum2 / m - res.kl_mean * res.kl_mean) / (m - 1)) : 0.0;
      res.ref_ppl = std::exp(ref_sum / m);
      res.same_top = static_cast<double>(same_n) / m;
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

#include "eval/perplexity.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "core/error.h"
#include "core/thread_pool.h"
#include "kernels/ops.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

namespace tandem {
namespace {

constexpr int32_t kBlockSize = 16;
// Scored rows per forward pass: a row of logits is a vocabulary of floats.
constexpr int64_t kLogitBytes = int64_t{64} << 20;

}  // namespace

PerplexityResult perplexity(Model& model, ThreadPool& pool, const std::vector<int32_t>& tokens,
                            const PerplexityOptions& opts,
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

  const Tokenizer& tok = model.tokenizer();
  const int32_t nv = c.n_vocab;
  const int32_t first = n_ctx / 2;
  const int32_t rows_per_pass = static_cast<int32_t>(
      std::clamp<int64_t>(kLogitBytes / (int64_t{nv} * int64_t{sizeof(float)}), 16, n_ctx));
  KvCache kv(model.kv_shape(), (n_ctx + kBlockSize - 1) / kBlockSize, kBlockSize, opts.kv_type);
  Logits logits;
  std::vector<double> lp;  // log-probabilities of one pass's scored tokens
  double sum = 0, sum2 = 0;
  const auto t0 = std::chrono::steady_clock::now();

  for (int32_t k = 0; k < res.n_chunks; ++k) {
    const int32_t* chunk = tokens.data() + static_cast<size_t>(k) * n_ctx;
    SeqKv seq;
    struct Release {
      SeqKv& s;
      KvCache& kv;
      ~Release() { s.release(kv); }
    } release{seq, kv};
    if (!seq.reserve(kv, n_ctx)) fail(ErrorKind::kResource, "perplexity: no KV room for {} tokens", n_ctx);
    SeqKv* one[] = {&seq};
    // Rows [p0, p1) of the chunk; those from `first` on get logits. Position
    // 0 holds BOS whatever the text has there, as in llama.cpp.
    auto pass = [&](int32_t p0, int32_t p1) {
      Batch b;
      for (int32_t p = p0; p < p1; ++p) {
        const int32_t t = p == 0 && tok.add_bos() && tok.bos_id() >= 0 ? tok.bos_id() : chunk[p];
        b.push_back({t, p, 0, p >= first});
      }
      logits.clear();
      model.forward(b, one, kv, pool, logits);
    };
    pass(0, first);
    // Row p scores chunk[p + 1]; the last row has nothing after it.
    for (int32_t p0 = first; p0 < n_ctx; p0 += rows_per_pass) {
      const int32_t p1 = std::min(n_ctx, p0 + rows_per_pass);
      pass(p0, p1);
      const int32_t n = std::min(p1, n_ctx - 1) - p0;
      lp.assign(static_cast<size_t>(std::max(n, 0)), 0.0);
      pool.parallel_for(n, 1, [&](int64_t i0, int64_t i1) {
        for (int64_t i = i0; i < i1; ++i) {
          const float* row = logits.data() + i * nv;
          lp[i] = static_cast<double>(row[chunk[p0 + i + 1]]) - static_cast<double>(log_sum_exp(row, nv));
        }
      });
      for (double v : lp) {  // in order: the sums do not depend on the threads
        sum -= v;
        sum2 += v * v;
      }
      res.n_scored += n;
    }
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

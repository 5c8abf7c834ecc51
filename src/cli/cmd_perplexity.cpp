// tandem perplexity: a text file's perplexity, as llama.cpp's llama-perplexity
// prints it ("[1]8.1234,[2]..." then "Final estimate: PPL = ... +/- ..."), so
// the two compare on the same model file and text.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <tuple>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/common.h"
#include "core/error.h"
#include "runtime/thread_pool.h"
#include "eval/perplexity.h"
#include "gguf/gguf.h"
#include "runtime/cpu_features.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

namespace tandem::cli {
namespace {

struct PerplexityOpts {
  std::string model, file;
  int32_t ctx = 512;
  int32_t chunks = -1;
  int32_t threads = 0;
  KvCacheFlags kv;
  std::string kl_reference;
  RuntimeOptions runtime;
  bool json = false;
};

int run(const PerplexityOpts& o) {
  const std::string text = read_text_file(o.file, "--file");
  const auto t0 = std::chrono::steady_clock::now();
  auto model = Model::load(resolve_model_path(o.model), o.runtime);
  if (!model->load_warning().empty()) std::fprintf(stderr, "warning: %s\n", model->load_warning().c_str());
  const double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // As llama-perplexity tokenizes: BOS first, no special-token parsing.
  const std::vector<int32_t> tokens = model->tokenizer().encode(text, true, false);
  PerplexityOptions po;
  po.n_ctx = o.ctx;
  po.max_chunks = o.chunks;
  po.kv_cache = kv_cache_types(o.kv);
  if (!o.kl_reference.empty()) {
    KvCacheFlags ref;
    ref.both = o.kl_reference;
    try {
      po.kl_reference = kv_cache_types(ref);
    } catch (const Error& e) {
      fail(ErrorKind::kInvalidArgument, "--kl-reference: {}", e.what());
    }
  }
  po.threads = o.threads;
  std::fprintf(stderr, "perplexity: %zu tokens, chunks of %d, the second half of each scored; %d threads, %s kernels\n",
               tokens.size(), o.ctx, o.threads > 0 ? o.threads : ThreadPool::default_threads(), cpu_kernel_level());
  const PerplexityResult r = perplexity(*model, tokens, po, [&](int32_t k, const PerplexityResult& so_far) {
    if (o.json) return;
    std::fprintf(stdout, "[%d]%.4f,", k, so_far.ppl);
    std::fflush(stdout);
  });
  if (o.json) {
    const nlohmann::json j = {{"model", model->file().path()}, {"tokens", r.n_tokens},    {"ctx", o.ctx},
                              {"chunks", r.n_chunks},          {"scored", r.n_scored},    {"nll", r.nll},
                              {"ppl", r.ppl},                  {"ppl_error", r.ppl_error}, {"load_s", load_s},
                              {"seconds", r.seconds},
                              {"kv_type", kv_format_name(kv_format(po.kv_cache))}};
    nlohmann::json out = j;
    if (po.kl_reference)
      out.update({{"kl_reference", kv_format_name(kv_format(*po.kl_reference))}, {"ref_ppl", r.ref_ppl},
                  {"kl_mean", r.kl_mean}, {"kl_error", r.kl_error}, {"same_top", r.same_top},
                  {"ppl_ratio", r.ppl / r.ref_ppl}});
    std::printf("%s\n", out.dump().c_str());
    return 0;
  }
  std::printf("\nFinal estimate: PPL = %.4f +/- %.5f\n", r.ppl, r.ppl_error);
  if (po.kl_reference)
    std::printf("KV cache %s against %s: PPL %.4f, ratio %.5f, mean KLD %.6f +/- %.6f, same top token %.2f%%\n",
                kv_format_name(kv_format(po.kv_cache)).c_str(), kv_format_name(kv_format(*po.kl_reference)).c_str(),
                r.ref_ppl, r.ppl / r.ref_ppl, r.kl_mean, r.kl_error, 100 * r.same_top);
  std::fputs(fmt::format("--- {} chunks of {} tokens in {:.2f} s ({:.1f} tok/s), loaded in {:.3f} s\n", r.n_chunks,
                         o.ctx, r.seconds, r.n_chunks * o.ctx / std::max(r.seconds, 1e-9), load_s)
                 .c_str(),
             stderr);
  return 0;
}

}  // namespace

void add_perplexity_command(CLI::App& app, int& rc) {
  auto o = std::make_shared<PerplexityOpts>();
  CLI::App* cmd = app.add_subcommand("perplexity", "Perplexity of a text file, computed as llama.cpp's llama-perplexity");
  cmd->add_option("-m,--model", o->model, "GGUF model file (default: the installed Gemma 3 270M)");
  cmd->add_option("-f,--file", o->file, "The text ('-': standard input)")->required();
  cmd->add_option("-c,--ctx-size", o->ctx, "Tokens per chunk; the second half of each is scored")
      ->capture_default_str();
  cmd->add_option("--chunks", o->chunks, "Chunks to score (-1: all)")->capture_default_str();
  cmd->add_option("-t,--threads", o->threads, "Threads (0: physical cores)")->capture_default_str();
  add_kv_cache_options(cmd, o->kv);
  cmd->add_option("--kl-reference", o->kl_reference,
                  "Also run each chunk with this KV cache type (f16: what the others approximate) and report the "
                  "KL divergence to it");
  add_runtime_options(cmd, o->runtime);
  add_sparse_attention_option(cmd, o->runtime);
  cmd->add_flag("--json", o->json, "Print one JSON object instead of llama.cpp's lines");
  cmd->callback([o, &rc] { rc = run(*o); });
}

}  // namespace tandem::cli

// tandem synth: a GGUF with random weights for a given shape and type (for
// benchmarks and architecture tests); see gguf/synth.h.
#include <chrono>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>

#include <fmt/format.h>

#include "cli/commands.h"
#include "gguf/synth.h"
#include "core/error.h"

namespace tandem::cli {
namespace {

struct SynthOpts {
  std::string out, preset, arch, vocab, type, name;
  std::optional<int32_t> layers, embd, ff, heads, kv_heads, head_dim, ctx, window, kv_lora, q_lora, rope_dim, head_dim_v,
      experts, experts_used, ff_exp, ff_shexp, dense_lead, experts_shared;
  std::optional<float> rope_base, eps, yarn_factor, yarn_log_mul, expert_scale;
  std::optional<int32_t> yarn_orig_ctx;
  std::optional<uint64_t> seed;
  bool rope_freqs = false, tied = false, untied = false, expert_norm = false;
  int32_t threads = 0;
};

SynthSpec build_spec(const SynthOpts& o) {
  SynthSpec s = o.preset.empty() ? SynthSpec{} : synth_preset(o.preset);
  if (!o.arch.empty()) s.arch = o.arch;
  if (!o.name.empty()) s.name = o.name;
  auto set = [](int32_t& field, const std::optional<int32_t>& v) {
    if (v) field = *v;
  };
  set(s.n_layer, o.layers);
  set(s.n_embd, o.embd);
  set(s.n_ff, o.ff);
  set(s.n_head, o.heads);
  set(s.n_head_kv, o.kv_heads);
  set(s.head_dim, o.head_dim);
  set(s.n_ctx, o.ctx);
  set(s.sliding_window, o.window);
  set(s.kv_lora_rank, o.kv_lora);
  set(s.q_lora_rank, o.q_lora);
  set(s.rope_dim, o.rope_dim);
  set(s.head_dim_v, o.head_dim_v);
  if (o.yarn_factor) s.yarn_factor = *o.yarn_factor;
  if (o.yarn_log_mul) s.yarn_log_mul = *o.yarn_log_mul;
  set(s.yarn_orig_ctx, o.yarn_orig_ctx);
  set(s.n_expert, o.experts);
  set(s.n_expert_used, o.experts_used);
  set(s.n_ff_exp, o.ff_exp);
  set(s.n_ff_shexp, o.ff_shexp);
  set(s.n_layer_dense_lead, o.dense_lead);
  set(s.n_expert_shared, o.experts_shared);
  if (o.expert_scale) s.expert_weights_scale = *o.expert_scale;
  if (o.expert_norm) s.expert_weights_norm = true;
  if (o.rope_base) s.rope_base = o.rope_base;
  if (o.eps) s.rms_eps = o.eps;
  if (o.seed) s.seed = *o.seed;
  if (o.rope_freqs) s.rope_freqs = true;
  if (o.tied) s.tied = true;
  if (o.untied) s.tied = false;
  if (!o.type.empty()) s.type = o.type;
  s.vocab_from = o.vocab;
  return s;
}

}  // namespace

void add_synth_command(CLI::App& app, int& rc) {
  CLI::App* cmd = app.add_subcommand(
      "synth",
      "Write a GGUF with random weights for a given shape and weight type (loadable by llama.cpp too).\n"
      "The same flags and seed always give the same bytes. A vocabulary is always needed: --vocab-from\n"
      "takes any GGUF with a tokenizer, e.g. ../shared/models/vocab/ggml-vocab-llama-spm.gguf (32000\n"
      "tokens) or ../shared/models/gguf/stories260K.gguf (512). Flags given override the preset's.");
  auto o = std::make_shared<SynthOpts>();
  cmd->add_option("-o,--output", o->out, "Output GGUF file")->required();
  cmd->add_option("--preset", o->preset,
                  fmt::format("A named shape: {}", fmt::join(synth_preset_names(), ", ")));
  cmd->add_option("--arch", o->arch, "llama | qwen2 | qwen3 | gemma3 | qwen2moe | qwen3moe | deepseek2 | gpt-oss (default llama)");
  cmd->add_option("--name", o->name, "general.name (default synth-<arch>)");
  cmd->add_option("--layers", o->layers, "Number of blocks (default 2)");
  cmd->add_option("--embd", o->embd, "Embedding width (default 64)");
  cmd->add_option("--ff", o->ff, "Feed-forward width (default 128)");
  cmd->add_option("--heads", o->heads, "Attention heads (default 4)");
  cmd->add_option("--kv-heads", o->kv_heads, "KV heads (default: heads)");
  cmd->add_option("--head-dim", o->head_dim, "Width of one head (default embd/heads)");
  cmd->add_option("--ctx", o->ctx, "context_length (default 2048)");
  cmd->add_option("--window", o->window, "gemma3, gpt-oss: sliding window (default 512, gpt-oss 128)");
  cmd->add_option("--kv-lora", o->kv_lora, "deepseek2: latent width kv_lora_rank (default 512)");
  cmd->add_option("--q-lora", o->q_lora, "deepseek2: q LoRA rank (default 0: attn_q)");
  cmd->add_option("--rope-dim", o->rope_dim, "deepseek2: rotated dims per head (default 64)");
  cmd->add_option("--head-dim-v", o->head_dim_v, "deepseek2: value width per head (default 128)");
  cmd->add_option("--yarn-factor", o->yarn_factor, "deepseek2, gpt-oss: YaRN rope scaling factor (default none)");
  cmd->add_option("--yarn-orig-ctx", o->yarn_orig_ctx, "deepseek2, gpt-oss: YaRN original context length (default 4096)");
  cmd->add_option("--yarn-log-mul", o->yarn_log_mul, "deepseek2: YaRN log multiplier as GGUF stores it (default 0)");
  cmd->add_option("--experts", o->experts, "Experts per layer (qwen*moe, gpt-oss default 8; llama: Mixtral-style MoE; deepseek2: MoE layers)");
  cmd->add_option("--experts-used", o->experts_used, "Experts each token uses (default 2)");
  cmd->add_option("--ff-exp", o->ff_exp, "qwen*moe, deepseek2, gpt-oss: one expert's width (default --ff)");
  cmd->add_option("--dense-lead", o->dense_lead, "deepseek2 with experts: leading dense layers (default 1)");
  cmd->add_option("--experts-shared", o->experts_shared, "deepseek2 with experts: shared experts (default 2)");
  cmd->add_option("--expert-scale", o->expert_scale, "deepseek2: routed experts' scaling factor (default 1)");
  cmd->add_flag("--expert-norm", o->expert_norm, "deepseek2: renormalise the used experts' weights");
  cmd->add_option("--ff-shexp", o->ff_shexp, "qwen2moe: the shared expert's width (default --ff)");
  cmd->add_option("--rope-base", o->rope_base, "RoPE frequency base (default 10000 llama, 1e6 others)");
  cmd->add_option("--eps", o->eps, "RMS norm epsilon (default 1e-5 llama, 1e-6 others)");
  cmd->add_flag("--rope-freqs", o->rope_freqs, "llama: add Llama-3 style rope_freqs.weight factors");
  cmd->add_flag("--tied", o->tied, "Output projection = token embedding (default for qwen2/qwen3/gemma3)");
  cmd->add_flag("--untied", o->untied, "Separate output.weight (default for llama)");
  cmd->add_option("--vocab-from", o->vocab, "GGUF whose tokenizer is copied (required)")->required();
  cmd->add_option("--type", o->type,
                  fmt::format("Weight type: {} (default f32)", fmt::join(synth_type_names(), ", ")));
  cmd->add_option("--seed", o->seed, "Random seed (default 0)");
  cmd->add_option("-t,--threads", o->threads, "Threads (default: physical cores; does not change the output)");
  cmd->callback([o, &rc] {
    if (o->tied && o->untied) fail(ErrorKind::kInvalidArgument, "give at most one of --tied and --untied");
    const SynthSpec spec = build_spec(*o);
    const auto t0 = std::chrono::steady_clock::now();
    const SynthReport r = synth_model(spec, o->out, o->threads);
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::string types;
    for (const auto& [t, n] : r.tensors_per_type) types += fmt::format(" {} x{}", t, n);
    std::fputs(fmt::format("wrote {}: {} {} layers, {} params, vocab {}, {} tensors ({} ), {:.1f} MiB in {:.1f} s\n",
                           o->out, spec.arch, spec.n_layer, r.n_params, r.n_vocab, r.n_tensors, types,
                           r.file_bytes / 1048576.0, secs)
                   .c_str(),
               stderr);
    rc = 0;
  });
}

}  // namespace tandem::cli

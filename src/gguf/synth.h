// Synthetic models: a GGUF v3 file with a real architecture, a real tokenizer
// (copied from another GGUF) and random weights, loadable by Tandem and by
// llama.cpp. Used for benchmarks at realistic sizes and for architecture
// tests against llama.cpp on tiny shapes.
//
// The file is a pure function of the spec: the same spec and seed give the
// same bytes with any thread count, and on any x86-64 build. Weights come from
// our own generator (splitmix64 streams, one per tensor row, and polar
// Box-Muller with a log of our own rather than libm's), then go through the
// reference quantizers in quant/quant.h; all of it is IEEE-exact arithmetic
// (a compiler that fuses a*b+c into one FMA, as is the default on some other
// ISAs, could change low bits and so the bytes).
//
// Cost: one pass over the weights, rows spread over the thread pool; the
// quantized file is held in memory once (peak RSS ~ file size). TinyLlama
// 1.1B takes ~17 s of CPU in f16 or q8_0 and ~65 s in q4_k_m (the K-quant
// scale search).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace tandem {

struct SynthSpec {
  std::string arch = "llama";   // llama | qwen2 | qwen3 | gemma3 | qwen2moe | qwen3moe | deepseek2 | gpt-oss
  std::string name;             // general.name; empty: "synth-<arch>"
  int32_t n_layer = 2;
  int32_t n_embd = 64;
  int32_t n_ff = 128;
  int32_t n_head = 4;
  int32_t n_head_kv = 0;        // 0: n_head (no GQA)
  int32_t head_dim = 0;         // 0: n_embd / n_head (deepseek2: 192, the query head width)
  // deepseek2's latent attention (DeepSeek-V2-Lite's shape by default): the
  // kv latent width, the q LoRA rank (0: attn_q, as V2-Lite), the rope part
  // of each query head, the per-head value width. The file carries the split
  // attn_k_b / attn_v_b up-projections, as current llama.cpp converters write.
  // With experts, layers from n_layer_dense_lead on are MoE, with
  // n_expert_shared shared experts (one ffn_*_shexp FFN of count x n_ff_exp);
  // without, every layer is dense.
  int32_t kv_lora_rank = 0;     // 0: 512
  int32_t q_lora_rank = 0;
  int32_t rope_dim = 0;         // 0: 64
  int32_t head_dim_v = 0;       // 0: 128
  // deepseek2, gpt-oss: YaRN rope scaling (rope.scaling.*) when yarn_factor > 0, as
  // V2-Lite's file states it (factor 40, original context 4096, log
  // multiplier 0.0707, the converter's 0.1 x 0.707).
  float yarn_factor = 0;
  int32_t yarn_orig_ctx = 4096;
  float yarn_log_mul = 0;
  int32_t n_layer_dense_lead = -1;  // -1: 1 with experts (as V2-Lite), every layer without
  int32_t n_expert_shared = -1;     // -1: 2 (V2-Lite's)
  float expert_weights_scale = 1.0f;  // deepseek2's routed scaling factor
  bool expert_weights_norm = false;   // deepseek2: renormalise the k weights
  int32_t n_ctx = 2048;         // {arch}.context_length
  // Mixture of experts: qwen2moe and qwen3moe always (default 8 experts, 2
  // used), llama when n_expert > 0 (Mixtral's tensors, experts n_ff wide),
  // deepseek2 when n_expert > 0; gpt-oss always (default 8, 2 used), with
  // biased attention, sinks, a biased router and biased experts.
  int32_t n_expert = 0;
  int32_t n_expert_used = 0;    // 0: 2
  int32_t n_ff_exp = 0;         // qwen*moe: one expert's width; 0: n_ff
  int32_t n_ff_shexp = 0;       // qwen2moe: the shared expert's width; 0: n_ff
  std::optional<float> rope_base;  // default: 10000 (llama), 1e6 (qwen2, qwen3, gemma3 global layers)
  std::optional<float> rms_eps;    // default: 1e-5 (llama), 1e-6 (others)
  int32_t sliding_window = 0;   // gemma3 (0: 512) and gpt-oss (0: 128) only
  bool rope_freqs = false;      // llama only: a Llama-3 style rope_freqs.weight (factors 1..8)
  std::optional<bool> tied;     // output = token_embd; default: separate for llama and the MoE families, tied for the others
  std::string vocab_from;       // GGUF whose tokenizer.* keys are copied; n_vocab = its token count
  // f32 f16 bf16 q8_0 q4_0 q4_1 q5_0 q5_1 q2_k q3_k q4_k q5_k q6_k mxfp4: every
  // matrix in that type ("pure", like llama-quantize --pure), except that a
  // K-quant falls back as llama.cpp does for rows that are not a multiple of
  // 256 (q4_k -> q5_0, q5_k -> q5_1, q6_k -> q8_0). q4_k_m / q5_k_m: llama.cpp's
  // _M mix (q6_k for the output matrix and for attn_v / ffn_down in the layers
  // llama_tensor_get_type picks). mxfp4_moe: llama.cpp's MXFP4_MOE (the
  // expert tensors MXFP4, every other matrix q8_0, the router f32). Vectors
  // (norms, biases, sinks, rope factors) are f32.
  std::string type = "f32";
  uint64_t seed = 0;
};

struct SynthReport {
  int32_t n_vocab = 0;
  int64_t n_params = 0;
  int64_t n_tensors = 0;
  uint64_t file_bytes = 0;
  std::map<std::string, int> tensors_per_type;  // "q6_K" -> count
};

// Named shapes (no vocabulary: --vocab-from is always needed).
// tinyllama-1.1b: llama, 22 layers, 2048 wide, 5632 FFN, 32 heads, 4 KV heads.
// deepseek-v2-lite-dense: DeepSeek-V2-Lite's attention (27 layers, 2048 wide,
// 16 heads, kv LoRA 512, rope 64) with every layer's FFN dense (10944, its
// first layer's), as the latent-attention benchmarks use it. deepseek-v2-lite:
// the same with V2-Lite's experts: first layer dense, then 64 experts of 1408,
// 6 used, 2 shared, scale 1, no renormalisation.
// qwen3-30b-a3b: qwen3moe, 48 layers, 2048 wide, 32 heads (4 KV) of 128, 128
// experts of 768, 8 used. gpt-oss-20b: 24 layers, 2880 wide, 64 heads (8 KV)
// of 64, 32 experts of 2880, 4 used, window 128, YaRN 32 over 4096. mixtral-8x7b: llama, 32 layers, 4096 wide, 8 experts
// of 14336, 2 used. qwen1.5-moe-a2.7b: qwen2moe, 24 layers, 2048 wide, 60
// experts of 1408, 4 used, a shared expert of 5632.
SynthSpec synth_preset(const std::string& name);  // throws kInvalidArgument, listing the names
std::vector<std::string> synth_preset_names();

// The weight types synth accepts, as spelled on the command line.
std::vector<std::string> synth_type_names();

// Validates the spec (throws tandem::Error naming the field and value) and
// writes the model. n_threads <= 0: physical cores; the output does not
// depend on it.
SynthReport synth_model(const SynthSpec& spec, const std::string& out_path, int n_threads = 0);

}  // namespace tandem

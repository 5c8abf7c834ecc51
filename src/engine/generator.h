// One request, start to finish: prefill the prompt, then decode token by token
// until a stop condition, streaming text as it is produced and timing each
// phase. (The serving engine runs many of these at once; this is the plain
// single-sequence loop the CLI uses.)
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "engine/json_schema.h"
#include "engine/sampler.h"
#include "engine/step_log.h"
#include "kv/kv_cache.h"

namespace tandem {

class Model;
class ThreadPool;

struct GenerateOptions {
  int32_t max_tokens = 256;          // < 0: until the context is full
  SamplingParams sampling;
  std::vector<std::string> stop;     // stop strings (not included in the output)
  bool stop_at_eog = true;           // end at EOS / end-of-turn tokens
  // The output is one JSON object (fitting `json_schema` when given), and
  // ends with it (stop reason "json").
  bool json_object = false;
  std::shared_ptr<const CompiledSchema> json_schema;
};

struct GenerateReport {
  int32_t prompt_tokens = 0;
  double prefill_s = 0;          // the prefill forward pass
  double ttft_s = 0;             // request start to first token sampled
  int32_t generated_tokens = 0;
  double decode_s = 0;           // first token sampled to last token sampled
  std::string stop_reason;       // "eog", "stop", "json", "length", "context", "cancelled"
  std::vector<int32_t> tokens;   // generated ids

  double prefill_tok_s() const { return prefill_s > 0 ? prompt_tokens / prefill_s : 0; }
  // Decode steps after the first token (the first comes from prefill).
  double decode_tok_s() const { return decode_s > 0 ? (generated_tokens - 1) / decode_s : 0; }
  double ms_per_token() const { return generated_tokens > 1 ? 1000.0 * decode_s / (generated_tokens - 1) : 0; }
};

class Generator {
 public:
  // n_ctx: context size in tokens (KV cache capacity); <= 0 picks
  // min(training context, 4096). kv_type: the KV cache's element type.
  Generator(Model& model, ThreadPool& pool, int32_t n_ctx = 0, KvType kv_type = KvType::kF16);
  ~Generator();

  int32_t n_ctx() const { return n_ctx_; }
  const StepLog& steps() const { return steps_; }

  // on_text receives printable text as it completes; returning false cancels.
  // Throws kInvalidArgument when the prompt does not fit the context.
  GenerateReport generate(const std::vector<int32_t>& prompt, const GenerateOptions& opts,
                          const std::function<bool(std::string_view)>& on_text);

 private:
  Model& model_;
  ThreadPool& pool_;
  int32_t n_ctx_;
  std::unique_ptr<KvCache> kv_;
  StepLog steps_;
};

}  // namespace tandem

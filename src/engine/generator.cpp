#include "engine/generator.h"

#include <algorithm>

#include "core/error.h"
#include "engine/json_grammar.h"
#include "gguf/gguf.h"
#include "kv/kv_cache.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

namespace tandem {

const char* phase_name(Phase p) {
  switch (p) {
    case Phase::kPrefill: return "prefill";
    case Phase::kDecode: return "decode";
    case Phase::kMixed: return "mixed";
  }
  return "?";
}

namespace {
constexpr int32_t kBlockSize = 16;
}

Generator::Generator(Model& model, ThreadPool& pool, int32_t n_ctx, KvType kv_type) : model_(model), pool_(pool) {
  const ModelConfig& c = model.config();
  n_ctx_ = n_ctx > 0 ? n_ctx : std::min(c.n_ctx_train, 4096);
  if (n_ctx_ > c.n_ctx_train)
    fail(ErrorKind::kInvalidArgument, "context size {} exceeds the model's training context {}", n_ctx_,
         c.n_ctx_train);
  kv_ = std::make_unique<KvCache>(model.kv_shape(), (n_ctx_ + kBlockSize - 1) / kBlockSize, kBlockSize, kv_type);
}

Generator::~Generator() = default;

GenerateReport Generator::generate(const std::vector<int32_t>& prompt, const GenerateOptions& opts,
                                   const std::function<bool(std::string_view)>& on_text) {
  if (prompt.empty()) fail(ErrorKind::kInvalidArgument, "the prompt is empty (no tokens)");
  if (static_cast<int64_t>(prompt.size()) >= n_ctx_)
    fail(ErrorKind::kInvalidArgument, "the prompt has {} tokens, which does not fit the context of {} tokens",
         prompt.size(), n_ctx_);

  const Tokenizer& tok = model_.tokenizer();
  const int32_t n_vocab = model_.config().n_vocab;
  Sampler sampler(opts.sampling);
  StreamDecoder stream(tok);
  std::unique_ptr<JsonConstraint> json;
  if (opts.json_object || opts.json_schema)
    json = std::make_unique<JsonConstraint>(token_pieces(tok), tok, opts.json_schema);
  GenerateReport rep;
  rep.prompt_tokens = static_cast<int32_t>(prompt.size());

  SeqKv seq;
  struct Release {
    SeqKv& s;
    KvCache& kv;
    ~Release() { s.release(kv); }
  } release{seq, *kv_};

  std::vector<int32_t> history = prompt;
  Logits logits;
  const double t_start = steps_.now();

  // Text is held back while it could be the start of a stop string.
  std::string text;
  size_t emitted = 0;
  bool cancelled = false;
  auto emit = [&](bool final) {
    StopMatch m = find_stop(text, opts.stop);
    size_t upto = m.pos != std::string::npos ? m.pos : (final ? text.size() : m.safe_len);
    if (upto > emitted) {
      if (!on_text(std::string_view(text).substr(emitted, upto - emitted))) cancelled = true;
      emitted = upto;
    }
    return m.pos != std::string::npos;
  };

  // Prefill.
  seq.reserve(*kv_, rep.prompt_tokens);
  double t0 = steps_.now();
  model_.prefill(seq, prompt, *kv_, pool_, logits);
  double t1 = steps_.now();
  steps_.add({Phase::kPrefill, t0, t1, rep.prompt_tokens, 1});
  rep.prefill_s = t1 - t0;

  const int32_t limit = opts.max_tokens < 0 ? n_ctx_ : opts.max_tokens;
  double t_first = 0;
  while (true) {
    const int32_t id = sampler.sample(std::span<const float>(logits.data(), n_vocab), history, json.get());
    if (rep.generated_tokens == 0) {
      t_first = steps_.now();
      rep.ttft_s = t_first - t_start;
    }
    rep.decode_s = steps_.now() - t_first;
    if (opts.stop_at_eog && tok.is_eog(id)) {
      rep.stop_reason = "eog";
      break;
    }
    ++rep.generated_tokens;
    rep.tokens.push_back(id);
    history.push_back(id);
    text += stream.push(id);
    if (json) json->accept(id);
    if (emit(false)) {
      rep.stop_reason = "stop";
      break;
    }
    if (json && json->complete()) {
      rep.stop_reason = "json";
      break;
    }
    if (cancelled) {
      rep.stop_reason = "cancelled";
      break;
    }
    if (rep.generated_tokens >= limit) {
      rep.stop_reason = "length";
      break;
    }
    if (seq.n_tokens >= n_ctx_ || !seq.reserve(*kv_, seq.n_tokens + 1)) {
      rep.stop_reason = "context";
      break;
    }
    // Decode one step.
    logits.clear();
    SeqKv* seqs[] = {&seq};
    const int32_t next[] = {id};
    t0 = steps_.now();
    model_.decode(seqs, next, *kv_, pool_, logits);
    steps_.add({Phase::kDecode, t0, steps_.now(), 1, 1});
  }
  if (!cancelled && rep.stop_reason != "stop") {
    text += stream.flush();
    emit(true);
  }
  return rep;
}

}  // namespace tandem

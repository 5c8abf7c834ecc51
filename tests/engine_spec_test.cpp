// Speculative decoding never changes the output: greedy and seeded outputs
// equal plain decoding's for every drafter, in batches, at the context's end,
// under preemption; the KV of rejected drafts is given back and the prefix
// cache stays consistent; and the sampled distribution is the target's.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "gguf/synth.h"
#include "core/error.h"
#include "runtime/thread_pool.h"
#include "engine/llm_engine.h"
#include "kv/kv_cache.h"
#include "model/model.h"
#include "test_support.h"
#include "tokenizer/tokenizer.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;

struct Outcome {
  std::vector<int32_t> tokens;
  std::string text;
  RequestTimings timings;
};


EngineConfig config(SpecMode mode, int32_t max_draft = 8, bool adaptive = false, int32_t ctx = 512) {
  EngineConfig c;
  c.threads = 2;
  c.max_context = ctx;
  c.spec.mode = mode;
  c.spec.max_draft = max_draft;
  c.spec.adaptive = adaptive;
  return c;
}

// Runs the requests together on one engine, checking the block accounting
// after every step; returns each request's output.
std::vector<Outcome> run_all(Model& m, const EngineConfig& cfg, const std::vector<std::vector<int32_t>>& prompts,
                         const std::vector<RequestParams>& params, Model* draft = nullptr) {
  Engine e(m, cfg, draft);
  std::vector<Outcome> out(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i)
    e.submit(prompts[i], params[i], [&out, i](const RequestEvent& ev) {
      out[i].tokens.insert(out[i].tokens.end(), ev.tokens.begin(), ev.tokens.end());
      out[i].text += ev.text;
      if (ev.finished) out[i].timings = ev.timings;
    });
  while (e.step()) e.check_invariants();
  const MetricsSnapshot ms = e.metrics();
  EXPECT_EQ(ms.kv_blocks_used, 0);
  return out;
}

class Spec : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { model_ = Model::load(test::shared_path("models/gguf/stories260K.gguf")).release(); }
  static void TearDownTestSuite() { delete model_; }
  static std::vector<int32_t> tok(const std::string& s) { return model_->tokenizer().encode(s, true, true); }
  static Model* model_;
};
Model* Spec::model_ = nullptr;

const char* kPrompts[] = {"Once upon a time", "The little dog", "Lily and Tom went to the park. Lily and Tom",
                          "One day, a bird", "Tim had a red ball. Tim had a red"};

TEST_F(Spec, GreedyIsIdenticalForEveryDrafter) {
  std::vector<std::vector<int32_t>> prompts;
  std::vector<RequestParams> params;
  for (const char* p : kPrompts) {
    prompts.push_back(tok(p));
    params.push_back(test::greedy_to(160));
  }
  std::vector<Outcome> plain;
  for (size_t i = 0; i < prompts.size(); ++i) plain.push_back(run_all(*model_, config(SpecMode::kOff), {prompts[i]}, {params[i]})[0]);
  struct Case {
    const char* name;
    SpecMode mode;
    int32_t k;
    bool adaptive;
  };
  for (const Case c : {Case{"ngram k=1", SpecMode::kNgram, 1, false}, Case{"ngram k=4", SpecMode::kNgram, 4, false},
                       Case{"ngram k=16", SpecMode::kNgram, 16, false}, Case{"ngram adaptive", SpecMode::kNgram, 16, true},
                       Case{"draft k=5", SpecMode::kDraft, 5, false}}) {
    SCOPED_TRACE(c.name);
    for (size_t i = 0; i < prompts.size(); ++i) {
      // stories260K as its own draft: every draft is kept, and the rollback
      // of a cut-off last draft (max_tokens) still runs.
      const Outcome r = run_all(*model_, config(c.mode, c.k, c.adaptive), {prompts[i]}, {params[i]},
                            c.mode == SpecMode::kDraft ? model_ : nullptr)[0];
      EXPECT_EQ(r.tokens, plain[i].tokens) << kPrompts[i];
      EXPECT_EQ(r.text, plain[i].text) << kPrompts[i];
      if (!c.adaptive) {
        EXPECT_GT(r.timings.drafted, 0) << kPrompts[i];
      }
      if (c.mode == SpecMode::kDraft) {
        EXPECT_EQ(r.timings.accepted, r.timings.drafted);
      }
      EXPECT_LE(r.timings.accepted, r.timings.drafted);
      if (r.timings.accepted > 0) {
        EXPECT_GT(r.timings.tokens_per_step(), 1.0);
      }
    }
  }
}

// 32 requests at once with speculation equal each one alone without it.
TEST_F(Spec, BatchInvarianceHolds) {
  std::vector<std::vector<int32_t>> prompts;
  std::vector<RequestParams> params;
  for (int i = 0; i < 32; ++i) {
    prompts.push_back(tok(std::string(kPrompts[i % 5]) + std::string(i % 4, ' ')));
    params.push_back(test::greedy_to(40 + i));
  }
  std::vector<Outcome> alone;
  for (size_t i = 0; i < prompts.size(); ++i) alone.push_back(run_all(*model_, config(SpecMode::kOff), {prompts[i]}, {params[i]})[0]);
  EngineConfig cfg = config(SpecMode::kNgram, 6, false);
  cfg.max_seqs = 32;
  cfg.max_batch_tokens = 128;
  const std::vector<Outcome> together = run_all(*model_, cfg, prompts, params);
  int32_t drafted = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(together[i].tokens, alone[i].tokens) << i;
    drafted += together[i].timings.drafted;
  }
  EXPECT_GT(drafted, 0);
}

// Rejected drafts give their blocks back, and blocks published to the prefix
// cache hold only kept tokens: a later request sharing the prefix is served
// from the cache and continues exactly as without speculation.
TEST_F(Spec, RollbackKeepsTheCacheConsistent) {
  EngineConfig cfg = config(SpecMode::kNgram, 16, false);
  cfg.prefix_caching = true;
  const std::vector<int32_t> p = tok(kPrompts[2]);
  const std::vector<Outcome> first = run_all(*model_, cfg, {p}, {test::greedy_to(120)});
  Engine e(*model_, cfg);
  std::vector<int32_t> again = p;
  again.insert(again.end(), first[0].tokens.begin(), first[0].tokens.begin() + 100);
  Outcome a, b;
  e.submit(p, test::greedy_to(120),
           [&](const RequestEvent& ev) { a.tokens.insert(a.tokens.end(), ev.tokens.begin(), ev.tokens.end()); });
  while (e.step()) e.check_invariants();
  int32_t cached = 0;
  e.submit(again, test::greedy_to(30), [&](const RequestEvent& ev) {
    b.tokens.insert(b.tokens.end(), ev.tokens.begin(), ev.tokens.end());
    cached = std::max(cached, ev.cached_prompt_tokens);
  });
  while (e.step()) e.check_invariants();
  EXPECT_EQ(a.tokens, first[0].tokens);
  EXPECT_GT(cached, 64);  // the first request's output blocks were published and reused
  const Outcome plain = run_all(*model_, config(SpecMode::kOff), {again}, {test::greedy_to(30)})[0];
  EXPECT_EQ(b.tokens, plain.tokens);
  EXPECT_EQ(e.metrics().kv_blocks_used, 0);
}

// Drafts stop at the context's end and at max_tokens; a pool too small for
// everyone preempts as before; the output never changes.
TEST_F(Spec, ContextEndPreemptionAndLimits) {
  const std::vector<int32_t> p = tok(kPrompts[4]);
  const Outcome plain = run_all(*model_, config(SpecMode::kOff, 8, false, 48), {p}, {test::greedy_to(-1)})[0];
  const Outcome spec = run_all(*model_, config(SpecMode::kNgram, 16, false, 48), {p}, {test::greedy_to(-1)})[0];
  EXPECT_EQ(spec.tokens, plain.tokens);
  EXPECT_EQ(static_cast<int32_t>(p.size() + spec.tokens.size()), 48);
  // Five sequences of ~110 tokens in 12 blocks of 16.
  std::vector<std::vector<int32_t>> prompts;
  std::vector<RequestParams> params;
  for (const char* s : kPrompts) {
    prompts.push_back(tok(s));
    params.push_back(test::greedy_to(100));
  }
  EngineConfig tight = config(SpecMode::kNgram, 8, false, 128);
  tight.kv_tokens = 192;
  tight.max_seqs = 5;
  const std::vector<Outcome> squeezed = run_all(*model_, tight, prompts, params);
  for (size_t i = 0; i < prompts.size(); ++i)
    EXPECT_EQ(squeezed[i].tokens, run_all(*model_, config(SpecMode::kOff, 8, false, 128), {prompts[i]}, {params[i]})[0].tokens);
  // A request may turn speculation off.
  RequestParams off = test::greedy_to(100);
  off.spec_max = 0;
  EXPECT_EQ(run_all(*model_, config(SpecMode::kNgram, 8, false), {prompts[4]}, {off})[0].timings.drafted, 0);
}

RequestParams sampled(int32_t max_tokens, uint64_t seed) {
  RequestParams p;
  p.sampling.temperature = 1.0f;
  p.sampling.top_k = 0;
  p.sampling.top_p = 1.0f;
  p.sampling.min_p = 0.0f;
  p.sampling.seed = seed;
  p.max_tokens = max_tokens;
  p.stop_at_eog = false;
  return p;
}

// Seeded sampling: the same tokens with and without speculation, seed by
// seed (the rows are sampled with the same draws plain decoding makes).
// And a goodness-of-fit test of the verified rows against the model's own
// distribution: after a fixed first token, the second token (drawn from
// verified rows) is compared with softmax(logits) by a chi-square test at a
// false-alarm rate of 0.1%.
TEST_F(Spec, SampledOutputAndDistributionAreTheTargets) {
  const std::vector<int32_t> p = tok("Tim had a red ball. Tim had a red ball. Tim had a");
  const int kRuns = 2000;
  std::vector<std::vector<int32_t>> prompts(kRuns, p);
  std::vector<RequestParams> on_params, off_params;
  for (int i = 0; i < kRuns; ++i) {
    on_params.push_back(sampled(3, 1000 + i));
    off_params.push_back(sampled(3, 1000 + i));
  }
  EngineConfig on = config(SpecMode::kNgram, 4, false);
  on.spec.ngram_min = 1;  // any first token seen in the prompt finds a draft
  on.max_seqs = 64;
  on.max_waiting = kRuns;
  EngineConfig off = on;
  off.spec.mode = SpecMode::kOff;
  const std::vector<Outcome> a = run_all(*model_, on, prompts, on_params);
  const std::vector<Outcome> b = run_all(*model_, off, prompts, off_params);
  int32_t drafted = 0;
  for (int i = 0; i < kRuns; ++i) {
    ASSERT_EQ(a[i].tokens, b[i].tokens) << "seed " << 1000 + i;
    drafted += a[i].timings.drafted;
  }

  // The most frequent first token among those the prompt holds (the 1-gram
  // lookup then drafts after it, so the second token is always drawn from a
  // verified row), and the second tokens after it.
  std::map<int32_t, int> first;
  for (const Outcome& r : a)
    if (std::find(p.begin(), p.end(), r.tokens[0]) != p.end()) ++first[r.tokens[0]];
  ASSERT_FALSE(first.empty());
  const int32_t y1 = std::max_element(first.begin(), first.end(), [](auto& x, auto& y) { return x.second < y.second; })->first;
  std::map<int32_t, int> second;
  int n = 0, verified = 0;
  for (const Outcome& r : a)
    if (r.tokens[0] == y1) {
      ++second[r.tokens[1]];
      ++n;
      verified += r.timings.drafted > 0;
    }
  ASSERT_GE(n, 100);
  ASSERT_EQ(verified, n) << "of " << n << " second tokens, too few came from verified rows (" << drafted
                                  << " drafted in all)";
  // The exact distribution of the second token, from the model itself.
  ThreadPool pool(1);
  KvCache kv(model_->kv_shape(), 8, 16);
  SeqKv seq;
  std::vector<int32_t> ctx = p;
  ctx.push_back(y1);
  ASSERT_TRUE(seq.reserve(kv, static_cast<int32_t>(ctx.size())));
  Logits logits;
  model_->prefill(seq, ctx, kv, pool, logits);
  const int32_t nv = model_->config().n_vocab;
  double mx = -1e30, z = 0;
  for (int32_t t = 0; t < nv; ++t) mx = std::max(mx, static_cast<double>(logits[t]));
  std::vector<double> prob(nv);
  for (int32_t t = 0; t < nv; ++t) z += prob[t] = std::exp(logits[t] - mx);
  for (double& q : prob) q /= z;
  // Cells with an expected count of 5 or more; the rest pooled.
  double chi2 = 0, rest_exp = 0;
  int rest_obs = 0, cells = 0;
  for (int32_t t = 0; t < nv; ++t) {
    const double e = prob[t] * n;
    const int o = second.count(t) ? second[t] : 0;
    if (e >= 5) {
      chi2 += (o - e) * (o - e) / e;
      ++cells;
    } else {
      rest_exp += e;
      rest_obs += o;
    }
  }
  if (rest_exp > 0) {
    chi2 += (rest_obs - rest_exp) * (rest_obs - rest_exp) / rest_exp;
    ++cells;
  }
  const int df = cells - 1;
  ASSERT_GE(df, 1);
  // Wilson-Hilferty: the chi-square quantile at 1 - 0.001 (z = 3.0902).
  const double zq = 3.0902, h = 2.0 / (9.0 * df);
  const double critical = df * std::pow(1 - h + zq * std::sqrt(h), 3);
  EXPECT_LT(chi2, critical) << "chi-square " << chi2 << " with " << df << " degrees of freedom over " << n << " samples";
}

// Every architecture, on random-weight models: speculation leaves greedy
// output alone.
TEST(SpecArchitectures, GreedyIsIdentical) {
  for (const char* arch : {"llama", "qwen2", "qwen3", "gemma3"}) {
    SCOPED_TRACE(arch);
    SynthSpec s;
    s.arch = arch;
    s.n_layer = 2;
    s.n_embd = 128;
    s.n_ff = 256;
    s.n_head = 4;
    s.n_head_kv = 2;
    s.type = "q8_0";
    s.vocab_from = test::shared_path("models/vocab/ggml-vocab-llama-spm.gguf");
    const fs::path file = fs::temp_directory_path() / (std::string("tandem_spec_") + arch + ".gguf");
    synth_model(s, file.string(), 1);
    auto m = Model::load(file.string());
    const std::vector<int32_t> p = m->tokenizer().encode("one two three one two three one two", true, true);
    const Outcome plain = run_all(*m, config(SpecMode::kOff), {p}, {test::greedy_to(64)})[0];
    const Outcome ngram = run_all(*m, config(SpecMode::kNgram, 8, false), {p}, {test::greedy_to(64)})[0];
    const Outcome draft = run_all(*m, config(SpecMode::kDraft, 3, false), {p}, {test::greedy_to(64)}, m.get())[0];
    EXPECT_EQ(ngram.tokens, plain.tokens);
    EXPECT_EQ(draft.tokens, plain.tokens);
    EXPECT_GT(draft.timings.drafted, 0);
    fs::remove(file);
  }
}

// A prompt that arrives while others decode with drafts is prefilled beside
// them at every step: the latency policy's prefill pacer measures and budgets
// per decoding sequence, drafts included (measured in rows and asked in
// sequences, a step with drafts looked like another batch, and prompts could
// wait until the drafting ended).
TEST_F(Spec, PromptsArrivingBesideDraftsAreNotHeldBack) {
  EngineConfig cfg = config(SpecMode::kNgram, 8, false);
  ASSERT_EQ(cfg.policy, SchedulePolicy::kLatency);
  Engine e(*model_, cfg);
  for (int i = 0; i < 12; ++i)
    e.submit(tok("Tim had a red ball. Tim had a red ball. Tim had a red"), test::greedy_to(300),
             [](const RequestEvent&) {});
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(e.step());
  ASSERT_GT(e.metrics().spec_drafted, 0u) << "the decoding sequences should be drafting";
  std::string text;
  for (int i = 0; i < 6; ++i) text += "One day, a little bird flew over the big green tree. ";
  const std::vector<int32_t> prompt = tok(text);
  ASSERT_GT(prompt.size(), 60u);
  bool first = false;
  e.submit(prompt, test::greedy_to(4), [&first](const RequestEvent& ev) { first = first || !ev.tokens.empty(); });
  int steps = 0;
  const auto decode_only = [&e] { return e.metrics().phases[static_cast<size_t>(Phase::kDecode)].steps; };
  const uint64_t d0 = decode_only();
  while (!first && steps < 400 && e.step()) ++steps;
  EXPECT_TRUE(first);
  // Every step carries prompt tokens but the one that measures a decode-only
  // step for the pacer (the same 12 sequences decode throughout).
  EXPECT_LE(decode_only() - d0, 1u) << "a prompt of " << prompt.size() << " tokens waited " << steps
                                    << " steps, " << decode_only() - d0 << " of them without it";
  while (e.step()) {
  }
}

TEST_F(Spec, BadConfigurationsAreRefused) {
  EXPECT_THROW(Engine(*model_, config(SpecMode::kDraft)), Error);                  // no draft model
  EXPECT_THROW(Engine(*model_, config(SpecMode::kNgram), model_), Error);          // a draft model unused
  EXPECT_THROW(Engine(*model_, config(SpecMode::kNgram, 0)), Error);               // no drafts at all
  // A draft model with another vocabulary: the sizes are named.
  SynthSpec s;
  s.vocab_from = test::shared_path("models/vocab/ggml-vocab-llama-spm.gguf");
  const fs::path file = fs::temp_directory_path() / "tandem_spec_vocab.gguf";
  synth_model(s, file.string(), 1);
  auto other = Model::load(file.string());
  try {
    Engine e(*model_, config(SpecMode::kDraft), other.get());
    FAIL() << "a draft model of another vocabulary was taken";
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find("32000 tokens, the model's 512"), std::string::npos) << err.what();
  }
  fs::remove(file);
}

}  // namespace
}  // namespace tandem

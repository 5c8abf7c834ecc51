// The serving engine driven synchronously (step()) on stories260K.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <chrono>
#include <random>
#include <thread>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "runtime/memory_info.h"
#include "runtime/thread_pool.h"
#include "engine/json_grammar.h"
#include "engine/llm_engine.h"
#include "kv/kv_cache.h"
#include "model/model.h"
#include "test_support.h"
#include "tokenizer/tokenizer.h"

namespace tandem {
namespace {

class EngineTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { model_ = Model::load(test::shared_path("models/gguf/stories260K.gguf")).release(); }
  static void TearDownTestSuite() {
    delete model_;
    model_ = nullptr;
  }
  static Model* model_;

  struct Out {
    std::map<int32_t, std::string> text;
    std::map<int32_t, std::vector<int32_t>> tokens;
    std::map<int32_t, std::string> reason;
    std::map<int32_t, std::vector<TokenLogprob>> prompt_lp;
    std::map<int32_t, std::vector<std::vector<TokenLogprob>>> prompt_top;
    int32_t cached = 0;
    int finished = 0;
  };

  static EventSink collect(Out& o) {
    return [&o](const RequestEvent& ev) {
      if (!ev.prompt_logprobs.empty()) {
        EXPECT_TRUE(o.tokens[ev.choice].empty()) << "prompt logprobs after a token";
        EXPECT_EQ(o.prompt_lp.count(ev.choice), 0u) << "prompt logprobs twice";
        o.prompt_lp[ev.choice] = ev.prompt_logprobs;
        o.prompt_top[ev.choice] = ev.prompt_top_logprobs;
      }
      o.text[ev.choice] += ev.text;
      auto& t = o.tokens[ev.choice];
      t.insert(t.end(), ev.tokens.begin(), ev.tokens.end());
      o.cached = ev.cached_prompt_tokens;
      if (ev.finished) {
        o.reason[ev.choice] = ev.finish_reason;
        ++o.finished;
      }
    };
  }

  static void run_until_idle(Engine& e) {
    for (int i = 0; i < 100000 && e.step(); ++i) {
    }
  }

  static RequestParams greedy(int32_t max_tokens) {
    RequestParams p;
    p.sampling.temperature = 0;
    p.max_tokens = max_tokens;
    return p;
  }

  std::vector<int32_t> tok(const std::string& s) { return model_->tokenizer().encode(s, true, true); }
};
Model* EngineTest::model_ = nullptr;

// A request alone on the engine, through the serving path and through
// run_one (what `tandem run` does), equals a plain greedy loop over the
// model's own forward pass.
TEST_F(EngineTest, SingleRequestMatchesAPlainGreedyLoop) {
  ThreadPool pool(2);
  const ModelConfig& c = model_->config();
  KvCache kv(model_->kv_shape(), 32, 16);
  SeqKv seq;
  std::vector<int32_t> ids = tok("Once upon a time");
  ASSERT_TRUE(seq.reserve(kv, 64));
  Logits logits;
  model_->prefill(seq, ids, kv, pool, logits);
  std::vector<int32_t> want_ids;
  for (int i = 0; i < 40; ++i) {
    const int32_t next = static_cast<int32_t>(std::max_element(logits.begin(), logits.begin() + c.n_vocab) - logits.begin());
    want_ids.push_back(next);
    if (i == 39) break;
    logits.clear();
    SeqKv* seqs[] = {&seq};
    const int32_t one[] = {next};
    model_->decode(seqs, one, kv, pool, logits);
  }
  seq.release(kv);
  std::string want;
  StreamDecoder dec(model_->tokenizer());
  for (int32_t id : want_ids) want += dec.push(id);

  const Completion one = test::greedy(*model_, tok("Once upon a time"), 40);
  EXPECT_EQ(one.tokens, want_ids);
  EXPECT_EQ(one.text, want);
  EXPECT_EQ(one.stop_cause, "length");
  EXPECT_EQ(one.timings.generated_tokens, 40);
  EXPECT_EQ(one.timings.prompt_tokens, static_cast<int32_t>(ids.size()));

  Engine e(*model_, EngineConfig{.threads = 2, .max_context = 512});
  Out o;
  e.submit(tok("Once upon a time"), greedy(40), collect(o));
  run_until_idle(e);
  EXPECT_EQ(o.text[0], want);
  EXPECT_EQ(o.reason[0], "length");
  EXPECT_EQ(e.metrics().kv_blocks_used, 0);
}

// 32 concurrent greedy requests with different prompts and lengths produce the
// same bytes as each request alone: no row's arithmetic depends on the batch.
TEST_F(EngineTest, BatchInvariance) {
  std::vector<std::string> prompts;
  const char* starts[] = {"Once upon a time", "The little dog", "Lily and Tom", "One day, a bird", "The sun was"};
  for (int i = 0; i < 32; ++i) prompts.push_back(std::string(starts[i % 5]) + std::string(i % 7, ' ') + (i % 3 ? " went" : ""));
  std::vector<std::string> alone(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    Engine e(*model_, EngineConfig{.threads = 2, .max_context = 256});
    Out o;
    e.submit(tok(prompts[i]), greedy(20 + static_cast<int32_t>(i)), collect(o));
    run_until_idle(e);
    alone[i] = o.text[0];
  }
  EngineConfig cfg{.threads = 2, .max_context = 256, .max_batch_tokens = 64, .max_seqs = 32};
  Engine e(*model_, cfg);
  std::vector<Out> outs(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) e.submit(tok(prompts[i]), greedy(20 + static_cast<int32_t>(i)), collect(outs[i]));
  run_until_idle(e);
  for (size_t i = 0; i < prompts.size(); ++i) EXPECT_EQ(outs[i].text[0], alone[i]) << "request " << i;
  EXPECT_EQ(e.metrics().kv_blocks_used, 0);
}

TEST_F(EngineTest, SharedPrefixIsServedFromTheCache) {
  Engine e(*model_, EngineConfig{.threads = 2, .max_context = 512});
  const std::string system =
      "Once upon a time, there was a little girl named Lily. She loved to play outside in the park with her "
      "friends. One day, she saw a big red ball.";
  Out a, b;
  e.submit(tok(system + " She"), greedy(8), collect(a));
  run_until_idle(e);
  e.submit(tok(system + " The"), greedy(8), collect(b));
  run_until_idle(e);
  const int32_t n = static_cast<int32_t>(tok(system).size());
  EXPECT_EQ(a.cached, 0);
  EXPECT_GE(b.cached, (n / 16) * 16 - 16);
  EXPECT_GT(b.cached, 0);
  MetricsSnapshot m = e.metrics();
  EXPECT_GT(m.prefix_cache_hit_tokens, 0u);
  EXPECT_EQ(m.kv_blocks_used, 0);
}

TEST_F(EngineTest, ChoicesShareThePrompt) {
  Engine e(*model_, EngineConfig{.threads = 2, .max_context = 256});
  RequestParams p;
  p.n = 3;
  p.max_tokens = 24;
  p.sampling.temperature = 1.0;
  p.sampling.seed = 7;
  Out o;
  e.submit(tok("Once upon a time"), p, collect(o));
  run_until_idle(e);
  EXPECT_EQ(o.finished, 3);
  ASSERT_EQ(o.text.size(), 3u);
  EXPECT_FALSE(o.text[0] == o.text[1] && o.text[1] == o.text[2]);
  EXPECT_EQ(e.metrics().kv_blocks_used, 0);
}

// Prompt logprobs (the OpenAI API's echo with max_tokens 0, as lm-eval-harness
// scores text) against llama.cpp's, made by scripts/gen_prompt_logprob_refs.py
// on this model with an f32 KV cache: in one pass, in 5-token chunks, after the
// same prompt was cached (a scored prompt computes every position anyway),
// and for both choices of n = 2.
TEST_F(EngineTest, PromptLogprobsMatchLlamaCpp) {
  const auto refs = nlohmann::json::parse(test::read_file(test::testdata_path("llamacpp/prompt_logprobs_stories260k.json")));
  for (int32_t budget : {0, 5}) {
    Engine e(*model_, EngineConfig{.threads = 2, .max_context = 256, .kv_cache = {KvType::kF32, KvType::kF32}, .max_batch_tokens = budget});
    for (const auto& cs : refs["cases"]) {
      const auto ids = cs["prompt_ids"].get<std::vector<int32_t>>();
      const auto want = cs["logprobs"].get<std::vector<double>>();
      const auto top1 = cs["top1"].get<std::vector<int32_t>>();
      const auto margin = cs["top2_margin"].get<std::vector<double>>();
      Out warm;
      e.submit(ids, greedy(2), collect(warm));
      run_until_idle(e);
      RequestParams p = greedy(0);
      p.prompt_logprobs = 2;
      p.n = 2;
      Out o;
      e.submit(ids, p, collect(o));
      run_until_idle(e);
      EXPECT_EQ(o.cached, 0);
      ASSERT_EQ(o.finished, 2);
      for (int32_t c = 0; c < 2; ++c) {
        EXPECT_EQ(o.reason[c], "length");
        EXPECT_TRUE(o.tokens[c].empty());
        const auto& lp = o.prompt_lp[c];
        const auto& top = o.prompt_top[c];
        ASSERT_EQ(lp.size(), ids.size());
        ASSERT_EQ(top.size(), ids.size());
        EXPECT_TRUE(std::isnan(lp[0].logprob));
        EXPECT_TRUE(top[0].empty());
        double worst = 0;
        for (size_t i = 1; i < ids.size(); ++i) {
          EXPECT_EQ(lp[i].token, ids[i]);
          worst = std::max(worst, std::abs(lp[i].logprob - want[i - 1]));
          ASSERT_EQ(top[i].size(), 2u);
          EXPECT_GE(top[i][0].logprob, top[i][1].logprob);
          EXPECT_GE(top[i][0].logprob, lp[i].logprob);
          if (margin[i - 1] > 1e-3) {
            EXPECT_EQ(top[i][0].token, top1[i - 1]) << "position " << i;
          }
        }
        EXPECT_LT(worst, 1e-4) << "budget " << budget;
      }
    }
    EXPECT_EQ(e.metrics().kv_blocks_used, 0);
  }
}

// Scored prompts under preemption (recomputed or swapped, mid-prompt too):
// the same prompt logprobs and text as alone, each prompt position reported
// once, no block lost.
TEST_F(EngineTest, PromptLogprobsSurvivePreemption) {
  std::vector<std::string> prompts = {
      "Once upon a time, there was a little girl named Lily. She loved to play outside in the sun.",
      "The little dog ran to the big tree and barked at the bird. The bird flew away to its nest.",
      "Lily and Tom went to the park to play. They saw a big slide and a swing and ran to them.",
      "One day, a bird"};
  auto params = [] {
    RequestParams p = greedy(60);
    p.prompt_logprobs = 1;
    return p;
  };
  std::vector<Out> alone(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    Engine e(*model_, EngineConfig{.threads = 2, .max_context = 128});
    e.submit(tok(prompts[i]), params(), collect(alone[i]));
    run_until_idle(e);
  }
  for (int64_t swap : {int64_t{0}, int64_t{64} << 20}) {
    Engine e(*model_, EngineConfig{.threads = 2, .max_context = 128, .kv_tokens = 128, .max_batch_tokens = 6,
                                   .max_seqs = 4, .swap_bytes = swap});
    std::vector<Out> outs(prompts.size());
    for (size_t i = 0; i < prompts.size(); ++i) e.submit(tok(prompts[i]), params(), collect(outs[i]));
    run_until_idle(e);
    const MetricsSnapshot m = e.metrics();
    EXPECT_GT(m.preemptions, 0u) << "swap " << swap;
    EXPECT_EQ(m.kv_blocks_used, 0);
    for (size_t i = 0; i < prompts.size(); ++i) {
      EXPECT_EQ(outs[i].text[0], alone[i].text[0]) << i;
      const auto& a = alone[i].prompt_lp[0];
      const auto& b = outs[i].prompt_lp[0];
      ASSERT_EQ(a.size(), b.size()) << i;
      for (size_t k = 1; k < a.size(); ++k) {
        EXPECT_EQ(b[k].logprob, a[k].logprob) << i << " position " << k;
        EXPECT_EQ(outs[i].prompt_top[0][k][0].token, alone[i].prompt_top[0][k][0].token);
      }
    }
  }
}

// response_format json_object: whatever the model would say, the output is
// always the start of a JSON object, and an output that ends with "stop" is
// exactly one (greedy and sampled, several choices at once).
TEST_F(EngineTest, JsonObjectOutputIsValidJson) {
  Engine e(*model_, EngineConfig{.threads = 2, .max_context = 256});
  int complete = 0, outputs = 0;
  for (uint64_t seed = 0; seed < 6; ++seed) {
    RequestParams p = greedy(120);
    p.json_object = true;
    if (seed > 0) {
      p.sampling.temperature = 1.0f;
      p.sampling.top_k = 0;
      p.sampling.top_p = 1.0f;
      p.sampling.min_p = 0.0f;
      p.sampling.seed = seed;
      p.n = 2;
    }
    Out o;
    e.submit(tok("Once upon a time"), p, collect(o));
    run_until_idle(e);
    ASSERT_EQ(o.finished, p.n);
    for (const auto& [c, text] : o.text) {
      ++outputs;
      JsonRecognizer r;
      EXPECT_TRUE(r.feed(text)) << text;
      if (o.reason[c] == "stop") {
        ++complete;
        EXPECT_TRUE(r.complete()) << text;
        EXPECT_TRUE(nlohmann::json::parse(text).is_object()) << text;
      } else {
        EXPECT_EQ(o.reason[c], "length") << text;
        EXPECT_EQ(o.tokens[c].size(), 120u);
      }
    }
  }
  std::printf("[ json ] %d of %d outputs complete objects\n", complete, outputs);
  // This tiny model rarely closes an object on its own; pushed towards '}'
  // (refused until an object is open), the output is "{}" and ends there.
  const std::vector<int32_t> close = tok("}");
  RequestParams p = greedy(50);
  p.json_object = true;
  p.sampling.logit_bias = {{close.back(), 100.0f}};
  Out o;
  e.submit(tok("Once upon a time"), p, collect(o));
  run_until_idle(e);
  EXPECT_EQ(o.reason[0], "stop");
  EXPECT_EQ(nlohmann::json::parse(o.text[0]), nlohmann::json::object()) << o.text[0];
  // A schema leaves this model no freedom but the enum's choice and
  // whitespace (at most 20 in a row, in 6 places: 200 tokens always suffice):
  // the output is one of the two objects, and ends there.
  RequestParams sp = greedy(200);
  sp.json_schema = std::make_shared<const CompiledSchema>(compile_schema(nlohmann::json::parse(
      R"({"type": "object", "properties": {"pet": {"enum": ["cat", "dog"]}}, "required": ["pet"]})")));
  sp.sampling.temperature = 1.0f;
  sp.sampling.seed = 5;
  sp.n = 4;
  Out so;
  e.submit(tok("Once upon a time"), sp, collect(so));
  run_until_idle(e);
  ASSERT_EQ(so.finished, 4);
  for (const auto& [c, text] : so.text) {
    EXPECT_EQ(so.reason[c], "stop") << text;
    const auto j = nlohmann::json::parse(text);
    EXPECT_TRUE(j == nlohmann::json::parse(R"({"pet":"cat"})") || j == nlohmann::json::parse(R"({"pet":"dog"})"))
        << text;
  }
  EXPECT_EQ(e.metrics().kv_blocks_used, 0);
}

// Sampling at temperature 1 through a schema with arrays, nesting, enums and
// numbers: this model writes near-random text, so it walks many paths of
// the recognizer. None may reach a dead end (no token allowed: the request
// would fail), and every finished object fits the schema.
TEST_F(EngineTest, JsonSchemaSamplingNeverDeadEnds) {
  Engine e(*model_, EngineConfig{.threads = 2, .max_context = 512});
  const auto schema = std::make_shared<const CompiledSchema>(compile_schema(nlohmann::json::parse(R"({
    "type": "object", "required": ["id", "tags", "pos"], "additionalProperties": false,
    "properties": {
      "id": {"type": "integer"}, "name": {"type": ["string", "null"]},
      "tags": {"type": "array", "items": {"enum": ["a", "bb", 7]}, "minItems": 1, "maxItems": 2},
      "pos": {"type": "object", "properties": {"x": {"type": "number"}, "y": {"type": "boolean"}},
              "required": ["x"]}}})")));
  int stopped = 0, outputs = 0;
  for (uint64_t seed = 1; seed <= 6; ++seed) {
    RequestParams p = greedy(400);
    p.json_schema = schema;
    p.sampling.temperature = 1.0f;
    p.sampling.top_k = 0;
    p.sampling.top_p = 1.0f;
    p.sampling.min_p = 0.0f;
    p.sampling.seed = seed;
    p.n = 3;
    Out o;
    e.submit(tok("Once upon a time"), p, collect(o));
    run_until_idle(e);
    ASSERT_EQ(o.finished, 3);
    for (const auto& [c, text] : o.text) {
      ++outputs;
      ASSERT_NE(o.reason[c], "error") << text;
      JsonRecognizer r(JsonRecognizer::Limits{}, schema.get());
      EXPECT_TRUE(r.feed(text)) << text;
      if (o.reason[c] != "stop") continue;
      ++stopped;
      const auto j = nlohmann::json::parse(text);
      EXPECT_TRUE(j["id"].is_number_integer()) << text;
      EXPECT_TRUE(j["tags"].size() >= 1 && j["tags"].size() <= 2) << text;
      EXPECT_TRUE(j["pos"]["x"].is_number()) << text;
    }
  }
  std::printf("[ json ] schema: %d of %d outputs complete\n", stopped, outputs);
  EXPECT_GT(stopped, 0);
}

// A pool too small for all sequences at once forces preemption; everything
// still finishes with the same text, and no block leaks. Preempted sequences
// are recomputed, or with swap space keep their K/V in host memory and come
// back without recomputing it (fewer prompt rows run). A request whose prompt
// is another's gets its leading blocks from the prefix cache again when it
// comes back.
TEST_F(EngineTest, PreemptionRecomputesOrSwapsAndLeaksNothing) {
  std::vector<std::string> prompts = {"Once upon a time", "The little dog", "Lily and Tom", "One day, a bird",
                                      "Once upon a time"};
  std::vector<std::string> alone;
  for (auto& pr : prompts) {
    Engine e(*model_, EngineConfig{.threads = 2, .max_context = 128});
    Out o;
    e.submit(tok(pr), greedy(100), collect(o));
    run_until_idle(e);
    alone.push_back(o.text[0]);
  }
  auto squeezed = [&](int64_t swap_bytes, std::vector<Out>& outs) {
    // 12 blocks of 16 = 192 tokens for five sequences of ~105 tokens.
    Engine e(*model_, EngineConfig{.threads = 2, .max_context = 128, .kv_tokens = 192, .max_seqs = 5,
                                   .swap_bytes = swap_bytes});
    outs.assign(prompts.size(), Out{});
    for (size_t i = 0; i < prompts.size(); ++i) e.submit(tok(prompts[i]), greedy(100), collect(outs[i]));
    int64_t most_swapped = 0;
    for (int i = 0; i < 100000 && e.step(); ++i) most_swapped = std::max(most_swapped, e.metrics().swapped);
    MetricsSnapshot m = e.metrics();
    EXPECT_EQ(m.kv_blocks_used, 0);
    EXPECT_EQ(m.kv_blocks_free, m.kv_blocks_total);
    EXPECT_EQ(m.swapped, 0);
    return std::pair{m, most_swapped};
  };
  std::vector<Out> recomputed, swapped;
  const auto [rm, rmost] = squeezed(0, recomputed);
  const auto [sm, smost] = squeezed(int64_t{64} << 20, swapped);
  EXPECT_GT(rm.preemptions, 0u);
  EXPECT_EQ(rm.swap_outs, 0u);
  EXPECT_EQ(rmost, 0);
  EXPECT_GT(sm.swap_outs, 0u);
  EXPECT_EQ(sm.swap_outs, sm.preemptions);
  EXPECT_GT(smost, 0);
  EXPECT_LT(sm.prompt_tokens, rm.prompt_tokens);  // nothing recomputed
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(recomputed[i].text[0], alone[i]) << i;
    EXPECT_EQ(swapped[i].text[0], alone[i]) << i;
  }
  // Space for less than one sequence's blocks: every preemption recomputes.
  std::vector<Out> tight;
  const auto [tm, tmost] = squeezed(1000, tight);
  EXPECT_GT(tm.preemptions, 0u);
  EXPECT_EQ(tm.swap_outs, 0u);
  for (size_t i = 0; i < prompts.size(); ++i) EXPECT_EQ(tight[i].text[0], alone[i]) << i;
}

TEST_F(EngineTest, CancelWhileSwappedFreesEverything) {
  Engine e(*model_, EngineConfig{.threads = 2, .max_context = 128, .kv_tokens = 192, .max_seqs = 4,
                                 .swap_bytes = int64_t{64} << 20});
  std::vector<Out> outs(4);
  std::vector<uint64_t> ids;
  const char* prompts[] = {"Once upon a time", "The little dog", "Lily and Tom", "One day, a bird"};
  for (int i = 0; i < 4; ++i) ids.push_back(e.submit(tok(prompts[i]), greedy(100), collect(outs[i])));
  for (int i = 0; i < 100000 && e.metrics().swapped == 0; ++i) ASSERT_TRUE(e.step());
  for (uint64_t id : ids) e.cancel(id);
  run_until_idle(e);
  MetricsSnapshot m = e.metrics();
  EXPECT_EQ(m.requests_cancelled, 4u);
  EXPECT_EQ(m.swapped, 0);
  EXPECT_EQ(m.running, 0);
  EXPECT_EQ(m.kv_blocks_used, 0);
  for (const Out& o : outs) EXPECT_EQ(o.reason.at(0), "cancelled");
}

TEST_F(EngineTest, CancelFreesBlocks) {
  Engine e(*model_, EngineConfig{.threads = 2, .max_context = 256});
  Out a, b;
  uint64_t id = e.submit(tok("Once upon a time"), greedy(200), collect(a));
  e.submit(tok("The little dog"), greedy(10), collect(b));
  for (int i = 0; i < 5; ++i) e.step();
  e.cancel(id);
  run_until_idle(e);
  EXPECT_EQ(a.reason[0], "cancelled");
  EXPECT_EQ(b.reason[0], "length");
  MetricsSnapshot m = e.metrics();
  EXPECT_EQ(m.requests_cancelled, 1u);
  EXPECT_EQ(m.kv_blocks_used, 0);
}

// A request of n choices cancelled before its prompt ran: every choice ends
// (the others were never forked), and the request counts as finished.
TEST_F(EngineTest, CancelBeforeForkEndsEveryChoice) {
  Engine e(*model_, EngineConfig{.threads = 1, .max_context = 256});
  Out a;
  RequestParams p = greedy(20);
  p.n = 4;
  const uint64_t id = e.submit(tok("Once upon a time"), p, collect(a));
  e.cancel(id);
  run_until_idle(e);
  EXPECT_EQ(a.finished, 4);
  for (int32_t c = 0; c < 4; ++c) EXPECT_EQ(a.reason.at(c), "cancelled") << c;
  const MetricsSnapshot m = e.metrics();
  EXPECT_EQ(m.requests_finished, 1u);
  EXPECT_EQ(m.kv_blocks_used, 0);
}

// Pool and swap space are committed lazily, so sizes beyond the memory
// available are refused at start, not found out by the OOM killer later.
TEST_F(EngineTest, PoolOrSwapBeyondTheAvailableMemoryIsRefused) {
  const auto avail = available_memory_bytes();
  ASSERT_TRUE(avail.has_value());
  const int64_t too_much = static_cast<int64_t>(*avail) + (int64_t{1} << 30);
  for (const EngineConfig& c : {EngineConfig{.threads = 1, .max_context = 64, .kv_bytes = too_much},
                                EngineConfig{.threads = 1, .max_context = 64, .swap_bytes = too_much}}) {
    try {
      Engine e(*model_, c);
      FAIL() << "expected the engine to refuse " << too_much << " bytes";
    } catch (const Error& err) {
      EXPECT_EQ(err.kind(), ErrorKind::kResource);
      EXPECT_NE(std::string(err.what()).find("memory available"), std::string::npos) << err.what();
    }
  }
  EXPECT_THROW(Engine(*model_, EngineConfig{.threads = 1, .max_context = 64, .swap_bytes = -1}), Error);

  // The default pool takes at most half of what is available, and says so when
  // that cannot hold one context.
  const size_t per_token = KvCache::bytes_per_token(model_->kv_shape(), KvFormat{});
  {
    Engine e(*model_, EngineConfig{.threads = 1, .max_context = 64, .memory_available = per_token * 1000});
    EXPECT_EQ(e.metrics().kv_blocks_total, 500 / 16);
  }
  try {
    Engine e(*model_, EngineConfig{.threads = 1, .max_context = 64, .memory_available = per_token * 100});
    ADD_FAILURE() << "expected the default pool to be refused";
  } catch (const Error& err) {
    EXPECT_EQ(err.kind(), ErrorKind::kResource);
    EXPECT_NE(std::string(err.what()).find("half the memory available"), std::string::npos) << err.what();
  }
}

TEST_F(EngineTest, BoundedWaitQueueAndBadRequests) {
  // One runs, two wait, the fourth is refused.
  Engine e(*model_, EngineConfig{.threads = 1, .max_context = 64, .max_seqs = 1, .max_waiting = 2});
  Out o;
  for (int i = 0; i < 3; ++i) e.submit(tok("Once"), greedy(4), collect(o));
  try {
    e.submit(tok("Once"), greedy(4), collect(o));
    FAIL() << "expected an overload error";
  } catch (const Error& err) {
    EXPECT_EQ(err.kind(), ErrorKind::kResource);
  }
  EXPECT_THROW(e.submit({}, greedy(4), collect(o)), Error);
  EXPECT_THROW(e.submit(std::vector<int32_t>(64, 403), greedy(4), collect(o)), Error);
  EXPECT_THROW(e.submit({1, 99999}, greedy(4), collect(o)), Error);
  RequestParams bad = greedy(4);
  bad.sampling.top_p = 3;
  EXPECT_THROW(e.submit(tok("Once"), bad, collect(o)), Error);
  run_until_idle(e);
  EXPECT_EQ(o.finished, 3);
}

// Admission counts only sequences that cannot start: with 32 slots free and
// room for 4 to wait, 36 requests are taken and the 37th is refused, whether
// or not the engine has picked any up yet.
TEST_F(EngineTest, AdmissionCountsOnlyWhatWaits) {
  Engine e(*model_, EngineConfig{.threads = 1, .max_context = 64, .max_seqs = 32, .max_waiting = 4});
  Out o;
  for (int i = 0; i < 36; ++i) e.submit(tok("Once"), greedy(2), collect(o));
  EXPECT_THROW(e.submit(tok("Once"), greedy(2), collect(o)), Error);
  e.step();  // picked up: still 36 in flight, still full
  EXPECT_THROW(e.submit(tok("Once"), greedy(2), collect(o)), Error);
  run_until_idle(e);
  EXPECT_EQ(o.finished, 36);
  e.submit(tok("Once"), greedy(2), collect(o));  // room again once they are done
  run_until_idle(e);
  EXPECT_EQ(o.finished, 37);
}

// Chunked prefill: while a long prompt is prefilled in chunks, a running
// decode still gets a token every step. Both with prompt chunks sized by
// tokens alone and with the pacer sizing them by measured step cost.
TEST_F(EngineTest, LongPromptDoesNotStallDecodes) {
  for (double factor : {0.0, 1.5}) {
    EngineConfig cfg{.threads = 2, .max_context = 512, .max_batch_tokens = 32, .step_factor = factor};
    Engine e(*model_, cfg);
    Out chat, longp;
    e.submit(tok("Once upon a time"), greedy(400), collect(chat));
    for (int i = 0; i < 3; ++i) e.step();  // the chat is decoding now
    std::string big;
    for (int i = 0; i < 20; ++i) big += "The little dog ran to the park and played with a ball. ";
    e.submit(tok(big), greedy(4), collect(longp));
    size_t before = chat.tokens[0].size();
    int steps = 0;
    while (longp.tokens[0].empty() && chat.finished == 0 && e.step()) {
      ++steps;
      ASSERT_EQ(chat.tokens[0].size(), before + steps) << "the chat missed a token at step " << steps;
    }
    EXPECT_FALSE(longp.tokens[0].empty()) << "the long prompt was not done while the chat ran";
    EXPECT_GT(steps, 5);  // the prompt really was chunked
    run_until_idle(e);
    EXPECT_EQ(longp.reason[0], "length");
  }
}

}  // namespace
}  // namespace tandem

namespace tandem {
namespace {

struct SessionRun {
  std::vector<int32_t> tokens;
  int32_t cached = 0;
  RequestTimings timings;
  std::string reason;
};

SessionRun submit_and_run(Engine& e, std::vector<int32_t> prompt, int32_t max_tokens, const std::string& session) {
  RequestParams p;
  p.sampling.temperature = 0;
  p.max_tokens = max_tokens;
  p.session = session;
  SessionRun r;
  e.submit(std::move(prompt), p, [&r](const RequestEvent& ev) {
    r.tokens.insert(r.tokens.end(), ev.tokens.begin(), ev.tokens.end());
    r.cached = std::max(r.cached, ev.cached_prompt_tokens);
    if (ev.finished) {
      r.timings = ev.timings;
      r.reason = ev.finish_reason;
    }
  });
  while (e.step()) e.check_invariants();
  return r;
}

// Progressive prefill: a session's prompt is computed ahead (max_tokens 0);
// the request that follows with a longer or edited text resumes from it to
// the token, and its output is what a fresh engine gives.
TEST_F(EngineTest, SessionsResumeToTheToken) {
  const std::string a = "Once upon a time, there was a little girl named Lily. She loved to play outside";
  const std::vector<int32_t> typed = tok(a);                       // what was typed so far
  const std::vector<int32_t> full = tok(a + " in the park with her dog.");  // what was sent
  const std::vector<int32_t> edited = tok(a.substr(0, 60) + " and a big cat.");  // an edit mid-text
  ASSERT_NE(typed.size() % 16, 0u);
  Engine fresh(*model_, EngineConfig{.threads = 2, .max_context = 256});
  const SessionRun want_full = submit_and_run(fresh, full, 20, "");
  const SessionRun want_edit = submit_and_run(fresh, edited, 20, "");

  Engine e(*model_, EngineConfig{.threads = 2, .max_context = 256});
  const SessionRun pre = submit_and_run(e, typed, 0, "s1");
  EXPECT_EQ(pre.reason, "length");
  EXPECT_TRUE(pre.tokens.empty());
  EXPECT_EQ(e.metrics().sessions, 1);
  const SessionRun go = submit_and_run(e, full, 20, "s1");
  EXPECT_EQ(go.tokens, want_full.tokens);
  // Every typed token resumed, the partly filled last block included.
  size_t common = 0;
  while (common < typed.size() && typed[common] == full[common]) ++common;
  EXPECT_EQ(go.cached, static_cast<int32_t>(common));
  EXPECT_GT(go.cached % 16, 0);
  // An edit: resumed up to where the texts part, mid-block.
  submit_and_run(e, typed, 0, "s2");
  const SessionRun ed = submit_and_run(e, edited, 20, "s2");
  EXPECT_EQ(ed.tokens, want_edit.tokens);
  size_t shared = 0;
  while (shared < typed.size() && typed[shared] == edited[shared]) ++shared;
  EXPECT_EQ(ed.cached, static_cast<int32_t>(shared));
  // An unknown session is a plain request (prefix cache only), which then
  // starts that session.
  const SessionRun unknown = submit_and_run(e, full, 20, "nobody");
  EXPECT_EQ(unknown.tokens, want_full.tokens);
  EXPECT_EQ(unknown.cached % 16, 0);
  EXPECT_EQ(e.metrics().sessions, 3);
  EXPECT_LE(e.metrics().kv_blocks_used, 3);  // at most one pinned partial block each
}

// A request for exactly the tokens a session prefilled samples its first
// token from the logits the prefill kept: no step computes a prompt row, the
// first token comes out before the step's forward pass, and the output is a
// fresh engine's. Also when the prompt fills its last block (the prefix cache
// holds all of it) and for n > 1.
TEST_F(EngineTest, SessionsStartFromTheirKeptLogits) {
  std::vector<int32_t> partial = tok("Once upon a time, there was a little girl named Lily. She loved to play outside");
  std::vector<int32_t> whole = partial;
  whole.resize(16);
  ASSERT_NE(partial.size() % 16, 0u);
  ASSERT_GT(partial.size(), 16u);
  Engine fresh(*model_, EngineConfig{.threads = 2, .max_context = 256});
  Engine e(*model_, EngineConfig{.threads = 2, .max_context = 256});
  for (const std::vector<int32_t>& prompt : {partial, whole}) {
    const SessionRun want = submit_and_run(fresh, prompt, 12, "");
    const std::string id = "s" + std::to_string(prompt.size());
    submit_and_run(e, prompt, 0, id);
    const int64_t rows = e.metrics().prompt_tokens;
    // Another prefill of the same text computes nothing and keeps them.
    submit_and_run(e, prompt, 0, id);
    EXPECT_EQ(e.metrics().prompt_tokens, rows);
    RequestParams p;
    p.sampling.temperature = 0;
    p.max_tokens = 12;
    p.session = id;
    SessionRun go;
    e.submit(prompt, p, [&go](const RequestEvent& ev) {
      go.tokens.insert(go.tokens.end(), ev.tokens.begin(), ev.tokens.end());
      go.cached = std::max(go.cached, ev.cached_prompt_tokens);
      if (ev.finished) go.timings = ev.timings;
    });
    EXPECT_TRUE(e.step());
    EXPECT_EQ(go.tokens.size(), 1u) << "the first token before any forward pass";
    while (e.step()) e.check_invariants();
    EXPECT_EQ(go.tokens, want.tokens);
    EXPECT_EQ(go.cached, static_cast<int32_t>(prompt.size()));
    EXPECT_EQ(e.metrics().prompt_tokens, rows) << "no prompt row was computed";
  }
  // n = 2 at temperature 0: both choices start from the kept logits.
  const SessionRun want = submit_and_run(fresh, partial, 6, "");
  submit_and_run(e, partial, 0, "n2");
  RequestParams p;
  p.sampling.temperature = 0;
  p.max_tokens = 6;
  p.n = 2;
  p.session = "n2";
  std::vector<int32_t> got[2];
  e.submit(partial, p, [&got](const RequestEvent& ev) {
    got[ev.choice].insert(got[ev.choice].end(), ev.tokens.begin(), ev.tokens.end());
  });
  while (e.step()) e.check_invariants();
  EXPECT_EQ(got[0], want.tokens);
  EXPECT_EQ(got[1], want.tokens);
  EXPECT_EQ(e.metrics().kv_blocks_used, 3);  // the three sessions' pinned partial blocks
}

// Sessions expire; a session whose cached blocks were evicted is recomputed
// (never wrong); a prefill cancelled midway leaves no session and no blocks.
TEST_F(EngineTest, SessionsExpireAndSurviveEviction) {
  const std::vector<int32_t> p = tok("Once upon a time, there was a little girl named Lily. She loved to play");
  std::vector<int32_t> longer = p;
  for (int32_t t : tok(" with her ball in the garden")) longer.push_back(t);
  Engine fresh(*model_, EngineConfig{.threads = 2, .max_context = 256});
  const SessionRun want = submit_and_run(fresh, longer, 16, "");

  Engine e(*model_, EngineConfig{.threads = 1, .max_context = 256, .session_ttl_s = 0.0});
  submit_and_run(e, p, 0, "s");
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  e.step();  // expires it
  EXPECT_EQ(e.metrics().sessions, 0);
  EXPECT_EQ(e.metrics().kv_blocks_used, 0);

  // Eviction: a pool of 8 blocks; other requests take every cached block.
  Engine small(*model_, EngineConfig{.threads = 1, .max_context = 128, .kv_tokens = 128});
  auto evict = [&] {
    for (const char* other : {"The little dog ran to the park and played with the other dogs all day long",
                              "Tom and Sue went to the beach to build a big sand castle near the water"})
      submit_and_run(small, tok(other), 40, "");
  };
  submit_and_run(small, p, 0, "s");
  evict();
  const SessionRun after = submit_and_run(small, longer, 16, "s");
  EXPECT_EQ(after.tokens, want.tokens);
  EXPECT_LE(small.metrics().kv_blocks_used, 1);
  // The same tokens as the session's after eviction: its kept logits are not
  // enough, the prompt is recomputed.
  const SessionRun want_p = submit_and_run(fresh, p, 16, "");
  submit_and_run(small, p, 0, "t");
  evict();
  const SessionRun again = submit_and_run(small, p, 16, "t");
  EXPECT_EQ(again.tokens, want_p.tokens);
  EXPECT_LT(again.cached, static_cast<int32_t>(p.size()));

  // Cancelled mid-prefill: nothing kept.
  Engine c(*model_, EngineConfig{.threads = 1, .max_context = 256, .max_batch_tokens = 16});
  RequestParams pp;
  pp.max_tokens = 0;
  pp.session = "gone";
  const uint64_t id = c.submit(longer, pp, [](const RequestEvent&) {});
  c.step();
  c.cancel(id);
  while (c.step()) c.check_invariants();
  EXPECT_EQ(c.metrics().sessions, 0);
  EXPECT_EQ(c.metrics().kv_blocks_used, 0);
}

}  // namespace
}  // namespace tandem

// Gemma 3 270M Q4_K_M against llama.cpp (references made by
// scripts/gen_llamacpp_refs.py with llama-cpp-python on the same file).
#include <cmath>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "runtime/thread_pool.h"
#include "engine/llm_engine.h"
#include "kv/kv_cache.h"
#include "model/model.h"
#include "test_support.h"
#include "tokenizer/tokenizer.h"

namespace tandem {
namespace {

// Why the bounds below are what they are. A 270M model in Q4_K_M with int8
// activations is numerically chaotic: a 1e-6 change in one activation flips
// q8 roundings downstream. llama.cpp does not agree with itself across its own
// configurations on this file and prompt 0: feeding the prompt token by token
// (n_batch=1) instead of in one batch moves logits by up to 0.62 and changes
// the greedy text after 5 tokens; turning on flash attention moves them by up
// to 1.22 and changes it after 4 (measured with llama-cpp-python 0.3.36).
// So we require: logits within 1.5 of llama.cpp's; teacher-forced greedy
// choices identical wherever llama.cpp's top-2 margin is at least 0.5; and the
// free-running greedy text identical at least up to the first such near tie.
constexpr float kLogitBound = 1.5f;
constexpr float kTieMargin = 0.5f;

nlohmann::json load_refs() {
  return nlohmann::json::parse(test::read_file(test::testdata_path("llamacpp/gemma3_270m_q4_k_m.json")));
}

class Gemma3 : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string path = test::gemma_model_path();
    if (!path.empty()) model_ = Model::load(path).release();
  }
  static void TearDownTestSuite() {
    delete model_;
    model_ = nullptr;
  }
  static Model* model_;
};
Model* Gemma3::model_ = nullptr;

TEST_F(Gemma3, ConfigFromMetadata) {
  TANDEM_REQUIRE_GEMMA(path);
  const ModelConfig& c = model_->config();
  EXPECT_EQ(c.arch, Arch::kGemma3);
  EXPECT_EQ(c.n_layer, 18);
  EXPECT_EQ(c.n_embd, 640);
  EXPECT_EQ(c.n_head, 4);
  EXPECT_EQ(c.n_head_kv, 1);
  EXPECT_EQ(c.head_dim, 256);
  EXPECT_EQ(c.n_vocab, 262144);
  EXPECT_EQ(c.sliding_window, 512);
  // Every sixth layer is global.
  for (int il = 0; il < c.n_layer; ++il) EXPECT_EQ(c.layer_is_swa[il], il % 6 != 5) << il;
}

TEST_F(Gemma3, MatchesLlamaCppGreedyAndLogits) {
  TANDEM_REQUIRE_GEMMA(path);
  const nlohmann::json refs = load_refs();
  const ModelConfig& c = model_->config();
  ThreadPool pool(2);
  // Under the sanitizers (TANDEM_TEST_QUICK=1) two prompts and 8 steps cover
  // the same code paths at a fraction of the cost.
  const bool quick = std::getenv("TANDEM_TEST_QUICK") != nullptr;
  int n_cases = 0;
  for (const auto& cs : refs["cases"]) {
    if (quick && n_cases == 2) break;
    const std::string text = cs["prompt"].get<std::string>();
    SCOPED_TRACE(text);
    const auto prompt = model_->tokenizer().encode(text, true, true);
    ASSERT_EQ(prompt, cs["prompt_ids"].get<std::vector<int32_t>>());
    auto want = cs["greedy_ids"].get<std::vector<int32_t>>();
    auto margins = cs["greedy_margins"].get<std::vector<float>>();
    if (quick) {
      want.resize(8);
      margins.resize(8);
    }
    ASSERT_EQ(want.size(), margins.size());

    // Teacher-forced: run the prompt plus llama.cpp's greedy tokens through one
    // prefill with logits at every generated position, so each step is judged
    // on the same context llama.cpp saw.
    KvCache kv(model_->kv_shape(), 16, 16);
    SeqKv seq;
    std::vector<int32_t> all = prompt;
    all.insert(all.end(), want.begin(), want.end() - 1);
    ASSERT_TRUE(seq.reserve(kv, static_cast<int32_t>(all.size())));
    Batch batch;
    for (size_t i = 0; i < all.size(); ++i)
      batch.push_back({all[i], static_cast<int32_t>(i), 0, i + 1 >= prompt.size()});
    Logits logits;
    SeqKv* seqs[] = {&seq};
    model_->forward(batch, seqs, kv, pool, logits);
    ASSERT_EQ(logits.size(), want.size() * c.n_vocab);

    float worst = 0;
    for (const char* key : {"top_logits", "sample_logits"})
      for (const auto& e : cs[key]) worst = std::max(worst, std::abs(logits[e[0].get<int>()] - e[1].get<float>()));
    EXPECT_LE(worst, kLogitBound);

    int agree = 0, near_ties = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      const float* l = logits.data() + i * c.n_vocab;
      const int32_t ours = static_cast<int32_t>(std::max_element(l, l + c.n_vocab) - l);
      if (ours == want[i]) {
        ++agree;
      } else {
        ++near_ties;
        EXPECT_LT(margins[i], kTieMargin) << "step " << i << ": tandem picks " << ours << ", llama.cpp " << want[i];
      }
    }

    // Free-running greedy: identical up to the first near tie at least.
    const Completion r = test::greedy(*model_, prompt, static_cast<int32_t>(want.size()), false, 1024);
    size_t same = 0;
    while (same < want.size() && r.tokens[same] == want[same]) ++same;
    size_t first_tie = 0;
    while (first_tie < want.size() && margins[first_tie] >= kTieMargin) ++first_tie;
    EXPECT_GE(same, first_tie);
    std::printf("[ gemma3 ] %-32s logits max diff %.3f | teacher-forced %d/%zu agree | free-running identical for %zu/%zu\n",
                text.substr(0, 32).c_str(), worst, agree, want.size(), same, want.size());
    ++n_cases;
  }
  EXPECT_GE(n_cases, quick ? 2 : 5);
}

// Prompt logprobs through the serving engine (echo) against llama.cpp's
// (scripts/gen_prompt_logprob_refs.py, both with f16 K/V). The chaos above
// reaches these too: measured within 0.28 on both prompts; bounded at 0.75.
TEST_F(Gemma3, PromptLogprobsMatchLlamaCpp) {
  TANDEM_REQUIRE_GEMMA(path);
  const auto refs =
      nlohmann::json::parse(test::read_file(test::testdata_path("llamacpp/prompt_logprobs_gemma3_270m.json")));
  Engine e(*model_, EngineConfig{.threads = 2, .max_context = 512});
  for (const auto& cs : refs["cases"]) {
    const auto ids = cs["prompt_ids"].get<std::vector<int32_t>>();
    const auto want = cs["logprobs"].get<std::vector<double>>();
    const auto top1 = cs["top1"].get<std::vector<int32_t>>();
    const auto margin = cs["top2_margin"].get<std::vector<double>>();
    RequestParams p;
    p.max_tokens = 0;
    p.prompt_logprobs = 1;
    std::vector<TokenLogprob> lp;
    std::vector<std::vector<TokenLogprob>> top;
    e.submit(ids, p, [&](const RequestEvent& ev) {
      if (!ev.prompt_logprobs.empty()) {
        lp = ev.prompt_logprobs;
        top = ev.prompt_top_logprobs;
      }
    });
    while (e.step()) {
    }
    ASSERT_EQ(lp.size(), ids.size());
    double worst = 0;
    for (size_t i = 1; i < ids.size(); ++i) {
      worst = std::max(worst, std::abs(lp[i].logprob - want[i - 1]));
      if (margin[i - 1] >= kTieMargin) {
        EXPECT_EQ(top[i][0].token, top1[i - 1]) << "position " << i;
      }
    }
    std::printf("[ gemma3 ] prompt logprobs of %zu tokens: max diff %.3f\n", ids.size(), worst);
    EXPECT_LT(worst, 0.75);
  }
}

// Quantized KV caches through the serving engine: the pool holds tokens in
// proportion to the bytes per token; a prefix served from the cache, and
// sequences preempted and swapped out or recomputed, give the same greedy
// tokens as each request alone with the same cache type.
TEST_F(Gemma3, QuantizedCachesPageSwapAndShare) {
  TANDEM_REQUIRE_GEMMA(path);
  auto tokens_of = [](const std::vector<RequestEvent>& evs) {
    std::vector<int32_t> t;
    for (const auto& ev : evs) t.insert(t.end(), ev.tokens.begin(), ev.tokens.end());
    return t;
  };
  const std::vector<std::string> prompts = {"The GNU General Public License is", "Once upon a time",
                                            "The GNU General Public License is a free", "Water boils at"};
  int64_t f16_tokens = 0;
  for (KvType t : {KvType::kF16, KvType::kQ8_0, KvType::kQ4_0}) {
    // Under the sanitizers q4_0 alone: the other types' paths run in the kernel tests.
    if (test::quick() && t != KvType::kQ4_0) continue;
    SCOPED_TRACE(kv_type_name(t));
    const KvCacheTypes kv{t, t};
    {
      Engine sized(*model_, EngineConfig{.threads = 2, .max_context = 128, .kv_bytes = int64_t{8} << 20,
                                         .kv_cache = kv});
      const int64_t held = sized.metrics().kv_blocks_total * 16;
      // 34 and 18 bytes per 32 elements against 64.
      const int64_t want = t == KvType::kF16 ? 100 : t == KvType::kQ8_0 ? 185 : 350;
      if (t == KvType::kF16) f16_tokens = held;
      EXPECT_GE(held * 100, f16_tokens * want);
    }
    std::vector<std::vector<int32_t>> alone;
    for (const auto& pr : prompts) {
      // The context of the runs below: centered q4_0 keys' offsets follow it.
      Engine e(*model_, EngineConfig{.threads = 2, .max_context = 64, .kv_cache = kv, .prefix_caching = false});
      RequestParams p;
      p.sampling.temperature = 0;
      p.max_tokens = 40;
      alone.push_back(e.run_one(model_->tokenizer().encode(pr, true, false), p).tokens);
    }
    for (int64_t swap : {int64_t{0}, int64_t{64} << 20}) {
      // 7 blocks of 16 for four sequences of ~48 tokens: preemptions.
      Engine e(*model_, EngineConfig{.threads = 2, .max_context = 64, .kv_tokens = 112, .kv_cache = kv,
                                     .max_seqs = 4, .swap_bytes = swap});
      std::vector<std::vector<RequestEvent>> evs(prompts.size());
      for (size_t i = 0; i < prompts.size(); ++i) {
        RequestParams p;
        p.sampling.temperature = 0;
        p.max_tokens = 40;
        e.submit(model_->tokenizer().encode(prompts[i], true, false), p,
                 [&evs, i](const RequestEvent& ev) { evs[i].push_back(ev); });
      }
      for (int i = 0; i < 100000 && e.step(); ++i) {
      }
      const MetricsSnapshot m = e.metrics();
      EXPECT_GT(m.preemptions, 0u);
      EXPECT_EQ(m.swap_outs > 0, swap > 0);
      EXPECT_EQ(m.kv_blocks_used, 0);
      for (size_t i = 0; i < prompts.size(); ++i) EXPECT_EQ(tokens_of(evs[i]), alone[i]) << prompts[i];
    }
  }
}

// Sliding-window layers on pages of their own give back the blocks their
// window (512 positions) has passed: a long prompt holds far fewer blocks,
// and greedy output is the same as with every block kept (--swa-full),
// through the prefix cache, and through preemption with swap or recompute.
TEST_F(Gemma3, SlidingWindowLayersGiveBackBlocksAndKeepTheOutput) {
  TANDEM_REQUIRE_GEMMA(path);
  ASSERT_EQ(model_->config().sliding_window, 512);
  const std::vector<int32_t> text =
      model_->tokenizer().encode(test::read_file(test::testdata_path("perplexity/stories.txt")), true, false);
  const int32_t n = test::quick() ? 600 : 700;
  ASSERT_GT(static_cast<int32_t>(text.size()), n + 100);
  auto prompt_at = [&](int32_t from) {
    std::vector<int32_t> p{text[0]};  // BOS
    p.insert(p.end(), text.begin() + 1 + from, text.begin() + from + n);
    return p;
  };
  auto tokens_of = [](const std::vector<RequestEvent>& evs) {
    std::vector<int32_t> t;
    for (const auto& ev : evs) t.insert(t.end(), ev.tokens.begin(), ev.tokens.end());
    return t;
  };
  RequestParams greedy;
  greedy.sampling.temperature = 0;
  greedy.max_tokens = 12;
  // Blocks held while the sequence decodes (the gauges as of the step
  // after its second token).
  auto held_after_prefill = [&](Engine& e, const std::vector<int32_t>& prompt, std::vector<int32_t>& out) {
    std::vector<RequestEvent> evs;
    e.submit(prompt, greedy, [&](const RequestEvent& ev) { evs.push_back(ev); });
    int64_t held = -1;
    for (int i = 0; i < 100000 && e.step(); ++i)
      if (held < 0 && tokens_of(evs).size() >= 2) held = e.metrics().kv_blocks_used;
    out = tokens_of(evs);
    return held;
  };
  const EngineConfig base{.threads = 2, .max_context = 1024};
  EngineConfig full_cfg = base;
  full_cfg.kv_cache.swa_full = true;
  Engine full(*model_, full_cfg), windowed(*model_, base);
  EXPECT_EQ(full.metrics().kv_window, 0);
  EXPECT_EQ(windowed.metrics().kv_window, 512);
  // The same pool in bytes: six groups of three layers against one of eighteen.
  EXPECT_EQ(windowed.kv_bytes(), full.kv_bytes());
  EXPECT_EQ(windowed.metrics().kv_tokens_total, full.metrics().kv_tokens_total);
  std::vector<int32_t> want, got;
  const int64_t held_full = held_after_prefill(full, prompt_at(0), want);
  const int64_t held_windowed = held_after_prefill(windowed, prompt_at(0), got);
  ASSERT_EQ(want.size(), 12u);
  EXPECT_EQ(got, want);
  // Full: a block of all 18 layers per 16 positions. Windowed: as many
  // blocks of the 3 global layers, and each of the 5 windowed groups' blocks
  // from the one holding position n - 511 on: 209 against 264 layer-blocks of 3 at 700 tokens.
  const int64_t blocks = (n + 1 + 15) / 16;
  EXPECT_EQ(held_full, blocks);
  EXPECT_EQ(held_windowed, blocks + 5 * (blocks - (n + 1 - 511) / 16));
  // Again, from the prefix cache: the windowed groups' blocks are still cached.
  const uint64_t hits_before = windowed.metrics().prefix_cache_hit_tokens;
  held_after_prefill(windowed, prompt_at(0), got);
  EXPECT_EQ(got, want);
  EXPECT_GE(windowed.metrics().prefix_cache_hit_tokens - hits_before, uint64_t(n - 16));
  windowed.check_invariants();
  if (test::quick()) return;

  // Three prompts into a pool for about two: preemption, then swap or recompute.
  std::vector<std::vector<int32_t>> prompts = {prompt_at(0), prompt_at(40), prompt_at(80)};
  std::vector<std::vector<int32_t>> alone;
  for (const auto& p : prompts) {
    held_after_prefill(full, p, got);
    alone.push_back(got);
  }
  for (int64_t swap : {int64_t{0}, int64_t{64} << 20}) {
    SCOPED_TRACE(swap);
    Engine e(*model_, EngineConfig{.threads = 2, .max_context = 768, .kv_tokens = 1100, .max_seqs = 3,
                                   .prefix_caching = false, .swap_bytes = swap});
    std::vector<std::vector<RequestEvent>> evs(prompts.size());
    for (size_t i = 0; i < prompts.size(); ++i)
      e.submit(prompts[i], greedy, [&evs, i](const RequestEvent& ev) { evs[i].push_back(ev); });
    for (int i = 0; i < 100000 && e.step(); ++i) e.check_invariants();
    const MetricsSnapshot m = e.metrics();
    EXPECT_GT(m.preemptions, 0u);
    EXPECT_EQ(m.swap_outs > 0, swap > 0);
    EXPECT_EQ(m.kv_blocks_used, 0);
    for (size_t i = 0; i < prompts.size(); ++i) EXPECT_EQ(tokens_of(evs[i]), alone[i]) << i;
  }
}

}  // namespace
}  // namespace tandem

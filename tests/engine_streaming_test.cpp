// The streaming window (--kv-window N --kv-sinks S, StreamingLLM) through the
// serving engine, on stories260K with an f32 cache: a sequence generates far
// past its context in a constant number of blocks, and what it computes is
// StreamingLLM's attention as the paper writes it, checked against a
// reference that keeps every token at its position in the cache (kept keys
// moved down and turned back by the evicted count, the sinks left alone),
// where the engine turns the sinks on instead.
#include <algorithm>
#include <span>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/error.h"
#include "runtime/thread_pool.h"
#include "engine/llm_engine.h"
#include "kv/kv_cache.h"
#include "model/model.h"
#include "test_support.h"
#include "tokenizer/tokenizer.h"

namespace tandem {
namespace {

constexpr int32_t kSinks = 4, kWindow = 32, kBlock = 16, kContext = 128;

std::vector<int32_t> tokens_of(const std::vector<RequestEvent>& evs) {
  std::vector<int32_t> t;
  for (const auto& ev : evs) t.insert(t.end(), ev.tokens.begin(), ev.tokens.end());
  return t;
}

// StreamingLLM as the paper writes it: a token's position is its place in
// the cache. Once the cache holds a block more than sinks + window, the
// block after the sinks goes, and the later tokens move down with their keys
// turned back by as many positions. With heavy hitters (--kv-heavy H, H2O)
// H more positions stay between: every token's attention over the layers,
// heads and later queries is summed per position, and the block that goes is
// the one, of those after the sinks and older than the window, with the
// least sum. inside: evictions that were not the block leaving the window.
std::vector<int32_t> reference(Model& model, const std::vector<int32_t>& prompt, int32_t n_gen, int32_t window,
                               int32_t heavy, int32_t* inside = nullptr) {
  ThreadPool pool(2);
  KvCache kv(model.kv_shape(), kContext / kBlock + 1, kBlock, KvType::kF32);
  SeqKv seq;
  EXPECT_TRUE(seq.reserve(kv, kContext));
  std::vector<float> mass(kContext, 0.0f);
  seq.attn_mass = mass.data();
  const int32_t nv = model.config().n_vocab, width = model.kv_shape().k_width, vwidth = model.kv_shape().v_width;
  std::vector<float> k(static_cast<size_t>(width)), v(static_cast<size_t>(vwidth));
  std::vector<int32_t> out;
  Logits logits;
  std::vector<int32_t> feed = prompt;
  const int32_t limit = kSinks + heavy + window + kBlock;
  while (static_cast<int32_t>(out.size()) < n_gen) {
    // The prompt in the chunks the engine runs: up to the eviction point.
    for (size_t i = 0; i < feed.size();) {
      const size_t n = std::min(feed.size() - i, size_t(limit - seq.n_tokens));
      logits.clear();
      model.prefill(seq, std::span<const int32_t>(feed).subspan(i, n), kv, pool, logits);
      i += n;
      const int32_t held = seq.n_tokens;
      if (held < limit) continue;
      int32_t gap = kSinks;
      double least = 0;
      for (int32_t a = kSinks; a + kBlock <= held - window; a += kBlock) {
        double m = 0;
        for (int32_t p = a; p < a + kBlock; ++p) m += mass[p];
        if (a == kSinks || m < least) {
          least = m;
          gap = a;
        }
      }
      if (inside) *inside += gap + kBlock < held - window;
      for (int32_t l = 0; l < model.config().n_layer; ++l)
        for (int32_t j = gap; j + kBlock < held; ++j) {
          const int32_t from = j + kBlock;
          kv.read(l, seq.blocks[from / kBlock], from % kBlock, k.data(), v.data());
          model.rope_shift_key(l, k.data(), -kBlock);
          kv.write(l, seq.blocks[j / kBlock], j % kBlock, k.data(), v.data());
        }
      mass.erase(mass.begin() + gap, mass.begin() + gap + kBlock);
      mass.resize(kContext, 0.0f);
      seq.n_tokens = held - kBlock;
    }
    const float* row = logits.data() + logits.size() - nv;
    const int32_t next = static_cast<int32_t>(std::max_element(row, row + nv) - row);
    out.push_back(next);
    feed = {next};
  }
  return out;
}

class Streaming : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { model_ = Model::load(test::shared_path("models/gguf/stories260K.gguf")).release(); }
  static void TearDownTestSuite() {
    delete model_;
    model_ = nullptr;
  }
  static EngineConfig config(int32_t window) {
    EngineConfig c{.threads = 2, .max_context = kContext};
    c.kv_cache.k = c.kv_cache.v = KvType::kF32;
    c.kv_cache.window = window;
    c.kv_cache.sinks = kSinks;
    return c;
  }
  static Model* model_;
};
Model* Streaming::model_ = nullptr;

// Greedy tokens of one request run step by step, checking the engine's
// invariants; most_held: the most KV blocks in use at once.
struct Generated {
  std::vector<RequestEvent> events;
  std::vector<int32_t> tokens;
  int64_t most_held = 0;
};
Generated generate(Engine& e, const std::vector<int32_t>& prompt, int32_t n_gen) {
  RequestParams p;
  p.sampling.temperature = 0;
  p.max_tokens = n_gen;
  p.stop_at_eog = false;
  Generated g;
  e.submit(prompt, p, [&](const RequestEvent& ev) { g.events.push_back(ev); });
  for (int i = 0; i < 100000 && e.step(); ++i) {
    g.most_held = std::max(g.most_held, e.metrics().kv_blocks_used);
    e.check_invariants();
  }
  g.tokens = tokens_of(g.events);
  return g;
}

std::vector<int32_t> long_prompt(const Model& m) {
  // Past the eviction point (sinks + window + a block = 52): the prompt
  // slides through the window too, chunk by chunk.
  return m.tokenizer().encode(
      "Once upon a time, there was a little girl named Lily. She loved to play outside in the sun with her dog. "
      "One day, she saw a big red ball in the park. She ran to get it, but a boy took it first. Lily was sad.",
      true, false);
}

TEST_F(Streaming, RunsPastTheContextInConstantBlocksAsTheReferenceDoes) {
  const std::vector<int32_t> prompt = long_prompt(*model_);
  ASSERT_GT(prompt.size(), size_t(kSinks + kWindow + kBlock));
  const int32_t n_gen = test::quick() ? 160 : 400;  // the context is 128
  Engine e(*model_, config(kWindow));
  const Generated g = generate(e, prompt, n_gen);
  ASSERT_EQ(static_cast<int32_t>(g.tokens.size()), n_gen);
  EXPECT_EQ(g.events.back().finish_reason, "length");
  // Sinks and window, and the block filling before an eviction.
  EXPECT_LE(g.most_held, (kSinks + kWindow + kBlock + kBlock - 1) / kBlock);
  EXPECT_EQ(g.tokens, reference(*model_, prompt, n_gen, kWindow, 0));

  // Without the window the same request ends at the context.
  RequestParams p;
  p.sampling.temperature = 0;
  p.max_tokens = n_gen;
  p.stop_at_eog = false;
  Engine plain(*model_, config(0));
  const auto whole = plain.run_one(prompt, p);
  EXPECT_EQ(static_cast<int32_t>(whole.tokens.size() + prompt.size()), kContext);
  EXPECT_EQ(whole.stop_cause, "context");
}

// With heavy hitters kept between the sinks and the window, blocks leave
// from inside the kept range too; the tokens are H2O's, the blocks held
// stay constant, and the generation runs past the context.
TEST_F(Streaming, HeavyHittersEvictAsTheReferenceDoes) {
  constexpr int32_t kHeavy = 4 * kBlock, kShort = kBlock;
  // A text on which a block inside the kept range has the least attention
  // once (most evictions take the block leaving the window).
  const std::vector<int32_t> prompt = model_->tokenizer().encode(
      "Section 1. Definitions. In this document, the word program means any work that is released under these "
      "terms. Each person who receives a copy is called you. To modify a work means to copy from or adapt all or "
      "part of it. Section 2. Basic permissions. All rights are granted for the term of copyright.",
      true, false);
  const int32_t n_gen = test::quick() ? 160 : 300;
  EngineConfig c = config(kShort);
  c.kv_cache.heavy = kHeavy;
  Engine e(*model_, c);
  const Generated g = generate(e, prompt, n_gen);
  ASSERT_EQ(static_cast<int32_t>(g.tokens.size()), n_gen);
  EXPECT_LE(g.most_held, (kSinks + kHeavy + kShort + kBlock + kBlock - 1) / kBlock);
  int32_t inside = 0;
  EXPECT_EQ(g.tokens, reference(*model_, prompt, n_gen, kShort, kHeavy, &inside));
  EXPECT_GT(inside, 0) << "every eviction took the block leaving the window: none cut the kept range";
  // Not the plain window's tokens with the same blocks.
  Engine plain(*model_, config(kShort + kHeavy));
  EXPECT_NE(generate(plain, prompt, n_gen).tokens, g.tokens);
}

// Sequences preempted mid-stream come back, recomputed as a stream again or
// swapped in with their window, and give the tokens each gives alone. With
// heavy hitters only swapping guarantees it: a recomputed stream sums its
// attention in another order (prompt chunks, not single rows), so a near tie
// between two blocks' sums could go the other way.
TEST_F(Streaming, PreemptedStreamsGiveTheSameTokens) {
  RequestParams p;
  p.sampling.temperature = 0;
  p.max_tokens = test::quick() ? 120 : 250;
  p.stop_at_eog = false;
  const std::vector<std::string> texts = {"Once upon a time", "The little dog", "Lily and Tom went", "A big red ball"};
  for (int32_t heavy : {0, 2 * kBlock}) {
    EngineConfig base = config(kWindow);
    base.kv_cache.heavy = heavy;
    std::vector<std::vector<int32_t>> alone;
    {
      Engine e(*model_, base);
      for (const auto& t : texts) alone.push_back(e.run_one(model_->tokenizer().encode(t, true, false), p).tokens);
    }
    for (int64_t swap : {int64_t{0}, int64_t{16} << 20}) {
      if (heavy > 0 && swap == 0) continue;
      SCOPED_TRACE(testing::Message() << "heavy " << heavy << ", swap " << swap);
      EngineConfig c = base;
      // Four short prompts fit; four streams of 3-4 blocks (5-6 with the
      // heavy hitters) do not.
      c.kv_tokens = (heavy > 0 ? 18 : 12) * kBlock;
      c.max_seqs = 4;
      c.swap_bytes = swap;
      c.prefix_caching = false;
      Engine e(*model_, c);
      std::vector<std::vector<RequestEvent>> evs(texts.size());
      for (size_t i = 0; i < texts.size(); ++i) {
        e.submit(model_->tokenizer().encode(texts[i], true, false), p,
                 [&evs, i](const RequestEvent& ev) { evs[i].push_back(ev); });
      }
      for (int i = 0; i < 100000 && e.step(); ++i) e.check_invariants();
      for (size_t i = 0; i < texts.size(); ++i) EXPECT_EQ(tokens_of(evs[i]), alone[i]) << texts[i];
      EXPECT_GT(e.metrics().preemptions, 0u);
      EXPECT_EQ(e.metrics().swap_outs > 0, swap > 0);
      EXPECT_EQ(e.metrics().kv_blocks_used, 0);
    }
  }
}

TEST_F(Streaming, BadWindowsAreRefusedByName) {
  auto refusal = [&](const EngineConfig& c) {
    try {
      Engine e(*model_, c);
    } catch (const Error& err) {
      return std::string(err.what());
    }
    return std::string();
  };
  auto message = [&](int32_t window, int32_t sinks) {
    EngineConfig c = config(window);
    c.kv_cache.sinks = sinks;
    return refusal(c);
  };
  EXPECT_NE(message(4, 8).find("smaller than its sinks"), std::string::npos);
  EXPECT_NE(message(120, 4).find("needs a context of at least 140"), std::string::npos);
  EXPECT_NE(message(-1, 4).find("--kv-window"), std::string::npos);
  EXPECT_EQ(message(64, 0), "");  // no sinks: a plain sliding window

  auto heavy = [&](int32_t window, int32_t h, SpecMode spec) {
    EngineConfig c = config(window);
    c.kv_cache.heavy = h;
    c.spec.mode = spec;
    return refusal(c);
  };
  EXPECT_NE(heavy(0, 32, SpecMode::kOff).find("--kv-heavy 32 needs a streaming window"), std::string::npos);
  EXPECT_NE(heavy(32, 20, SpecMode::kOff).find("--kv-heavy 20 is not a multiple of the block size (16)"),
            std::string::npos);
  EXPECT_NE(heavy(32, -16, SpecMode::kOff).find("--kv-heavy -16"), std::string::npos);
  EXPECT_NE(heavy(64, 64, SpecMode::kOff).find("needs a context of at least 148"), std::string::npos);
  EXPECT_NE(heavy(32, 32, SpecMode::kNgram).find("does not combine with speculative decoding"), std::string::npos);
  EXPECT_EQ(heavy(32, 32, SpecMode::kOff), "");
}

}  // namespace
}  // namespace tandem

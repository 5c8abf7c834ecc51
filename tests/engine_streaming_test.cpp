// The streaming window (--kv-window N --kv-sinks S, StreamingLLM) through the
// serving engine, on stories260K with an f32 cache: a sequence generates far
// past its context in a constant number of blocks, and what it computes is
// StreamingLLM's attention as the paper writes it, checked against a
// reference that keeps every token at its position in the cache (kept keys
// moved down and turned back by the evicted count, the sinks left alone),
// where the engine turns the sinks on instead.
#include <algorithm>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/error.h"
#include "core/thread_pool.h"
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
// the cache. Once the cache holds a block more than sinks + window, as many
// whole blocks after the sinks as leave the window go, and the later tokens
// move down with their keys turned back by as many positions.
std::vector<int32_t> reference_stream(Model& model, std::vector<int32_t> prompt, int32_t n_gen) {
  ThreadPool pool(2);
  KvCache kv(model.kv_shape(), kContext / kBlock + 1, kBlock, KvType::kF32);
  SeqKv seq;
  EXPECT_TRUE(seq.reserve(kv, kContext));
  const int32_t nv = model.config().n_vocab, width = model.kv_shape().k_width, vwidth = model.kv_shape().v_width;
  std::vector<float> k(static_cast<size_t>(width)), v(static_cast<size_t>(vwidth));
  std::vector<int32_t> out;
  Logits logits;
  std::vector<int32_t> feed = prompt;
  while (static_cast<int32_t>(out.size()) < n_gen) {
    for (int32_t t : feed) {
      logits.clear();
      SeqKv* seqs[] = {&seq};
      const int32_t one[] = {t};
      model.decode(seqs, one, kv, pool, logits);
      const int32_t held = seq.n_tokens;
      if (held < kSinks + kWindow + kBlock) continue;
      const int32_t count = (held - kSinks - kWindow) / kBlock * kBlock;
      for (int32_t l = 0; l < model.config().n_layer; ++l)
        for (int32_t j = kSinks; j + count < held; ++j) {
          const int32_t from = j + count;
          kv.read(l, seq.blocks[from / kBlock], from % kBlock, k.data(), v.data());
          model.rope_shift_key(l, k.data(), -count);
          kv.write(l, seq.blocks[j / kBlock], j % kBlock, k.data(), v.data());
        }
      seq.n_tokens = held - count;
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
  RequestParams p;
  p.sampling.temperature = 0;
  p.max_tokens = n_gen;
  p.stop_at_eog = false;
  std::vector<RequestEvent> evs;
  e.submit(prompt, p, [&](const RequestEvent& ev) { evs.push_back(ev); });
  int64_t most_held = 0;
  for (int i = 0; i < 100000 && e.step(); ++i) {
    most_held = std::max(most_held, e.metrics().kv_blocks_used);
    e.check_invariants();
  }
  const std::vector<int32_t> got = tokens_of(evs);
  ASSERT_EQ(static_cast<int32_t>(got.size()), n_gen);
  EXPECT_EQ(evs.back().finish_reason, "length");
  // Sinks and window, and the block filling before an eviction.
  EXPECT_LE(most_held, (kSinks + kWindow + kBlock + kBlock - 1) / kBlock);
  EXPECT_EQ(got, reference_stream(*model_, prompt, n_gen));

  // Without the window the same request ends at the context.
  Engine plain(*model_, config(0));
  const auto whole = plain.run_one(prompt, p);
  EXPECT_EQ(static_cast<int32_t>(whole.tokens.size() + prompt.size()), kContext);
  EXPECT_EQ(whole.stop_cause, "context");
}

// Sequences preempted mid-stream come back, recomputed as a stream again or
// swapped in with their window, and give the tokens each gives alone.
TEST_F(Streaming, PreemptedStreamsGiveTheSameTokens) {
  RequestParams p;
  p.sampling.temperature = 0;
  p.max_tokens = test::quick() ? 120 : 250;
  p.stop_at_eog = false;
  const std::vector<std::string> texts = {"Once upon a time", "The little dog", "Lily and Tom went", "A big red ball"};
  std::vector<std::vector<int32_t>> alone;
  {
    Engine e(*model_, config(kWindow));
    for (const auto& t : texts) alone.push_back(e.run_one(model_->tokenizer().encode(t, true, false), p).tokens);
  }
  for (int64_t swap : {int64_t{0}, int64_t{16} << 20}) {
    SCOPED_TRACE(swap);
    EngineConfig c = config(kWindow);
    c.kv_tokens = 12 * kBlock;  // 12 blocks: four short prompts fit, four streams of 3-4 blocks do not
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

TEST_F(Streaming, BadWindowsAreRefusedByName) {
  auto message = [&](int32_t window, int32_t sinks) {
    EngineConfig c = config(window);
    c.kv_cache.sinks = sinks;
    try {
      Engine e(*model_, c);
    } catch (const Error& err) {
      return std::string(err.what());
    }
    return std::string();
  };
  EXPECT_NE(message(4, 8).find("smaller than its sinks"), std::string::npos);
  EXPECT_NE(message(120, 4).find("needs a context of at least 140"), std::string::npos);
  EXPECT_NE(message(-1, 4).find("--kv-window"), std::string::npos);
  EXPECT_EQ(message(64, 0), "");  // no sinks: a plain sliding window
}

}  // namespace
}  // namespace tandem

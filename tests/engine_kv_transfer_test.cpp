// A prompt's blocks moving from one engine (a prefill instance's) to another
// (a decode instance's), as RequestParams::on_kv_export and kv_import carry
// them: the importing engine answers exactly as if it had computed the
// prompt, also when the blocks go into its pool a few per step beside a
// decoding sequence, and a request cancelled halfway leaves no block held.
// On stories260K.
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "engine/kv_transfer.h"
#include "engine/llm_engine.h"
#include "model/model.h"
#include "test_support.h"
#include "tokenizer/tokenizer.h"

namespace tandem {
namespace {

class KvTransferEngineTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { model_ = Model::load(test::shared_path("models/gguf/stories260K.gguf")).release(); }
  static void TearDownTestSuite() {
    delete model_;
    model_ = nullptr;
  }
  static EngineConfig config(double share) {
    EngineConfig c;
    c.threads = 1;
    c.max_context = 512;
    c.kv_tokens = 2048;
    c.kv_import_share = share;
    return c;
  }
  // Over 6 blocks of 16: the first step's import (4 blocks while another
  // sequence decodes) leaves some for the next.
  std::vector<int32_t> prompt() const {
    const std::string s =
        "Once upon a time there was a little girl named Lily. She loved to play outside in the park with her "
        "friends. One day she saw a big red ball under a tree and ran to get it. Her mother called her home "
        "for dinner, and Lily brought the ball with her and showed it to her little brother Tom.";
    return model_->tokenizer().encode(s, true, true);
  }
  // The prompt's blocks as a prefill engine exports them.
  static KvBlockRun exported(const std::vector<int32_t>& p) {
    Engine e(*model_, config(1));
    KvBlockRun run;
    RequestParams params = test::greedy_to(1);
    params.on_kv_export = [&](KvBlockRun r) { run = std::move(r); };
    e.run_one(p, params);
    return run;
  }
  struct Out {
    std::vector<int32_t> tokens;
    std::string reason;
    int32_t cached = -1;
    bool finished = false;
  };
  static EventSink collect(Out& o) {
    return [&o](const RequestEvent& ev) {
      o.tokens.insert(o.tokens.end(), ev.tokens.begin(), ev.tokens.end());
      if (ev.finished) {
        o.finished = true;
        o.reason = ev.finish_reason;
        o.cached = ev.cached_prompt_tokens;
      }
    };
  }

  static Model* model_;
};
Model* KvTransferEngineTest::model_ = nullptr;

TEST_F(KvTransferEngineTest, ImportedPromptAnswersAsComputedBesideADecodingSequence) {
  const std::vector<int32_t> p = prompt();
  const int32_t n_full = static_cast<int32_t>(p.size()) / 16;
  ASSERT_GT(n_full, 5);
  const Completion want = Engine(*model_, config(1)).run_one(p, test::greedy_to(20));

  auto imp = std::make_shared<RequestParams::KvImport>();
  imp->run = exported(p);
  ASSERT_EQ(imp->run.n_blocks(), n_full);
  std::vector<KvImportResult> results;
  imp->done = [&](const KvImportResult& r) { results.push_back(r); };

  Engine e(*model_, config(0.01));
  Out other, got;
  e.submit(model_->tokenizer().encode("The cat sat on the mat", true, true), test::greedy_to(60), collect(other));
  for (int i = 0; i < 3; ++i) e.step();  // decoding now
  RequestParams params = test::greedy_to(20);
  params.kv_import = imp;
  e.submit(p, params, collect(got));
  while (e.step()) {
  }
  ASSERT_TRUE(got.finished);
  EXPECT_EQ(got.tokens, want.tokens);
  ASSERT_EQ(results.size(), 1u);  // `done` hears the whole run once
  EXPECT_EQ(results[0].loaded, n_full);
  EXPECT_EQ(results[0].cached, 0);
  EXPECT_TRUE(results[0].skipped.empty()) << results[0].skipped;
  EXPECT_EQ(got.cached, std::min<int32_t>(n_full * 16, static_cast<int32_t>(p.size()) - 1));
  EXPECT_TRUE(other.finished);
  EXPECT_EQ(other.tokens.size(), 60u);
}

TEST_F(KvTransferEngineTest, CancelledWhileItsBlocksGoInEndsAndHoldsNothing) {
  const std::vector<int32_t> p = prompt();
  auto imp = std::make_shared<RequestParams::KvImport>();
  imp->run = exported(p);
  std::vector<KvImportResult> results;
  imp->done = [&](const KvImportResult& r) { results.push_back(r); };
  Engine e(*model_, config(0.01));
  Out other, got;
  e.submit(model_->tokenizer().encode("The cat sat on the mat", true, true), test::greedy_to(40), collect(other));
  for (int i = 0; i < 3; ++i) e.step();
  RequestParams params = test::greedy_to(20);
  params.kv_import = imp;
  const uint64_t id = e.submit(p, params, collect(got));
  e.step();  // its first 4 blocks go in; the rest wait for later steps
  e.cancel(id);
  while (e.step()) {
  }
  ASSERT_TRUE(got.finished);
  EXPECT_EQ(got.reason, "cancelled");
  EXPECT_TRUE(got.tokens.empty());
  ASSERT_EQ(results.size(), 1u);
  EXPECT_EQ(results[0].loaded, 4);  // the first step's share, before anything was measured
  EXPECT_TRUE(other.finished);
  const MetricsSnapshot m = e.metrics();
  EXPECT_EQ(m.kv_blocks_used, 0);
  EXPECT_EQ(m.running + m.waiting, 0);
}

}  // namespace
}  // namespace tandem

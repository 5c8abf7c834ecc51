// The KV store (--kv-store): a restarted engine reads its prompt's blocks
// back and answers the same; damaged files and another model's are refused
// block by block and recomputed; the folder stays within its size. On
// stories260K and a synth model of its vocabulary.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "core/error.h"
#include "engine/kv_store.h"
#include "engine/llm_engine.h"
#include "kv/block_hash.h"
#include "gguf/synth.h"
#include "model/model.h"
#include "perf/bench.h"
#include "test_support.h"
#include "tokenizer/tokenizer.h"

namespace tandem {
namespace {
namespace fs = std::filesystem;

class KvStoreTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { model_ = Model::load(test::shared_path("models/gguf/stories260K.gguf")).release(); }
  static void TearDownTestSuite() {
    delete model_;
    model_ = nullptr;
  }
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("tandem_kv_store_" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  static EngineConfig config(const fs::path& dir, int64_t bytes = int64_t{1} << 30) {
    EngineConfig c;
    c.threads = 1;
    c.max_context = 256;
    c.kv_tokens = 1024;
    c.kv_store = dir.string();
    c.kv_store_bytes = bytes;
    return c;
  }
  std::vector<int32_t> prompt() const {
    const std::string s =
        "Once upon a time there was a little girl named Lily. She loved to play outside in the park with her "
        "friends. One day she saw a big red ball under a tree and ran to get it.";
    return model_->tokenizer().encode(s, true, true);
  }
  struct Run {
    Completion out;
    MetricsSnapshot m;
  };
  static Run run(Model& model, const EngineConfig& c, const std::vector<int32_t>& p) {
    Engine e(model, c);
    Run r;
    r.out = e.run_one(p, test::greedy_to(24));
    e.flush_kv_store();
    r.m = e.metrics();
    return r;
  }
  std::vector<fs::path> files() const {
    std::vector<fs::path> out;
    for (const auto& e : fs::directory_iterator(dir_))
      if (e.path().extension() == ".kvb") out.push_back(e.path());
    return out;
  }
  // The file of the prompt's block i.
  fs::path block_file(size_t i) const {
    return dir_ / fmt::format("{:016x}.kvb", prompt_block_hashes(prompt(), 16, "")[i]);
  }

  static Model* model_;
  fs::path dir_;
};
Model* KvStoreTest::model_ = nullptr;

TEST_F(KvStoreTest, RestartReadsThePromptBack) {
  const auto p = prompt();
  ASSERT_GE(p.size(), 48u);
  const size_t n_full = p.size() / 16;
  const Run first = run(*model_, config(dir_), p);
  EXPECT_EQ(first.m.store.blocks_read, 0u);
  EXPECT_GE(first.m.store.blocks_written, n_full);  // the prompt's, and the generated text's full blocks
  EXPECT_EQ(first.m.store.write_failures, 0u);
  EXPECT_GE(files().size(), n_full);

  const Run again = run(*model_, config(dir_), p);
  EXPECT_EQ(again.out.tokens, first.out.tokens);
  EXPECT_EQ(again.m.store.blocks_read, n_full);
  EXPECT_EQ(again.m.store.read_failures, 0u);
  // Every full block came from the store; a prompt of whole blocks still computes its last token.
  EXPECT_EQ(again.out.timings.cached_tokens, int32_t(std::min(n_full * 16, p.size() - 1)));
  EXPECT_EQ(again.m.store.blocks_written, 0u);  // nothing new to write for the prompt's blocks

  // Blocks from the store enter the cache as BlockStored KV events, named as computed ones are.
  Engine e(*model_, config(dir_));
  std::vector<uint64_t> stored;
  e.set_kv_event_sink([&](std::vector<KvCacheEvent> ev) {
    for (const KvCacheEvent& x : ev)
      if (x.kind == KvCacheEvent::Kind::kStored) stored.push_back(x.hash);
  });
  std::vector<int32_t> tokens;
  e.submit(p, test::greedy_to(24),
           [&](const RequestEvent& ev) { tokens.insert(tokens.end(), ev.tokens.begin(), ev.tokens.end()); });
  while (e.step()) {  // Engine::step publishes the step's KV events after it
  }
  EXPECT_EQ(tokens, first.out.tokens);
  const std::vector<uint64_t> names = prompt_block_hashes(p, 16, "");
  ASSERT_GE(stored.size(), n_full);
  EXPECT_EQ(std::vector<uint64_t>(stored.begin(), stored.begin() + ptrdiff_t(n_full)), names);
  EXPECT_EQ(e.metrics().store.blocks_read, n_full);
}

TEST_F(KvStoreTest, DamagedFilesAreRefusedAndRecomputed) {
  const auto p = prompt();
  const Run first = run(*model_, config(dir_), p);
  // Block 1 truncated: the walk stops there, block 0 still serves.
  fs::resize_file(block_file(1), fs::file_size(block_file(1)) - 100);
  Run again = run(*model_, config(dir_), p);
  EXPECT_EQ(again.out.tokens, first.out.tokens);
  EXPECT_EQ(again.m.store.blocks_read, 1u);
  EXPECT_EQ(again.m.store.read_failures, 1u);
  EXPECT_EQ(again.out.timings.cached_tokens, 16);
  EXPECT_GE(again.m.store.blocks_written, 1u);  // the recomputed block replaces the bad file

  // Block 0 corrupted in its payload: nothing from the store.
  {
    std::fstream f(block_file(0), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(std::streamoff(fs::file_size(block_file(0)) / 2));
    f.put('\x5a');
    f.put('\xa5');
  }
  again = run(*model_, config(dir_), p);
  EXPECT_EQ(again.out.tokens, first.out.tokens);
  EXPECT_EQ(again.m.store.blocks_read, 0u);
  EXPECT_EQ(again.m.store.read_failures, 1u);
  EXPECT_EQ(again.out.timings.cached_tokens, 0);

  // Both rewritten: all of them serve again.
  again = run(*model_, config(dir_), p);
  EXPECT_EQ(again.out.tokens, first.out.tokens);
  EXPECT_EQ(again.m.store.blocks_read, p.size() / 16);
  EXPECT_EQ(again.m.store.read_failures, 0u);
}

TEST_F(KvStoreTest, AnotherModelsBlocksAreRefused) {
  const auto p = prompt();
  // The same vocabulary, so that the same prompt names the same files.
  SynthSpec s;
  s.n_layer = 2;
  s.n_embd = 64;
  s.n_ff = 128;
  s.n_head = 4;
  s.n_head_kv = 4;
  s.vocab_from = test::shared_path("models/gguf/stories260K.gguf");
  const fs::path other_file = fs::temp_directory_path() / "tandem_kv_store_other.gguf";
  synth_model(s, other_file.string(), 1);
  auto other = Model::load(other_file.string());
  EngineConfig plain = config(dir_);
  plain.kv_store.clear();
  const Run alone = run(*other, plain, p);

  run(*model_, config(dir_), p);
  const Run refused = run(*other, config(dir_), p);
  EXPECT_EQ(refused.out.tokens, alone.out.tokens);
  EXPECT_EQ(refused.m.store.blocks_read, 0u);
  EXPECT_EQ(refused.m.store.read_failures, 1u);  // the first block; the walk ends there
  EXPECT_EQ(refused.out.timings.cached_tokens, 0);
  // It wrote its own over them; stories260K now refuses those the same way.
  const Run back = run(*model_, config(dir_), p);
  EXPECT_EQ(back.m.store.blocks_read, 0u);
  EXPECT_EQ(back.m.store.read_failures, 1u);
  fs::remove(other_file);
}

TEST_F(KvStoreTest, EvictsLeastRecentlyUsedBeyondItsSize) {
  const auto p = prompt();
  const Run first = run(*model_, config(dir_), p);
  ASSERT_GE(files().size(), 3u);
  const int64_t one = int64_t(fs::file_size(files()[0]));
  // Room for two files: the oldest go as the folder is taken stock of at start.
  const Run small = run(*model_, config(dir_, 2 * one + one / 2), p);
  EXPECT_LE(files().size(), 2u);
  EXPECT_GT(small.m.store.blocks_evicted, 0u);
  EXPECT_LE(small.m.store.bytes, 2 * one + one / 2);
  EXPECT_EQ(small.out.tokens, first.out.tokens);
}

// bench --kv-store: every repetition's prompt from the store, the same tokens.
TEST_F(KvStoreTest, BenchReadsEachRepetitionsPromptFromTheStore) {
  BenchOptions o;
  o.model_path = test::shared_path("models/gguf/stories260K.gguf");
  o.n_prompt = 64;
  o.n_gen = 4;
  o.reps = 2;
  o.threads = 1;
  const BenchResult plain = run_bench(o);
  o.kv_store = dir_.string();
  const BenchResult stored = run_bench(o);
  EXPECT_EQ(stored.tokens, plain.tokens);
  EXPECT_GE(files().size(), 64u / 16);
}

TEST_F(KvStoreTest, RefusesABadFolderOrSize) {
  fs::create_directories(dir_);
  const fs::path file = dir_ / "plain-file";
  std::ofstream(file) << "x";
  EXPECT_THROW(Engine(*model_, config(file)), Error);
  EXPECT_THROW(Engine(*model_, config(dir_, 0)), Error);
  EngineConfig no_cache = config(dir_);
  no_cache.prefix_caching = false;
  EXPECT_THROW(Engine(*model_, no_cache), Error);
}

}  // namespace
}  // namespace tandem

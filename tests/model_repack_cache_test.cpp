// The repack cache (model/repack_cache.h): a second load maps the repacked
// weights from the cache file and gives the same logits bit for bit; a file
// that does not match (truncated, another key, the model changed) is a miss
// and is rewritten; a directory that cannot be written leaves a warning and
// a working model.
#include <sys/stat.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "gguf/synth.h"
#include "runtime/thread_pool.h"
#include "kernels/vec_dot_impl.h"
#include "kernels/layouts.h"
#include "kv/kv_cache.h"
#include "model/model.h"
#include "test_support.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;

fs::path temp(const std::string& name) {
  return fs::temp_directory_path() / ("tandem_repack_cache_" + std::to_string(::getpid()) + "_" + name);
}

// Prefill of a short prompt, then three decode steps: every logit.
Logits run(Model& m) {
  ThreadPool pool(2);
  KvCache kv(m.kv_shape(), 4, 16);
  SeqKv seq;
  EXPECT_TRUE(seq.reserve(kv, 16));
  const std::vector<int32_t> prompt = {1, 72, 300, 17, 45, 9, 400, 3};
  Logits out;
  m.prefill(seq, prompt, kv, pool, out);
  for (int32_t t : {5, 77, 311}) {
    SeqKv* seqs[] = {&seq};
    const int32_t one[] = {t};
    m.decode(seqs, one, kv, pool, out);
  }
  return out;
}

std::vector<fs::path> cache_files(const fs::path& dir) {
  std::vector<fs::path> out;
  if (fs::exists(dir))
    for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path());
  return out;
}

TEST(RepackCache, SecondLoadMapsTheSameWeights) {
  // q8_0 panels, q4_0 tiles with a tied embedding (qwen2: lookups read the
  // new layout), f16 tiles.
  struct Case {
    const char* arch;
    const char* type;
  };
  for (const Case& c : {Case{"llama", "q8_0"}, Case{"qwen2", "q4_0"}, Case{"llama", "f16"}}) {
    SCOPED_TRACE(std::string(c.arch) + " " + c.type);
    SynthSpec s;
    s.arch = c.arch;
    s.type = c.type;
    s.n_layer = 2, s.n_embd = 64, s.n_ff = 96, s.n_head = 4, s.n_head_kv = 2;
    s.vocab_from = test::shared_path("models/gguf/stories260K.gguf");
    const fs::path gguf = temp(std::string(c.arch) + c.type + ".gguf"), dir = temp(std::string(c.arch) + c.type);
    fs::remove_all(dir);
    synth_model(s, gguf.string(), 1);
    const Logits want = run(*Model::load(gguf.string(), {.prepack = PrepackMode::kOff}));
    auto load = [&](PrepackMode mode) {
      return Model::load(gguf.string(), {.prepack = mode, .repack_cache = dir.string()});
    };

    auto first = load(PrepackMode::kAuto);
    if (first->packed_bytes() == 0) {  // nothing repacked at this kernel level: nothing to cache
      EXPECT_TRUE(cache_files(dir).empty());
      fs::remove(gguf);
      continue;
    }
    EXPECT_FALSE(first->repack_cache_hit());
    EXPECT_EQ(first->load_warning(), "");
    EXPECT_EQ(run(*first), want);
    ASSERT_EQ(cache_files(dir).size(), 1u);
    const fs::path file = cache_files(dir)[0];

    auto second = load(PrepackMode::kAuto);
    EXPECT_TRUE(second->repack_cache_hit());
    EXPECT_EQ(second->packed_bytes(), first->packed_bytes());
    EXPECT_EQ(run(*second), want);
    second.reset();

    // Truncated: a miss, repacked and written again.
    fs::resize_file(file, fs::file_size(file) - 1);
    auto third = load(PrepackMode::kAuto);
    EXPECT_FALSE(third->repack_cache_hit());
    EXPECT_EQ(run(*third), want);
    EXPECT_TRUE(load(PrepackMode::kAuto)->repack_cache_hit());

    // A header byte changed (the key): a miss.
    {
      std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
      f.seekp(20);
      f.put('#');
    }
    EXPECT_FALSE(load(PrepackMode::kAuto)->repack_cache_hit());

    // Another prepack mode has a file of its own; the model file changing
    // (its modification time) makes both misses, rewritten in place.
    EXPECT_FALSE(load(PrepackMode::kAll)->repack_cache_hit());
    EXPECT_EQ(cache_files(dir).size(), 2u);
    fs::last_write_time(gguf, fs::last_write_time(gguf) + std::chrono::seconds(5));
    EXPECT_FALSE(load(PrepackMode::kAuto)->repack_cache_hit());
    EXPECT_TRUE(load(PrepackMode::kAuto)->repack_cache_hit());
    EXPECT_EQ(cache_files(dir).size(), 2u);

    fs::remove_all(dir);
    fs::remove(gguf);
  }
}

TEST(RepackCache, UnwritableDirectoryLeavesAWarning) {
  SynthSpec s;
  s.type = "q8_0";
  s.n_layer = 1, s.n_embd = 64, s.n_ff = 96, s.n_head = 4, s.n_head_kv = 2;
  s.vocab_from = test::shared_path("models/gguf/stories260K.gguf");
  const fs::path gguf = temp("unwritable.gguf"), not_dir = temp("a_file");
  synth_model(s, gguf.string(), 1);
  std::ofstream(not_dir) << "not a directory";
  auto m = Model::load(gguf.string(),
                       {.prepack = PrepackMode::kAuto, .repack_cache = (not_dir / "cache").string()});
  if (m->packed_bytes() > 0) {
    EXPECT_NE(m->load_warning().find("not cached"), std::string::npos) << m->load_warning();
    EXPECT_FALSE(m->repack_cache_hit());
  }
  EXPECT_EQ(run(*m), run(*Model::load(gguf.string(), {.prepack = PrepackMode::kOff})));
  fs::remove(not_dir);
  fs::remove(gguf);
}

}  // namespace
}  // namespace tandem

// The whole forward pass on the GPU against the CPU's (model/model.cpp), for
// every architecture on small synthetic models of several weight types and
// on stories260K; then the serving engine on the GPU: greedy output equal to
// the CPU's, batch invariance, decode rows beside prompt chunks, prefix-cache
// reuse, forked choices, preemption by swapping and by recomputing.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include <unistd.h>

#include <gtest/gtest.h>

#include "gguf/synth.h"
#include "core/error.h"
#include "runtime/options.h"
#include "runtime/thread_pool.h"
#include "cuda/cuda_test_util.h"
#include "engine/llm_engine.h"
#include "kv/kv_cache.h"
#include "model/executor.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

namespace tandem {
namespace {

using namespace tandem::cudatest;

// stories260K: $TANDEM_STORIES, or carried to the GPU machine in .gpu_data/
// (of the working directory or of the source tree), else ../shared.
std::string stories_path() {
  if (const char* e = std::getenv("TANDEM_STORIES"); e && std::filesystem::exists(e)) return e;
  for (const std::string& p : {std::string(".gpu_data/stories260K.gguf"),
                               std::string(TANDEM_SOURCE_DIR) + "/.gpu_data/stories260K.gguf",
                               std::string(TANDEM_SHARED_DIR) + "/models/gguf/stories260K.gguf",
                               std::string(TANDEM_SHARED_DIR) + "/models/stories260K.gguf"})
    if (std::filesystem::exists(p)) return p;
  return "";
}

#define TD_REQUIRE_STORIES()                                                                    \
  const std::string stories = stories_path();                                                   \
  if (stories.empty()) GTEST_SKIP() << "stories260K.gguf is in neither .gpu_data/ nor ../shared/models"

struct SynthCase {
  const char* name;
  const char* arch;
  const char* type;
  bool rope_freqs = false;
};

// Small models with every architecture's switches: GQA, qwen2's biases,
// qwen3's and gemma3's Q/K norms, gemma3's sandwich norms, GELU, scaled
// embedding, sliding window (32 positions here) and tied output, llama 3's
// rope factors; weights in each type the kernels handle (q4_k_m mixes q4_K
// and q6_K, and falls back to q5_0 / q8_0 nowhere at these widths).
const SynthCase kSynth[] = {
    {"llama_f32", "llama", "f32"},          {"llama_f16", "llama", "f16"},
    {"llama_bf16", "llama", "bf16"},        {"llama_q8_0_ropefreqs", "llama", "q8_0", true},
    {"llama_q4_0", "llama", "q4_0"},        {"llama_q5_0", "llama", "q5_0"},
    {"llama_q4_k_m", "llama", "q4_k_m"},    {"llama_q5_k", "llama", "q5_k"},
    {"llama_q6_k", "llama", "q6_k"},        {"qwen2_q8_0", "qwen2", "q8_0"},
    {"qwen3_q4_k_m", "qwen3", "q4_k_m"},    {"gemma3_f16", "gemma3", "f16"},
    {"gemma3_q8_0", "gemma3", "q8_0"},
};

void PrintTo(const SynthCase& c, std::ostream* os) { *os << c.name; }

std::string synth_path(const SynthCase& c, const std::string& vocab) {
  const std::string dir = (std::filesystem::temp_directory_path() / "tandem_cuda_tests").string();
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/" + c.name + ".gguf";
  if (std::filesystem::exists(path)) return path;
  SynthSpec s;
  s.arch = c.arch;
  s.n_layer = 2;
  s.n_embd = 256;
  s.n_ff = 512;
  s.n_head = 4;
  s.n_head_kv = 2;
  s.n_ctx = 1024;
  if (std::string(c.arch) == "gemma3") s.sliding_window = 32;
  s.rope_freqs = c.rope_freqs;
  s.vocab_from = vocab;
  s.type = c.type;
  s.seed = 7;
  // Tests may run in parallel: each writes its own file and renames it.
  const std::string tmp = path + "." + std::to_string(::getpid()) + ".tmp";
  synth_model(s, tmp, 2);
  std::filesystem::rename(tmp, path);
  return path;
}

// As the command line loads for --device cuda: the file's layout only.
RuntimeOptions no_repack() {
  RuntimeOptions o;
  o.prepack = PrepackMode::kOff;
  return o;
}

float rms(const float* x, size_t n) {
  double s = 0;
  for (size_t i = 0; i < n; ++i) s += double(x[i]) * x[i];
  return static_cast<float>(std::sqrt(s / double(n)));
}

// The logits rows of one step on both devices, compared: the largest
// difference relative to the CPU row's RMS must stay under `rel`, and the
// argmax must agree wherever the CPU's top two are further apart than the
// difference could move them.
void expect_logits_close(const std::vector<float>& gpu, const std::vector<float>& cpu, int32_t n_vocab, double rel,
                         const std::string& what) {
  ASSERT_EQ(gpu.size(), cpu.size());
  for (size_t r = 0; r * n_vocab < cpu.size(); ++r) {
    const float* g = gpu.data() + r * n_vocab;
    const float* c = cpu.data() + r * n_vocab;
    const double scale = std::max(1e-3f, rms(c, n_vocab));
    const Diff d = compare(g, c, size_t(n_vocab), rel * scale, 0.0);
    EXPECT_EQ(d.bad, 0u) << what << ", logits row " << r << " (rms " << scale << "): " << describe(d, g, c, n_vocab);
    const auto top = [&](const float* x) { return int32_t(std::max_element(x, x + n_vocab) - x); };
    const int32_t tc = top(c), tg = top(g);
    float second = -INFINITY;
    for (int32_t i = 0; i < n_vocab; ++i)
      if (i != tc) second = std::max(second, c[i]);
    if (c[tc] - second > 2 * d.max_abs) {
      EXPECT_EQ(tg, tc) << what << ", logits row " << r << ": greedy token differs (margin " << c[tc] - second
                        << ", max diff " << d.max_abs << ")";
    }
  }
}

std::vector<int32_t> prompt_ids(const Model& m, int32_t n, int32_t seed) {
  std::vector<int32_t> ids;
  const int32_t V = m.config().n_vocab;
  for (int32_t i = 0; i < n; ++i) ids.push_back(3 + (seed * 131 + i * 7919) % (V - 3));
  return ids;
}

int32_t argmax(const float* x, int32_t n) { return int32_t(std::max_element(x, x + n) - x); }

// A pool of n_blocks blocks of 16 with K and V of one type, every layer in one table.
KvPlan plan_of(const Model& m, int32_t n_blocks, KvType kv) {
  KvPlan plan;
  plan.shape = m.kv_shape();
  plan.n_blocks = n_blocks;
  plan.block_size = 16;
  plan.format = kv_format(kv, kv);
  return plan;
}

// Both executors over one plan, fed the same batches and block tables.
struct Pair {
  std::unique_ptr<Model> model;
  ThreadPool pool{2};
  std::unique_ptr<Executor> cpu, gpu;
  int32_t V = 0;
  void open(const std::string& path, KvType kv = KvType::kF16) {
    model = Model::load(path, no_repack());
    const KvPlan plan = plan_of(*model, 64, kv);
    cpu = make_cpu_executor(*model, plan, pool);
    gpu = make_cuda_executor(*model, plan);
    V = model->config().n_vocab;
  }
  // Runs `b` on both; the SeqKv states advance on both copies.
  void step(const Batch& b, std::vector<SeqKv>& sc, std::vector<SeqKv>& sg, std::vector<float>& lc,
            std::vector<float>& lg) {
    const size_t n = rows_with_logits(b) * size_t(V);
    lc.assign(n, 0.0f);
    lg.assign(n, 0.0f);
    std::vector<SeqKv*> pc, pg;
    for (auto& s : sc) pc.push_back(&s);
    for (auto& s : sg) pg.push_back(&s);
    cpu->forward(b, pc, lc);
    gpu->forward(b, pg, lg);
  }
};

void add_rows(Batch& b, const std::vector<int32_t>& ids, int32_t pos0, int32_t seq, bool logits_last) {
  for (size_t i = 0; i < ids.size(); ++i)
    b.push_back({ids[i], pos0 + int32_t(i), seq, logits_last && i + 1 == ids.size()});
}

// Prompts (the cuBLAS path), decode steps (the matrix-vector path), a mixed
// step, and a prompt fed one token per step (the matrix-vector path only,
// which quantizes activations as the CPU does: a tighter bound). Where the
// prompts went through cuBLAS the bound is 25% of the logits' RMS: the CPU
// quantizes activations to 8 bits per block, the GPU's cuBLAS path rounds
// them to f16, and on these models the CPU's 8-bit activations alone move
// the logits of a 40-token prompt by up to 10% of their RMS (q4_K_M; 5% for
// q8_0, 2-3% for bf16) against float activations. A wrong kernel or a
// missed step is off by the RMS itself; the kernels' own tests are exact.
void forward_matches_cpu(const std::string& path, const std::string& what, KvType kv = KvType::kF16) {
  Pair p;
  p.open(path, kv);
  const Model& m = *p.model;
  // Scattered block tables: A 40 tokens + 12 decodes, B 23 + 12, C 20, D 18.
  std::vector<SeqKv> sc(4), sg(4);
  const std::vector<std::vector<int32_t>> blocks = {{9, 3, 60, 31}, {17, 5, 40}, {44, 2}, {50, 8}};
  for (size_t i = 0; i < 4; ++i) sc[i].blocks = sg[i].blocks = blocks[i];
  const auto a = prompt_ids(m, 40, 1), bp = prompt_ids(m, 23, 2), cp = prompt_ids(m, 20, 3), dp = prompt_ids(m, 18, 4);
  std::vector<float> lc, lg;

  Batch b;
  add_rows(b, a, 0, 0, true);
  add_rows(b, bp, 0, 1, true);
  b[10].logits = true;  // a middle row of a prompt
  p.step(b, sc, sg, lc, lg);
  expect_logits_close(lg, lc, p.V, 0.25, what + ": prompts");

  // Logits rows in batch order: A's row 10, A's last, B's last.
  int32_t ta = argmax(lc.data() + p.V, p.V), tb = argmax(lc.data() + 2 * p.V, p.V);
  for (int step = 0; step < 12; ++step) {
    b.clear();
    b.push_back({ta, sc[0].n_tokens, 0, true});
    b.push_back({tb, sc[1].n_tokens, 1, true});
    if (step == 6) add_rows(b, cp, 0, 2, true);  // a prompt chunk between decodes
    p.step(b, sc, sg, lc, lg);
    expect_logits_close(lg, lc, p.V, 0.25, what + ": decode step " + std::to_string(step));
    ta = argmax(lc.data(), p.V);
    tb = argmax(lc.data() + p.V, p.V);
  }
  // D one token per step: every row a decode row.
  for (size_t i = 0; i < dp.size(); ++i) {
    b.clear();
    b.push_back({dp[i], int32_t(i), 3, true});
    p.step(b, sc, sg, lc, lg);
    expect_logits_close(lg, lc, p.V, 5e-3, what + ": token by token, position " + std::to_string(i));
  }
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(sg[i].n_tokens, sc[i].n_tokens) << what << ": n_tokens of sequence " << i;
}

class CudaSynthForward : public ::testing::TestWithParam<SynthCase> {};

TEST_P(CudaSynthForward, MatchesTheCpu) {
  TD_REQUIRE_GPU();
  TD_REQUIRE_STORIES();
  const SynthCase& c = GetParam();
  forward_matches_cpu(synth_path(c, stories), c.name);
}

INSTANTIATE_TEST_SUITE_P(Archs, CudaSynthForward, ::testing::ValuesIn(kSynth),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(CudaForward, StoriesMatchesTheCpuWithF16AndF32Caches) {
  TD_REQUIRE_GPU();
  TD_REQUIRE_STORIES();
  forward_matches_cpu(stories, "stories260K f16 cache", KvType::kF16);
  forward_matches_cpu(stories, "stories260K f32 cache", KvType::kF32);
}

// A row's logits on the GPU do not depend on the other rows: a prompt alone
// or beside another prompt (cuBLAS, one algorithm per shape), a decode row
// alone or beside others and beside a prompt chunk (matrix-vector kernels).
TEST(CudaForward, RowsDoNotDependOnTheirBatch) {
  TD_REQUIRE_GPU();
  TD_REQUIRE_STORIES();
  for (const char* type : {"q8_0", "f16", "q4_k_m"}) {
    SCOPED_TRACE(type);
    const std::string path = synth_path({type, "llama", type}, stories);
    auto model = Model::load(path, no_repack());
    const int32_t V = model->config().n_vocab;
    const KvPlan plan = plan_of(*model, 64, KvType::kF16);
    auto g = make_cuda_executor(*model, plan);
    const auto a = prompt_ids(*model, 37, 5), bp = prompt_ids(*model, 150, 6);
    auto run = [&](const Batch& b, std::vector<SeqKv>& s) {
      std::vector<float> l(rows_with_logits(b) * size_t(V));
      std::vector<SeqKv*> ps;
      for (auto& x : s) ps.push_back(&x);
      g->forward(b, ps, l);
      return l;
    };
    // Separate blocks for the two runs, so that each reads only its own K/V.
    auto fresh = [](int32_t base) {
      std::vector<SeqKv> s(3);
      s[0].blocks = {base, base + 1, base + 2, base + 3};
      s[1].blocks = {base + 4, base + 5, base + 6, base + 7, base + 8, base + 9, base + 10, base + 11, base + 12, base + 13};
      s[2].blocks = {base + 14, base + 15};
      return s;
    };
    // Prompt A alone, then A after B in one batch.
    std::vector<SeqKv> s1 = fresh(0), s2 = fresh(20);
    Batch b1, b2;
    add_rows(b1, a, 0, 0, true);
    add_rows(b2, bp, 0, 1, true);
    add_rows(b2, a, 0, 0, true);
    const auto l1 = run(b1, s1), l2 = run(b2, s2);
    EXPECT_EQ(first_byte_diff(l1.data(), l2.data() + V, size_t(V) * 4), SIZE_MAX)
        << "a prompt's logits change when another prompt shares its batch";
    // A decode row of A alone, then beside B's decode row and C's prompt chunk.
    const int32_t t = argmax(l1.data(), V);
    Batch d1, d2;
    d1.push_back({t, 37, 0, true});
    add_rows(d2, prompt_ids(*model, 20, 7), 0, 2, false);
    d2.push_back({t, 37, 0, true});
    d2.push_back({t, 150, 1, true});
    const auto e1 = run(d1, s1), e2 = run(d2, s2);
    EXPECT_EQ(first_byte_diff(e1.data(), e2.data(), size_t(V) * 4), SIZE_MAX)
        << "a decode row's logits change beside other rows";
  }
}

// ---- The serving engine on the GPU ----

struct Out {
  std::map<int32_t, std::vector<int32_t>> tokens;
  std::map<int32_t, std::string> text;
  int32_t cached = 0;
};
EventSink collect(Out& o) {
  return [&o](const RequestEvent& ev) {
    auto& t = o.tokens[ev.choice];
    t.insert(t.end(), ev.tokens.begin(), ev.tokens.end());
    o.text[ev.choice] += ev.text;
    o.cached = ev.cached_prompt_tokens;
  };
}
RequestParams greedy(int32_t n) {
  RequestParams p;
  p.sampling.temperature = 0;
  p.max_tokens = n;
  p.stop_at_eog = false;
  return p;
}
void run_until_idle(Engine& e) {
  for (int i = 0; i < 100000 && e.step(); ++i) e.check_invariants();
}

class CudaEngine : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string why = no_gpu_reason();
    if (!why.empty()) GTEST_SKIP() << "no CUDA GPU here (" << why << ")";
    path_ = stories_path();
    if (path_.empty()) GTEST_SKIP() << "stories260K.gguf is in neither .gpu_data/ nor ../shared/models";
    model_ = Model::load(path_, no_repack());
  }
  EngineConfig cfg(const std::string& device) const {
    EngineConfig c;
    c.threads = 2;
    c.max_context = 256;
    c.device = device;
    return c;
  }
  std::vector<int32_t> tok(const std::string& s) { return model_->tokenizer().encode(s, true, true); }
  std::vector<int32_t> alone(const std::string& device, const std::vector<int32_t>& prompt, int32_t n) {
    Engine e(*model_, cfg(device));
    Out o;
    e.submit(prompt, greedy(n), collect(o));
    run_until_idle(e);
    return o.tokens[0];
  }
  std::string path_;
  std::unique_ptr<Model> model_;
};

const char* kPrompts[] = {"Once upon a time", "The little dog", "Lily and Tom", "One day, a bird", "The sun was",
                          "Tim had a big red ball", "Mom said", "There was a cat"};

TEST_F(CudaEngine, GreedyOutputEqualsTheCpu) {
  for (const char* p : kPrompts) {
    const auto c = alone("cpu", tok(p), 48), g = alone("cuda", tok(p), 48);
    EXPECT_EQ(g, c) << "prompt '" << p << "'";
  }
}

// Prompts prefilled whole (throughput policy, one step for all), then decode
// steps of many rows: each request's tokens equal its own alone.
TEST_F(CudaEngine, BatchInvariance) {
  std::vector<std::vector<int32_t>> want;
  for (size_t i = 0; i < std::size(kPrompts); ++i) want.push_back(alone("cuda", tok(kPrompts[i]), 20 + int32_t(i) * 3));
  EngineConfig c = cfg("cuda");
  c.policy = SchedulePolicy::kThroughput;
  c.max_batch_tokens = 1024;
  c.max_seqs = 16;
  Engine e(*model_, c);
  std::vector<Out> outs(std::size(kPrompts));
  for (size_t i = 0; i < std::size(kPrompts); ++i) e.submit(tok(kPrompts[i]), greedy(20 + int32_t(i) * 3), collect(outs[i]));
  run_until_idle(e);
  for (size_t i = 0; i < std::size(kPrompts); ++i) EXPECT_EQ(outs[i].tokens[0], want[i]) << "request " << i;
  EXPECT_EQ(e.metrics().kv_blocks_used, 0);
}

// A sequence decoding while another's long prompt comes in chunks beside it.
TEST_F(CudaEngine, DecodeRowsBesidePromptChunks) {
  const auto want = alone("cuda", tok("Once upon a time"), 60);
  EngineConfig c = cfg("cuda");
  c.max_batch_tokens = 32;  // the long prompt takes several steps
  c.step_factor = 0;        // chunks by tokens alone
  Engine e(*model_, c);
  Out a, b;
  e.submit(tok("Once upon a time"), greedy(60), collect(a));
  e.step();
  e.step();  // A is decoding
  std::string long_prompt;
  for (int i = 0; i < 12; ++i) long_prompt += "The little dog ran to the park and played with a ball. ";
  e.submit(tok(long_prompt), greedy(4), collect(b));
  run_until_idle(e);
  EXPECT_EQ(a.tokens[0], want);
  EXPECT_EQ(b.tokens[0].size(), 4u);
}

TEST_F(CudaEngine, PrefixCacheReuseGivesTheSameTokens) {
  const std::string system =
      "Once upon a time, there was a little girl named Lily. She loved to play outside in the park with her "
      "friends. One day, she saw a big red ball.";
  // The uncached rest of the second prompt has two or more tokens: it takes
  // the same path as without the cache (see docs/cuda.md).
  std::string second = system + " The dog said";
  const int32_t n = static_cast<int32_t>(tok(second).size());
  ASSERT_GE(n % 16, 2) << "pick a second prompt whose last partial block has 2+ tokens";
  Engine e(*model_, cfg("cuda"));
  Out a, b;
  e.submit(tok(system + " She"), greedy(8), collect(a));
  run_until_idle(e);
  e.submit(tok(second), greedy(16), collect(b));
  run_until_idle(e);
  EXPECT_GT(b.cached, 0);
  EngineConfig nc = cfg("cuda");
  nc.prefix_caching = false;
  Engine fresh(*model_, nc);
  Out f;
  fresh.submit(tok(second), greedy(16), collect(f));
  run_until_idle(fresh);
  EXPECT_EQ(b.tokens[0], f.tokens[0]);
}

TEST_F(CudaEngine, ForkedChoicesShareThePromptBlocks) {
  const auto want = alone("cuda", tok("Lily and Tom"), 24);
  Engine e(*model_, cfg("cuda"));
  RequestParams p = greedy(24);
  p.n = 3;
  Out o;
  e.submit(tok("Lily and Tom"), p, collect(o));
  run_until_idle(e);
  for (int32_t c = 0; c < 3; ++c) EXPECT_EQ(o.tokens[c], want) << "choice " << c;
  EXPECT_EQ(e.metrics().kv_blocks_used, 0);
}

TEST_F(CudaEngine, PreemptionBySwappingAndByRecomputing) {
  const std::vector<const char*> prompts = {"Once upon a time", "The little dog", "Lily and Tom", "One day, a bird",
                                            "Once upon a time"};
  std::vector<std::vector<int32_t>> want;
  for (const char* p : prompts) {
    EngineConfig c = cfg("cuda");
    c.max_context = 128;
    Engine e(*model_, c);
    Out o;
    e.submit(tok(p), greedy(100), collect(o));
    run_until_idle(e);
    want.push_back(o.tokens[0]);
  }
  for (int64_t swap : {int64_t{64} << 20, int64_t{0}}) {
    SCOPED_TRACE(swap ? "swap" : "recompute");
    EngineConfig c = cfg("cuda");
    c.max_context = 128;
    c.kv_tokens = 192;  // 12 blocks for five sequences of ~105 tokens
    c.max_seqs = 5;
    c.swap_bytes = swap;
    Engine e(*model_, c);
    std::vector<Out> outs(prompts.size());
    for (size_t i = 0; i < prompts.size(); ++i) e.submit(tok(prompts[i]), greedy(100), collect(outs[i]));
    run_until_idle(e);
    const MetricsSnapshot m = e.metrics();
    EXPECT_GT(m.preemptions, 0u);
    if (swap) {
      EXPECT_GT(m.swap_outs, 0u);
    }
    EXPECT_EQ(m.kv_blocks_used, 0);
    // Swapped K/V comes back bit for bit; recomputed K/V of generated tokens
    // comes from the prompt path instead of the decode path, equal here to
    // float rounding (stories260K is f32: cuBLAS in f32).
    for (size_t i = 0; i < prompts.size(); ++i) EXPECT_EQ(outs[i].tokens[0], want[i]) << "request " << i;
  }
}

// save_block / load_block / copy_block through the executors: the GPU's
// bytes are the CPU KvCache's format.
TEST_F(CudaEngine, BlockSaveLoadCopyKeepTheCpuFormat) {
  const KvPlan plan = plan_of(*model_, 16, KvType::kF32);
  ThreadPool pool(2);
  auto cpu = make_cpu_executor(*model_, plan, pool);
  auto gpu = make_cuda_executor(*model_, plan);
  ASSERT_EQ(cpu->block_bytes(), gpu->block_bytes());
  SeqKv sc, sg;
  sc.blocks = sg.blocks = {7, 2};
  Batch b;
  add_rows(b, tok("Once upon a time, there was a dog"), 0, 0, true);
  std::vector<float> lc(model_->config().n_vocab), lg(lc.size());
  SeqKv* pc[] = {&sc};
  SeqKv* pg[] = {&sg};
  cpu->forward(b, pc, lc);
  gpu->forward(b, pg, lg);
  const size_t n = cpu->block_bytes();
  std::vector<std::byte> c7(n), g7(n), g3(n);
  cpu->save_block(7, c7.data());
  gpu->save_block(7, g7.data());
  TD_EXPECT_CLOSE(reinterpret_cast<const float*>(g7.data()), reinterpret_cast<const float*>(c7.data()), n / 4, 1e-4,
                  1e-4, "saved block 7 (f32 K/V)");
  gpu->load_block(3, g7.data());
  gpu->save_block(3, g3.data());
  EXPECT_EQ(first_byte_diff(g3.data(), g7.data(), n), SIZE_MAX) << "load_block then save_block";
  gpu->copy_block(7, 11);
  std::vector<std::byte> g11(n);
  gpu->save_block(11, g11.data());
  EXPECT_EQ(first_byte_diff(g11.data(), g7.data(), n), SIZE_MAX) << "copy_block";
  EXPECT_THROW(gpu->save_block(16, g11.data()), Error);
}

}  // namespace
}  // namespace tandem

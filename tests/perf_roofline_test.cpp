// The roofline microbenchmarks (small sizes, every kernel level this CPU
// runs), the cache of their results, and what a model costs per token. No
// timing thresholds: the machine is shared, so only plausibility is checked.
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "runtime/thread_pool.h"
#include "gguf/gguf.h"
#include "model/model.h"
#include "perf/bench.h"
#include "perf/microbench.h"
#include "perf/model_cost.h"
#include "perf/roofline.h"
#include "test_support.h"
#include "tokenizer/tokenizer.h"

namespace tandem {
namespace {

bool plausible(const PeakMeasure& m) { return std::isfinite(m.value) && m.value > 0 && !m.isa.empty(); }

TEST(PerfMicrobench, EveryLevelGivesPositiveNumbers) {
  ThreadPool pool(2);
  for (KernelLevel level : kAllKernelLevels) {
    if (!cpu_supports_level(level)) continue;
    SCOPED_TRACE(kernel_level_name(level));
    // 8 MiB split over 2 threads: each slice is whole pages, any size works.
    const PeakMeasure bw = measure_read_bandwidth(pool, (size_t{8} << 20) + 12345, 2, level);
    EXPECT_TRUE(plausible(bw)) << bw.value;
    const PeakMeasure f = measure_fp32_fma_peak(pool, 20000, 2, level);
    EXPECT_TRUE(plausible(f)) << f.value;
    const PeakMeasure i8 = measure_int8_dot_peak(pool, 20000, 2, level);
    EXPECT_TRUE(plausible(i8)) << i8.value;
    const PeakMeasure b = measure_bf16_dot_peak(pool, 20000, 2, level);
    EXPECT_TRUE(plausible(b)) << b.value;
  }
}

TEST(PerfMicrobench, IsaNamesFollowTheLevel) {
  ThreadPool pool(1);
  EXPECT_EQ(measure_fp32_fma_peak(pool, 1000, 1, KernelLevel::kScalar).isa, "scalar mul+add");
  if (cpu_supports_level(KernelLevel::kAvx512Vnni)) {
    EXPECT_NE(measure_int8_dot_peak(pool, 1000, 1, KernelLevel::kAvx512Vnni).isa.find("vpdpbusd"), std::string::npos);
    EXPECT_NE(measure_read_bandwidth(pool, 1 << 20, 1, KernelLevel::kAvx512Vnni).isa.find("avx512"), std::string::npos);
  }
  if (cpu_supports_level(KernelLevel::kAvx2)) {
    EXPECT_NE(measure_int8_dot_peak(pool, 1000, 1, KernelLevel::kAvx2).isa.find("vpmaddubsw"), std::string::npos);
  }
  // Without native bf16 at the level, bf16 is honest about being fp32 work.
  EXPECT_NE(measure_bf16_dot_peak(pool, 1000, 1, KernelLevel::kScalar).isa.find("widened"), std::string::npos);
}

// The read over memory the caller owns: unaligned starts and odd sizes are
// trimmed to what the kernels read, regions too small for one step are
// skipped, and nothing to read is an error.
TEST(PerfMicrobench, ReadsTheCallersRegions) {
  ThreadPool pool(2);
  std::vector<uint8_t> a((size_t{3} << 20) + 777, 1), b(100, 2), c((size_t{1} << 20) + 3, 3);
  const std::span<const uint8_t> regions[] = {{a.data() + 5, a.size() - 5}, {b.data(), b.size()}, {c.data(), c.size()}};
  for (KernelLevel level : kAllKernelLevels) {
    if (!cpu_supports_level(level)) continue;
    SCOPED_TRACE(kernel_level_name(level));
    EXPECT_TRUE(plausible(measure_read_bandwidth_of(pool, regions, 2, level)));
  }
  EXPECT_THROW(measure_read_bandwidth_of(pool, std::span(regions).subspan(1, 1), 1, KernelLevel::kScalar), Error);
  EXPECT_THROW(measure_read_bandwidth_of(pool, regions, 0, KernelLevel::kScalar), Error);
}

TEST(PerfMicrobench, RejectsEmptyWork) {
  ThreadPool pool(1);
  EXPECT_THROW(measure_read_bandwidth(pool, 0, 1, KernelLevel::kScalar), Error);
  EXPECT_THROW(measure_read_bandwidth(pool, 4096, 0, KernelLevel::kScalar), Error);
  EXPECT_THROW(measure_fp32_fma_peak(pool, 0, 1, KernelLevel::kScalar), Error);
  EXPECT_THROW(measure_int8_dot_peak(pool, 10, -1, KernelLevel::kScalar), Error);
}

Roofline sample_roofline(int threads) {
  Roofline r;
  r.cpu = "Test CPU";
  r.threads = threads;
  r.kernel_level = "avx2";
  r.source = "measured";
  r.measured_at = "2020-01-01T00:00:00Z";
  r.read_bytes = 1 << 30;
  r.read_gb_s = {12.5, "avx2 256-bit loads"};
  r.fp32_gop_s = {100, "a"};
  r.int8_gop_s = {400, "b"};
  r.bf16_gop_s = {200, "c"};
  return r;
}

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / (name + std::to_string(::getpid()))).string();
}

TEST(PerfRoofline, JsonRoundTripAndErrors) {
  const Roofline r = sample_roofline(2);
  const Roofline back = roofline_from_json(roofline_to_json(r));
  EXPECT_EQ(back.cpu, r.cpu);
  EXPECT_EQ(back.threads, 2);
  EXPECT_EQ(back.read_gb_s.value, 12.5);
  EXPECT_EQ(back.int8_gop_s.isa, "b");

  nlohmann::json j = roofline_to_json(r);
  j.erase("fp32_gop_s");
  try {
    roofline_from_json(j);
    FAIL() << "missing field accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("fp32_gop_s"), std::string::npos) << e.what();
  }
  j = roofline_to_json(r);
  j["threads"] = "two";
  EXPECT_THROW(roofline_from_json(j), Error);
  j = roofline_to_json(r);
  j["read_gb_s"]["value"] = -1.0;
  EXPECT_THROW(roofline_from_json(j), Error);
}

TEST(PerfRoofline, CacheKeepsOneEntryPerKey) {
  const std::string path = temp_path("tandem_roofline_cache_") + "/sub/roofline.json";
  std::filesystem::remove_all(std::filesystem::path(path).parent_path().parent_path());
  EXPECT_FALSE(load_cached_roofline(path, "Test CPU", 2, "avx2"));

  Roofline r2 = sample_roofline(2), r1 = sample_roofline(1);
  save_roofline(path, r2);
  save_roofline(path, r1);
  r2.read_gb_s.value = 20;
  save_roofline(path, r2);  // replaces the 2-thread entry

  auto got = load_cached_roofline(path, "Test CPU", 2, "avx2");
  ASSERT_TRUE(got);
  EXPECT_EQ(got->source, "cached");
  EXPECT_EQ(got->read_gb_s.value, 20);
  got = load_cached_roofline(path, "Test CPU", 1, "avx2");
  ASSERT_TRUE(got);
  EXPECT_EQ(got->read_gb_s.value, 12.5);
  EXPECT_FALSE(load_cached_roofline(path, "Test CPU", 2, "scalar"));
  EXPECT_FALSE(load_cached_roofline(path, "Other CPU", 2, "avx2"));
  std::ifstream in(path);
  EXPECT_EQ(nlohmann::json::parse(in)["entries"].size(), 2u);

  // A damaged cache is no cache, and saving over it recovers.
  std::ofstream(path, std::ios::trunc) << "{\"entries\": [ {\"cpu\": ";
  EXPECT_FALSE(load_cached_roofline(path, "Test CPU", 2, "avx2"));
  save_roofline(path, r1);
  EXPECT_TRUE(load_cached_roofline(path, "Test CPU", 1, "avx2"));
  std::filesystem::remove_all(std::filesystem::path(path).parent_path().parent_path());
}

TEST(PerfRoofline, CpuNameIsKnown) { EXPECT_FALSE(cpu_model_name().empty()); }

TEST(PerfModelCost, AttentionCountsCausalAndWindowedPrefixes) {
  ModelCost mc;
  mc.n_layer = 2;
  mc.n_swa_layers = 1;
  mc.sliding_window = 2;
  mc.n_head = 1;
  mc.n_head_kv = 1;
  mc.head_dim = 1;
  mc.head_dim_v = 1;
  // Positions 0..3: full layer sees 1+2+3+4 keys, the windowed one 1+2+2+2.
  EXPECT_EQ(mc.attention_macs(0, 4), 2u * (10 + 7));
  // A decode step at position 4: 5 keys on the full layer, 2 on the windowed one.
  EXPECT_EQ(mc.attention_macs(4, 1), 2u * (5 + 2));
  EXPECT_DOUBLE_EQ(mc.kv_read_bytes_per_step(4, 1, 4, 4), 2.0 * 4 * (5 + 2));
  EXPECT_DOUBLE_EQ(mc.kv_read_bytes_per_step(4, 2, 2, 2), 2.0 * 2 * ((5 + 2) + (6 + 2)) / 2);
  mc.layer_macs_per_token = 100;
  mc.output_macs = 1000;
  EXPECT_EQ(mc.prefill_macs(4), 400u + 1000u + 34u);
  mc.last_layer_tail_macs = 20;  // run for the last of the 4 rows only
  EXPECT_EQ(mc.prefill_macs(4), 400u - 3 * 20u + 1000u + 34u);
  EXPECT_EQ(mc.prefill_macs(1), 100u + 1000u + 4u);
  EXPECT_EQ(mc.prefill_macs(0), 0u);
}

TEST(PerfModelCost, StoriesWeightsMatchTheFileTensors) {
  auto m = Model::load(test::shared_path("models/gguf/stories260K.gguf"));
  const ModelCost mc = model_cost(*m);
  // Independently: every 2-D tensor of the blocks, plus the output matrix (tied
  // to the embedding when output.weight is absent).
  uint64_t bytes = 0, macs = 0;
  bool has_output = false;
  for (const GgufTensor& t : m->file().tensors()) {
    if (t.name == "output.weight") has_output = true;
    if (t.name.rfind("blk.", 0) == 0 && t.dims.size() == 2 && t.dims[1] > 1) {
      bytes += t.n_bytes;
      macs += static_cast<uint64_t>(t.n_elements);
    }
  }
  const GgufTensor* out = m->file().find_tensor(has_output ? "output.weight" : "token_embd.weight");
  ASSERT_NE(out, nullptr);
  EXPECT_EQ(mc.decode_weight_bytes, bytes + out->n_bytes);
  EXPECT_EQ(mc.layer_macs_per_token, macs);
  EXPECT_EQ(mc.output_macs, static_cast<uint64_t>(out->n_elements));
  uint64_t tail = 0;
  const std::string last = "blk." + std::to_string(m->config().n_layer - 1) + ".";
  for (const char* n : {"attn_output", "ffn_gate", "ffn_up", "ffn_down"})
    if (const GgufTensor* t = m->file().find_tensor(last + n + ".weight")) tail += static_cast<uint64_t>(t->n_elements);
  EXPECT_GT(tail, 0u);
  EXPECT_EQ(mc.last_layer_tail_macs, tail);
  uint64_t by_type = 0;
  for (const auto& [name, b] : mc.bytes_by_type) by_type += b;
  EXPECT_EQ(by_type, mc.decode_weight_bytes);
  // The memory a decode streams is those bytes (f32: nothing repacked).
  uint64_t region_bytes = 0;
  for (std::span<const uint8_t> r : m->decode_weight_regions()) region_bytes += r.size();
  EXPECT_EQ(region_bytes, mc.decode_weight_bytes);
  EXPECT_EQ(mc.n_layer, m->config().n_layer);
  EXPECT_EQ(mc.family, compute_family(mc.prefill_type));
  EXPECT_EQ(file_type_name(15), "q4_k_m");
  EXPECT_EQ(file_type_name(1), "f16");
  EXPECT_EQ(file_type_name(99), "ftype 99");
  EXPECT_EQ(compute_family(GgmlType::Q8_0), ComputeFamily::kInt8);
  EXPECT_EQ(compute_family(GgmlType::Q4_K), ComputeFamily::kInt8);
  EXPECT_EQ(compute_family(GgmlType::F16), ComputeFamily::kFp32);
  EXPECT_EQ(compute_family(GgmlType::BF16), ComputeFamily::kBf16);
}

TEST(PerfBench, TokensAreNormalDeterministicAndInRange) {
  auto m = Model::load(test::shared_path("models/gguf/stories260K.gguf"));
  const Tokenizer& tok = m->tokenizer();
  const auto types = m->file().get_int_array("tokenizer.ggml.token_type");
  // More than the vocabulary holds: the sequence cycles rather than failing.
  const auto ids = bench_tokens(*m, 1000);
  ASSERT_EQ(ids.size(), 1000u);
  EXPECT_EQ(ids, bench_tokens(*m, 1000));
  std::set<int32_t> distinct(ids.begin(), ids.end());
  EXPECT_GT(distinct.size(), 100u);
  for (int32_t id : ids) {
    ASSERT_GE(id, 0);
    ASSERT_LT(id, tok.n_vocab());
    EXPECT_NE(id, tok.bos_id());
    EXPECT_NE(id, tok.eos_id());
    if (types) {
      EXPECT_EQ((*types)[id], static_cast<int64_t>(TokenType::kNormal)) << id;
    }
  }
}

TEST(PerfBench, StatsMedianMinMax) {
  Stats s = Stats::of({3, 1, 2});
  EXPECT_EQ(s.median, 2);
  EXPECT_EQ(s.min, 1);
  EXPECT_EQ(s.max, 3);
  s = Stats::of({4, 1, 2, 3});
  EXPECT_EQ(s.median, 2.5);
  s = Stats::of({});
  EXPECT_EQ(s.median, 0);
}

BenchOptions stories_bench(int32_t n_prompt, int32_t n_gen, int32_t reps) {
  BenchOptions o;
  o.model_path = test::shared_path("models/gguf/stories260K.gguf");
  o.n_prompt = n_prompt;
  o.n_gen = n_gen;
  o.reps = reps;
  o.threads = 2;
  return o;
}

TEST(PerfBench, RunsStoriesInProcess) {
  BenchOptions o = stories_bench(9, 3, 3);
  const BenchResult r = run_bench(o);
  ASSERT_EQ(r.prefill_s.size(), 3u);
  ASSERT_EQ(r.decode_s.size(), 3u);
  ASSERT_EQ(r.prefill_cpu_s.size(), 3u);
  ASSERT_EQ(r.decode_cpu_s.size(), 3u);
  for (double c : r.prefill_cpu_s) EXPECT_GT(c, 0);
  EXPECT_GT(r.prefill_tok_s.median, 0);
  EXPECT_LE(r.prefill_tok_s.min, r.prefill_tok_s.median);
  EXPECT_LE(r.prefill_tok_s.median, r.prefill_tok_s.max);
  EXPECT_GT(r.decode_tok_s.min, 0);
  EXPECT_EQ(r.tokens.size(), 12u);
  EXPECT_EQ(r.threads, 2);
  EXPECT_GT(r.load_s, 0);
  EXPECT_GT(r.peak_rss_bytes, 0u);
  EXPECT_EQ(r.kv_cache.k, KvType::kF16);
  EXPECT_EQ(r.kv_cache.v, KvType::kF16);

  // A read of the decode's weights after each repetition, and the decode's
  // GB/s in that repetition over it.
  ASSERT_EQ(r.read_gb_s_beside.size(), 3u);
  ASSERT_EQ(r.decode_frac_beside.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_GT(r.read_gb_s_beside[i], 0);
    EXPECT_NEAR(r.decode_frac_beside[i], r.cost.decode_weight_bytes * 3 / r.decode_s[i] / 1e9 / r.read_gb_s_beside[i],
                1e-9 * r.decode_frac_beside[i]);
  }

  const Roofline roof = sample_roofline(2);
  const RooflineUse u = roofline_use(r, roof);
  EXPECT_DOUBLE_EQ(u.decode_frac_beside.median, Stats::of(r.decode_frac_beside).median);
  EXPECT_DOUBLE_EQ(u.decode_gb_s, r.cost.decode_weight_bytes * r.decode_tok_s.median / 1e9);
  EXPECT_DOUBLE_EQ(u.decode_frac, u.decode_gb_s / 12.5);
  EXPECT_EQ(u.prefill_peak_gop_s, r.cost.family == ComputeFamily::kInt8 ? 400 : r.cost.family == ComputeFamily::kBf16 ? 200 : 100);

  o.n_prompt = 0;
  EXPECT_THROW(run_bench(o), Error);
  o.n_prompt = 4;
  o.reps = 0;
  EXPECT_THROW(run_bench(o), Error);
  o.reps = 1;
  o.n_prompt = 1 << 30;
  EXPECT_THROW(run_bench(o), Error);  // beyond the training context
  o.n_prompt = 4;
  o.batch = 0;
  EXPECT_THROW(run_bench(o), Error);
}

TEST(PerfBench, BatchDecodesSequencesTogether) {
  BenchOptions o = stories_bench(7, 5, 1);
  o.batch = 5;
  const BenchResult r = run_bench(o);
  ASSERT_EQ(r.decode_s.size(), 1u);
  // Rates count the tokens of all five sequences.
  EXPECT_DOUBLE_EQ(r.decode_tok_s.median, 5.0 * 5 / r.decode_s[0]);
  EXPECT_DOUBLE_EQ(r.prefill_tok_s.median, 5.0 * 7 / r.prefill_s[0]);
  // The weights are read once per step, whatever the batch.
  const RooflineUse u = roofline_use(r, sample_roofline(2));
  EXPECT_DOUBLE_EQ(u.decode_gb_s, r.cost.decode_weight_bytes * r.decode_tok_s.median / 5 / 1e9);
  // The KV cache holds all five sequences.
  o.batch = 1;
  EXPECT_GT(r.kv_cache_bytes, 4 * run_bench(o).kv_cache_bytes);
}

}  // namespace
}  // namespace tandem

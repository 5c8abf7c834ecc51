// `tandem bench` as a user runs it: a real process on stories260K with tiny
// P and N. Checks the fields and their consistency, never the speed.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "kernels/vec_dot.h"
#include "perf/roofline.h"
#include "test_support.h"

namespace tandem {
namespace {

using test::CliResult;

CliResult run_bench_cli(const std::string& args) { return test::run_cli("bench " + args); }

const std::string kStories = std::string("'").append(test::shared_path("models/gguf/stories260K.gguf")).append("'");

std::string temp_cache(const std::string& tag) {
  return (std::filesystem::temp_directory_path() / ("tandem_bench_roof_" + tag + std::to_string(::getpid()) + ".json"))
      .string();
}

TEST(PerfBenchCli, JsonFieldsAreSane) {
  const std::string cache = temp_cache("none");
  std::filesystem::remove(cache);
  CliResult r = run_bench_cli("-m " + kStories + " -p 16 -n 8 --reps 3 --threads 1 --json --roofline-cache " + cache);
  ASSERT_EQ(r.status, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  for (const char* k : {"prefill_tok_s", "decode_tok_s", "load_s", "decode_gb_s", "prefill_gop_s"}) {
    ASSERT_TRUE(j.contains(k)) << k;
    EXPECT_GT(j[k].get<double>(), 0) << k;
  }
  EXPECT_LE(j["prefill_tok_s_min"].get<double>(), j["prefill_tok_s"].get<double>());
  EXPECT_LE(j["prefill_tok_s"].get<double>(), j["prefill_tok_s_max"].get<double>());
  EXPECT_LE(j["decode_tok_s_min"].get<double>(), j["decode_tok_s"].get<double>());
  EXPECT_LE(j["decode_tok_s"].get<double>(), j["decode_tok_s_max"].get<double>());
  EXPECT_EQ(j["prefill_s"].size(), 3u);
  EXPECT_EQ(j["decode_cpu_s"].size(), 3u);
  EXPECT_EQ(j["n_prompt"], 16);
  EXPECT_EQ(j["n_gen"], 8);
  EXPECT_EQ(j["threads"], 1);
  EXPECT_EQ(j["kernels"], cpu_kernel_level());
  EXPECT_EQ(j["token_ids"].size(), 24u);
  EXPECT_NE(j["model"].get<std::string>().find("stories260K.gguf"), std::string::npos);
  EXPECT_FALSE(j["model_type"].get<std::string>().empty());
  // The process holds at least the weights it read.
  EXPECT_GE(j["peak_rss_bytes"].get<uint64_t>(), j["decode_weight_bytes_per_token"].get<uint64_t>());
  // stories260K: 5 layers, 4 KV heads of 8 dims; 24 positions round up to 2 blocks of 16.
  const std::string kv_type = j["kv_type"];
  ASSERT_TRUE(kv_type == "f16" || kv_type == "f32") << kv_type;
  EXPECT_EQ(j["kv_cache_bytes"], 5u * 2 * 32 * 32 * (kv_type == "f16" ? 2 : 4));
  EXPECT_NEAR(j["decode_gb_s"].get<double>(),
              j["decode_weight_bytes_per_token"].get<double>() * j["decode_tok_s"].get<double>() / 1e9, 1e-12);
  // No cache at that path: a quick measurement, not written back.
  EXPECT_EQ(j["roofline"]["source"], "quick");
  EXPECT_GT(j["roofline"]["read_gb_s"]["value"].get<double>(), 0);
  EXPECT_FALSE(std::filesystem::exists(cache));
  EXPECT_NEAR(j["decode_bandwidth_fraction"].get<double>(),
              j["decode_gb_s"].get<double>() / j["roofline"]["read_gb_s"]["value"].get<double>(), 1e-12);
  // Beside every repetition, a read of the same weights.
  ASSERT_EQ(j["read_gb_s_beside"].size(), 3u);
  EXPECT_GT(j["decode_bandwidth_fraction_beside"].get<double>(), 0);
  EXPECT_LE(j["decode_bandwidth_fraction_beside_min"].get<double>(), j["decode_bandwidth_fraction_beside"].get<double>());
  EXPECT_LE(j["decode_bandwidth_fraction_beside"].get<double>(), j["decode_bandwidth_fraction_beside_max"].get<double>());
}

TEST(PerfBenchCli, UsesTheCachedRoofline) {
  const std::string cache = temp_cache("cached");
  Roofline roof;
  roof.cpu = cpu_model_name();
  roof.threads = 1;
  roof.kernel_level = cpu_kernel_level();
  roof.source = "measured";
  roof.measured_at = "2020-01-01T00:00:00Z";
  roof.read_bytes = 1;
  roof.read_gb_s = {1234.5, "test"};
  roof.fp32_gop_s = {111, "test"};
  roof.int8_gop_s = {222, "test"};
  roof.bf16_gop_s = {333, "test"};
  save_roofline(cache, roof);
  CliResult r = run_bench_cli("-m " + kStories + " -p 4 -n 2 --reps 1 --warmup 0 -t 1 --json --roofline-cache " + cache);
  std::filesystem::remove(cache);
  ASSERT_EQ(r.status, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["roofline"]["source"], "cached");
  EXPECT_EQ(j["roofline"]["read_gb_s"]["value"], 1234.5);
  EXPECT_NEAR(j["decode_bandwidth_fraction"].get<double>(), j["decode_gb_s"].get<double>() / 1234.5, 1e-12);
  const double peak = j["prefill_peak_gop_s"];
  EXPECT_TRUE(peak == 111 || peak == 222 || peak == 333) << peak;
  EXPECT_NEAR(j["prefill_peak_fraction"].get<double>(), j["prefill_gop_s"].get<double>() / peak, 1e-12);
}

TEST(PerfBenchCli, TableNamesBothPhasesAndTheRoofline) {
  CliResult r = run_bench_cli("-m " + kStories + " -p 8 -n 4 --reps 2 -t 1 --roofline-cache " + temp_cache("t"));
  ASSERT_EQ(r.status, 0) << r.err;
  for (const char* s : {"prefill", "decode", "median tok/s", "roofline", "GB/s", "GOP/s", "peak RSS"})
    EXPECT_NE(r.out.find(s), std::string::npos) << s << "\n" << r.out;
}

// --prepack reaches the model: the bytes a decode step reads follow the mode
// (off: the file's; all: K-quant panels, larger than the file's blocks).
TEST(PerfBenchCli, PrepackModeReachesTheModel) {
  const auto gguf = std::filesystem::temp_directory_path() / ("tandem_bench_prepack_" + std::to_string(::getpid()) + ".gguf");
  CliResult r = test::run_cli("synth -o '" + gguf.string() + "' --vocab-from " + kStories +
                              " --layers 2 --embd 256 --ff 512 --heads 4 --kv-heads 2 --type q4_k_m");
  ASSERT_EQ(r.status, 0) << r.err;
  std::map<std::string, uint64_t> bytes;
  for (const char* mode : {"off", "auto", "all"}) {
    r = run_bench_cli("-m '" + gguf.string() + "' -p 4 -n 2 --reps 1 --warmup 0 -t 1 --json --prepack " + mode +
                      " --roofline-cache " + temp_cache("prepack"));
    ASSERT_EQ(r.status, 0) << mode << ": " << r.err;
    const auto j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j["prepack"], mode);
    bytes[mode] = j["decode_weight_bytes_per_token"].get<uint64_t>();
  }
  EXPECT_EQ(bytes["auto"], bytes["off"]);  // no q8_0 / q4_0 matrices in this file
  if (cpu_supports_level(KernelLevel::kAvx2)) {
    EXPECT_GT(bytes["all"], bytes["off"]);
  }
  r = run_bench_cli("-m '" + gguf.string() + "' -p 4 -n 2 --prepack sometimes");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("--prepack"), std::string::npos) << r.err;
  std::filesystem::remove(gguf);
}

// --repack-cache reaches the model: the second run maps what the first wrote
// (when this kernel level repacks q8_0 at all) and says so in its JSON.
TEST(PerfBenchCli, RepackCacheIsUsedByTheNextRun) {
  const auto tag = std::to_string(::getpid());
  const auto gguf = std::filesystem::temp_directory_path() / ("tandem_bench_repack_" + tag + ".gguf");
  const auto dir = std::filesystem::temp_directory_path() / ("tandem_bench_repack_cache_" + tag);
  CliResult r = test::run_cli("synth -o '" + gguf.string() + "' --vocab-from " + kStories +
                              " --layers 2 --embd 64 --ff 96 --heads 4 --kv-heads 2 --type q8_0");
  ASSERT_EQ(r.status, 0) << r.err;
  std::vector<bool> hits;
  for (int run = 0; run < 2; ++run) {
    r = run_bench_cli("-m '" + gguf.string() + "' -p 4 -n 2 --reps 1 --warmup 0 -t 1 --json --repack-cache '" +
                      dir.string() + "' --roofline-cache " + temp_cache("repack"));
    ASSERT_EQ(r.status, 0) << r.err;
    hits.push_back(nlohmann::json::parse(r.out)["repack_cache_hit"].get<bool>());
  }
  EXPECT_FALSE(hits[0]);
  const bool written = std::filesystem::exists(dir) && !std::filesystem::is_empty(dir);
  EXPECT_EQ(hits[1], written);
  std::filesystem::remove_all(dir);
  std::filesystem::remove(gguf);
}

TEST(PerfBenchCli, BadInputExitsWithAMessage) {
  CliResult r = run_bench_cli("-m " + kStories + " -p 0 -n 4");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("-p"), std::string::npos) << r.err;
  r = run_bench_cli("-m /nonexistent/model.gguf -p 4 -n 4");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("/nonexistent/model.gguf"), std::string::npos) << r.err;
  r = run_bench_cli("-m " + kStories + " --reps 0");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("--reps"), std::string::npos) << r.err;
  r = run_bench_cli("-m " + kStories + " --batch 0");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("--batch"), std::string::npos) << r.err;
  // A prompt longer than a streaming window takes several steps.
  r = run_bench_cli("-m " + kStories + " -p 100 -n 4 --kv-window 32 --kv-heavy 32");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("use -p 84 or less"), std::string::npos) << r.err;
  r = run_bench_cli("-m " + kStories + " -p 84 -n 40 --reps 1 --warmup 0 --kv-window 32 --kv-heavy 32 --json");
  EXPECT_EQ(r.status, 0) << r.err;
}

}  // namespace
}  // namespace tandem

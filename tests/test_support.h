// Paths and small helpers shared by the model tests.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <gtest/gtest.h>

#include "engine/llm_engine.h"

namespace tandem::test {

// A greedy request that runs to max_tokens (an end-of-generation token does
// not stop it), so that outputs compared are always the same length.
inline RequestParams greedy_to(int32_t max_tokens) {
  RequestParams p;
  p.sampling.temperature = 0;
  p.max_tokens = max_tokens;
  p.stop_at_eog = false;
  return p;
}

// One greedy request on the serving engine, sized as `tandem run` sizes it.
inline Completion greedy(Model& model, std::vector<int32_t> prompt, int32_t max_tokens, bool stop_at_eog = true,
                         int32_t ctx = 512, int32_t threads = 2) {
  EngineConfig ec;
  ec.threads = threads;
  ec.max_context = ctx;
  ec.kv_tokens = ctx + 15;
  ec.max_seqs = 1;
  ec.policy = SchedulePolicy::kThroughput;
  ec.max_batch_tokens = ctx;
  ec.prefix_caching = false;
  Engine engine(model, ec);
  RequestParams p = greedy_to(max_tokens);
  p.stop_at_eog = stop_at_eog;
  return engine.run_one(std::move(prompt), p);
}

// Under the sanitizers (TANDEM_TEST_QUICK=1) tests may run fewer cases.
inline bool quick() { return std::getenv("TANDEM_TEST_QUICK") != nullptr; }

inline std::string shared_path(const std::string& rel) { return std::string(TANDEM_SHARED_DIR) + "/" + rel; }
inline std::string testdata_path(const std::string& rel) { return std::string(TANDEM_TESTDATA_DIR) + "/" + rel; }

inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Runs the tandem program with `args` (shell syntax) and captures its exit
// status, stdout and stderr separately.
struct CliResult {
  int status = -1;
  std::string out, err;
};

inline CliResult run_cli(const std::string& args) {
  const auto err_path = std::filesystem::temp_directory_path() / ("tandem_cli_err_" + std::to_string(::getpid()));
  const std::string cmd = std::string(TANDEM_CLI_PATH) + " " + args + " 2>" + err_path.string();
  CliResult r;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return r;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  const int st = ::pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  r.err = read_file(err_path.string());
  std::filesystem::remove(err_path);
  return r;
}

// The default Gemma 3 270M model that scripts/setup.sh installs. Empty when
// absent; on CI (CI=true) its absence is a failure, not a skip.
inline std::string gemma_model_path() {
  if (const char* p = std::getenv("TANDEM_GEMMA_MODEL"); p && *p) return p;
  const char* home = std::getenv("HOME");
  std::string p = std::string(home ? home : "") + "/.cache/tandem/models/gemma-3-270m-q4_k_m.gguf";
  return std::filesystem::exists(p) ? p : "";
}

#define TANDEM_REQUIRE_GEMMA(path_var)                                                           \
  const std::string path_var = ::tandem::test::gemma_model_path();                              \
  if (path_var.empty()) {                                                                       \
    const char* ci = std::getenv("CI");                                                         \
    if (ci && std::string(ci) == "true") FAIL() << "Gemma 3 270M is not installed (setup.sh)";  \
    GTEST_SKIP() << "Gemma 3 270M is not installed; run scripts/setup.sh";                     \
  }

}  // namespace tandem::test

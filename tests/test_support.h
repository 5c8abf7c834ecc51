// Paths and small helpers shared by the model tests.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <gtest/gtest.h>

namespace tandem::test {

inline std::string shared_path(const std::string& rel) { return std::string(TANDEM_SHARED_DIR) + "/" + rel; }
inline std::string testdata_path(const std::string& rel) { return std::string(TANDEM_TESTDATA_DIR) + "/" + rel; }

inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
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

#include "cli/common.h"

#include <cstdlib>
#include <filesystem>

#include "core/error.h"

namespace tandem::cli {

std::string resolve_model_path(const std::string& flag) {
  if (!flag.empty()) return flag;
  if (const char* env = std::getenv("TANDEM_MODEL"); env && *env) return env;
  std::string dir;
  if (const char* d = std::getenv("TANDEM_MODEL_DIR"); d && *d) {
    dir = d;
  } else if (const char* home = std::getenv("HOME"); home && *home) {
    dir = std::string(home) + "/.cache/tandem/models";
  }
  const std::string path = dir + "/gemma-3-270m-q4_k_m.gguf";
  if (!dir.empty() && std::filesystem::exists(path)) return path;
  fail(ErrorKind::kInvalidArgument,
       "no model given (-m FILE) and the default model is not installed at {} (run scripts/setup.sh)", path);
}

}  // namespace tandem::cli

#include "cli/common.h"

#include <cstdlib>
#include <filesystem>

#include <CLI/CLI.hpp>

#include "core/error.h"

namespace tandem::cli {

void add_prepack_option(CLI::App* cmd, std::string& value) {
  cmd->add_option("--prepack", value,
                  "Weights repacked at load: auto (q8_0 panels, q4_0 tiles: no extra memory), all (every "
                  "quantized type: faster batched decode on small models, more memory), off")
      ->check(CLI::IsMember({"auto", "all", "off"}))
      ->capture_default_str();
}

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

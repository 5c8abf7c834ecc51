#include "cli/common.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include <CLI/CLI.hpp>

#include "core/error.h"

namespace tandem::cli {

void add_prepack_option(CLI::App* cmd, std::string& value, std::string& cache_dir) {
  cmd->add_option("--prepack", value,
                  "Weights repacked at load: auto (q8_0 panels, q4_0 tiles: no extra memory), all (every "
                  "quantized type: faster batched decode on small models, more memory), off")
      ->check(CLI::IsMember({"auto", "all", "off"}))
      ->capture_default_str();
  cmd->add_option("--repack-cache", cache_dir,
                  "Directory for a file of the repacked weights, one per model file: the next load maps it "
                  "instead of repacking (as large as the repacked weights)")
      ->envname("TANDEM_REPACK_CACHE");
}

void add_spec_options(CLI::App* cmd, SpecFlags& f) {
  cmd->add_option("--spec", f.mode,
                  "Speculative decoding: ngram (drafts looked up in the text so far), draft (a draft model), off; "
                  "never changes the output")
      ->check(CLI::IsMember({"off", "ngram", "draft"}))
      ->capture_default_str();
  cmd->add_option("--draft-model", f.draft_model, "GGUF draft model for --spec draft (the same vocabulary)");
  cmd->add_option("--draft-max", f.draft_max, "Most tokens drafted per sequence and step")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  cmd->add_flag("--draft-fixed", f.fixed,
                "Always draft --draft-max tokens where a draft exists, instead of as many as the measured costs "
                "and acceptance say pay (for measuring)");
}

void add_device_option(CLI::App* cmd, std::string& device) {
  cmd->add_option("--device", device, "Where the forward passes run: cpu, or cuda (a build with -DTANDEM_CUDA=ON)")
      ->check(CLI::IsMember({"cpu", "cuda"}))
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

std::string read_text_file(const std::string& path, const char* flag) {
  std::FILE* f = path == "-" ? stdin : std::fopen(path.c_str(), "rb");
  if (!f) fail(ErrorKind::kIo, "{} {}: cannot open: {}", flag, path, std::strerror(errno));
  std::string text;
  char buf[1 << 16];
  size_t n = 0;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) text.append(buf, n);
  const bool bad = std::ferror(f);
  if (f != stdin) std::fclose(f);
  if (bad) fail(ErrorKind::kIo, "{} {}: read error", flag, path);
  if (text.ends_with('\n')) text.pop_back();
  if (text.ends_with('\r')) text.pop_back();
  if (text.empty()) fail(ErrorKind::kInvalidArgument, "{} {}: the file is empty", flag, path);
  return text;
}

}  // namespace tandem::cli

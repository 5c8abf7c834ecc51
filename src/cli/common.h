// Pieces shared by the subcommands.
#pragma once

#include <string>

namespace CLI {
class App;
}

namespace tandem::cli {

// --prepack auto|all|off (kernels/layouts.h) and --repack-cache DIR
// (model/repack_cache.h) on a subcommand that loads a model.
void add_prepack_option(CLI::App* cmd, std::string& value, std::string& cache_dir);

// -m when given, else $TANDEM_MODEL, else the default model installed by
// scripts/setup.sh. Throws tandem::Error when none exists.
std::string resolve_model_path(const std::string& flag);

// The whole of `path` ("-": standard input), less one final line break (the
// one an editor adds; llama.cpp's -f drops it too). `flag` names the option
// in errors; an empty text is one.
std::string read_text_file(const std::string& path, const char* flag);

}  // namespace tandem::cli

// Each subcommand registers its flags and the action that runs it.
#pragma once

#include <CLI/CLI.hpp>

namespace tandem::cli {

// The action stores its exit status in `rc`.
void add_run_command(CLI::App& app, int& rc);
void add_inspect_command(CLI::App& app, int& rc);
void add_tokenize_command(CLI::App& app, int& rc);
void add_convert_command(CLI::App& app, int& rc);
void add_bench_command(CLI::App& app, int& rc);
void add_synth_command(CLI::App& app, int& rc);
void add_serve_command(CLI::App& app, int& rc);
void add_perplexity_command(CLI::App& app, int& rc);
void add_quantize_command(CLI::App& app, int& rc);

}  // namespace tandem::cli

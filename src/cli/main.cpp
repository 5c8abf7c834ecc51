// tandem: the command-line front end. Parses, calls the library, prints.
#include <cstdio>
#include <string>

#include "cli/commands.h"
#include "core/error.h"

int main(int argc, char** argv) {
  CLI::App app{"Tandem: LLM inference for GGUF models"};
  app.require_subcommand(1);
  int rc = 0;
  tandem::cli::add_run_command(app, rc);
  tandem::cli::add_inspect_command(app, rc);
  tandem::cli::add_tokenize_command(app, rc);
  tandem::cli::add_convert_command(app, rc);
  tandem::cli::add_bench_command(app, rc);
  tandem::cli::add_synth_command(app, rc);
  tandem::cli::add_serve_command(app, rc);
  tandem::cli::add_perplexity_command(app, rc);
  tandem::cli::add_quantize_command(app, rc);
  // An unknown command is named, with the ones there are (CLI11 alone would
  // say only that a subcommand is required).
  std::string names;
  bool known = false;
  for (const CLI::App* sub : app.get_subcommands({})) {
    names += (names.empty() ? "" : ", ") + sub->get_name();
    known |= argc > 1 && sub->get_name() == argv[1];
  }
  if (argc > 1 && argv[1][0] != '-' && !known) {
    std::fprintf(stderr, "error: unknown command '%s'; the commands are: %s (tandem --help says more)\n", argv[1],
                 names.c_str());
    return 1;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const tandem::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return rc;
}

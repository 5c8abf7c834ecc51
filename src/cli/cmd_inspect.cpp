#include <cstdio>
#include <memory>
#include <string>

#include "cli/commands.h"
#include "gguf/gguf.h"
#include "gguf/inspect.h"

namespace tandem::cli {

void add_inspect_command(CLI::App& app, int& rc) {
  auto path = std::make_shared<std::string>();
  auto full = std::make_shared<bool>(false);
  CLI::App* cmd = app.add_subcommand("inspect", "Print a GGUF file's metadata and tensor table");
  cmd->add_option("file", *path, "GGUF file")->required();
  cmd->add_flag("--full", *full, "Print arrays in full");
  cmd->callback([path, full, &rc] {
    auto f = GgufFile::open(*path);
    std::fputs(describe_gguf(*f, *full).c_str(), stdout);
    rc = 0;
  });
}

}  // namespace tandem::cli

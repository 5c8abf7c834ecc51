#include <cstdio>
#include <memory>
#include <string>

#include "cli/commands.h"
#include "cli/common.h"
#include "gguf/gguf.h"
#include "gguf/inspect.h"
#include "core/error.h"
#include "model/model.h"
#include "model/plan.h"

namespace tandem::cli {

void add_inspect_command(CLI::App& app, int& rc) {
  struct Opts {
    std::string path;
    bool full = false, plan = false;
    RuntimeOptions runtime;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* cmd = app.add_subcommand("inspect", "Print a GGUF file's metadata and tensor table");
  cmd->add_option("file", o->path, "GGUF file")->required();
  cmd->add_flag("--full", o->full, "Print arrays in full");
  cmd->add_flag("--plan", o->plan,
                "Print instead, for every weight matrix, the layout it gets at load and the kernel of its products at "
                "1 row and at a prefill chunk (with --kernels, --prepack, ...: as those would run)");
  add_runtime_options(cmd, o->runtime);
  cmd->callback([o, &rc] {
    auto f = GgufFile::open(o->path);
    if (o->plan) std::fputs(describe_plan(plan_products(*f, o->runtime)).c_str(), stdout);
    else std::fputs(describe_gguf(*f, o->full).c_str(), stdout);
    if (!o->plan) {
      // What the KV cache costs, for files whose architecture Tandem runs.
      try {
        std::fputs(("\n" + describe_kv_cache(ModelConfig::from_gguf(*f))).c_str(), stdout);
      } catch (const Error& e) {
        std::fprintf(stdout, "\nkv cache: not described: %s\n", e.what());
      }
    }
    rc = 0;
  });
}

}  // namespace tandem::cli

#include <cstdio>
#include <memory>
#include <string>

#include <fmt/format.h>

#include "cli/commands.h"
#include "cli/common.h"
#include "gguf/gguf.h"
#include "tokenizer/tokenizer.h"

namespace tandem::cli {

void add_tokenize_command(CLI::App& app, int& rc) {
  struct Opts {
    std::string model, text;
    bool no_bos = false, no_special = false;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* cmd = app.add_subcommand("tokenize", "Print the token ids of a text, space-separated");
  cmd->add_option("-m,--model", o->model, "GGUF file (a vocabulary-only file works)");
  cmd->add_flag("--no-bos", o->no_bos, "Do not add BOS/EOS tokens");
  cmd->add_flag("--no-parse-special", o->no_special, "Tokenize special-token text as plain text");
  cmd->add_option("text", o->text, "Text to tokenize")->required();
  cmd->callback([o, &rc] {
    auto f = GgufFile::open(resolve_model_path(o->model));
    auto tok = Tokenizer::from_gguf(*f);
    auto ids = tok->encode(o->text, !o->no_bos, !o->no_special);
    std::printf("%s\n", fmt::format("{}", fmt::join(ids, " ")).c_str());
    rc = 0;
  });
}

}  // namespace tandem::cli

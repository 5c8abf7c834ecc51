#include <cstdio>
#include <memory>
#include <string>

#include "cli/commands.h"
#include "convert/llama2c.h"

namespace tandem::cli {

void add_convert_command(CLI::App& app, int& rc) {
  CLI::App* cmd = app.add_subcommand("convert", "Convert other model formats to GGUF");
  cmd->require_subcommand(1);
  struct Opts {
    std::string model, tokenizer, out;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* l2c = cmd->add_subcommand("llama2c", "A llama2.c checkpoint and tokenizer.bin to GGUF");
  l2c->add_option("model", o->model, "llama2.c checkpoint (.bin)")->required();
  l2c->add_option("tokenizer", o->tokenizer, "llama2.c tokenizer (.bin)")->required();
  l2c->add_option("-o,--output", o->out, "Output GGUF file")->required();
  l2c->callback([o, &rc] {
    convert_llama2c(o->model, o->tokenizer, o->out);
    std::fprintf(stderr, "wrote %s\n", o->out.c_str());
    rc = 0;
  });
}

}  // namespace tandem::cli

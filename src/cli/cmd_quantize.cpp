// tandem quantize: a GGUF model in another weight type, as llama.cpp's
// llama-quantize writes it (see convert/quantize.h). Progress and the summary
// go to stderr, like llama-quantize's.
#include <csignal>
#include <cstdio>
#include <memory>
#include <string>

#include <fmt/format.h>

#include "cli/commands.h"
#include "convert/quantize.h"
#include "core/error.h"

namespace tandem::cli {
namespace {

std::atomic<bool> g_interrupted{false};

extern "C" void on_signal(int) { g_interrupted.store(true); }

struct QuantizeOpts {
  std::string in, out, type_pos, type_flag;
  int32_t threads = 0;
  bool allow_requantize = false, pure = false, leave_output = false, dry_run = false;
};

std::string type_help() {
  std::string s = "Allowed types (case-insensitive; a llama_ftype number works too):\n";
  for (const auto& t : quantize_types()) {
    const bool alias = std::string_view(t.desc).starts_with("alias");
    s += fmt::format("  {:>2}  {:<7} {}\n", alias ? std::string("") : std::to_string(t.ftype), t.name, t.desc);
  }
  return s;
}

int run(const QuantizeOpts& o) {
  std::string type_name = o.type_flag.empty() ? o.type_pos : o.type_flag;
  if (!o.type_flag.empty() && !o.type_pos.empty() && o.type_flag != o.type_pos)
    fail(ErrorKind::kInvalidArgument, "quantize: two types given ('{}' and --type '{}')", o.type_pos, o.type_flag);
  if (type_name.empty() && !o.out.empty() && find_quantize_type(o.out))
    fail(ErrorKind::kInvalidArgument, "quantize: '{}' is a type, not an output file: give OUT.gguf before it",
         o.out);
  if (type_name.empty())
    fail(ErrorKind::kInvalidArgument, "quantize: no type given (--type T); one of: {}", quantize_type_list());
  const auto type = find_quantize_type(type_name);
  if (!type)
    fail(ErrorKind::kInvalidArgument, "quantize: unknown type '{}'; one of: {}", type_name, quantize_type_list());
  if (!o.dry_run && o.out.empty()) fail(ErrorKind::kInvalidArgument, "quantize: no output file given");

  QuantizeOptions qo;
  qo.n_threads = o.threads;
  qo.allow_requantize = o.allow_requantize;
  qo.pure = o.pure;
  qo.leave_output_tensor = o.leave_output;
  qo.dry_run = o.dry_run;
  qo.log = [](const std::string& line) {
    std::fputs(line.c_str(), stderr);
    std::fputc('\n', stderr);
  };
  qo.cancel = &g_interrupted;
  if (o.dry_run)
    std::fprintf(stderr, "quantize: calculating quantization size for '%s' as %s\n", o.in.c_str(), type->name);
  else
    std::fprintf(stderr, "quantize: quantizing '%s' to '%s' as %s\n", o.in.c_str(), o.out.c_str(), type->name);
  // A Ctrl-C stops at the next slab and removes the temporary file.
  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
  const QuantizeReport r = quantize_model(o.in, o.out, *type, qo);
  std::signal(SIGINT, SIG_DFL);
  std::signal(SIGTERM, SIG_DFL);
  std::string types;
  for (const auto& [t, n] : r.tensors_per_type) types += fmt::format(" {} x{}", t, n);
  std::fputs(fmt::format("quantize: {} tensors ({} converted;{}), {:.2f} MiB -> {:.2f} MiB, {:.2f} -> {:.2f} bits "
                         "per weight, in {:.1f} s{}\n",
                         r.n_tensors, r.n_converted, types, r.bytes_in / 1048576.0, r.bytes_out / 1048576.0,
                         r.bpw_in(), r.bpw_out(), r.seconds, o.dry_run ? " (dry run: nothing written)" : "")
                 .c_str(),
             stderr);
  return 0;
}

}  // namespace

void add_quantize_command(CLI::App& app, int& rc) {
  auto o = std::make_shared<QuantizeOpts>();
  CLI::App* cmd = app.add_subcommand(
      "quantize",
      "Write a GGUF model in another weight type, as llama.cpp's llama-quantize does (same per-tensor\n"
      "types for the mixes, same blocks, loadable by llama.cpp). The input may be of any type Tandem\n"
      "reads; converting already quantized tensors into another quantized type needs --allow-requantize.");
  cmd->footer(type_help());
  cmd->add_option("input", o->in, "Input GGUF model")->required();
  cmd->add_option("output", o->out, "Output GGUF file (written beside it under a temporary name, then renamed)");
  cmd->add_option("type", o->type_pos, "The type, as llama-quantize's third argument (or --type)");
  cmd->add_option("--type", o->type_flag, "Q4_K_M, Q8_0, BF16, ... (the list below)");
  cmd->add_option("-t,--threads", o->threads, "Threads (0: physical cores; does not change the output)")
      ->capture_default_str();
  cmd->add_flag("--allow-requantize", o->allow_requantize,
                "Convert tensors that are already quantized into other quantized types (loses more quality)");
  cmd->add_flag("--pure", o->pure, "Every convertible tensor in the type's own format: no mix rules");
  cmd->add_flag("--leave-output-tensor", o->leave_output, "Keep output.weight in its input type");
  cmd->add_flag("--dry-run", o->dry_run, "Show the type and size of each tensor; write nothing");
  cmd->callback([o, &rc] { rc = run(*o); });
}

}  // namespace tandem::cli

// tandem run: one prompt or one chat turn, streamed to stdout; the phase
// report (prefill vs decode) to stderr.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "chat/model_chat.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "engine/generator.h"
#include "engine/json_schema.h"
#include "gguf/gguf.h"
#include "core/cpu_features.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

namespace tandem::cli {
namespace {

struct RunOpts {
  std::string model, prompt, prompt_file, chat, system;
  std::vector<std::string> stop;
  int32_t n_predict = 256;
  int32_t threads = 0;
  int32_t ctx = 0;
  std::string kv_type = "f16";
  std::string json_schema, json_schema_file;
  RuntimeOptions runtime;
  bool json = false;
  bool ignore_eos = false;
  SamplingParams sp;
  int64_t seed = -1;
};

void print_report(const RunOpts& o, const Model& m, const GenerateReport& r, double load_s, int threads) {
  if (o.json) {
    nlohmann::json j = {
        {"model", m.file().path()},
        {"threads", threads},
        {"kernels", cpu_kernel_level()},
        {"load_s", load_s},
        {"prompt_tokens", r.prompt_tokens},
        {"prefill_s", r.prefill_s},
        {"prefill_tok_s", r.prefill_tok_s()},
        {"ttft_s", r.ttft_s},
        {"generated_tokens", r.generated_tokens},
        {"decode_s", r.decode_s},
        {"decode_tok_s", r.decode_tok_s()},
        {"ms_per_token", r.ms_per_token()},
        {"stop_reason", r.stop_reason},
    };
    std::fprintf(stderr, "%s\n", j.dump().c_str());
    return;
  }
  std::fputs(fmt::format("\n--- {} | {} threads, {} kernels, loaded in {:.3f} s\n"
                         "prefill  {:6d} prompt tokens  {:8.3f} s  {:8.1f} tok/s   time to first token {:.3f} s\n"
                         "decode   {:6d} tokens         {:8.3f} s  {:8.1f} tok/s   {:.2f} ms/token   stop: {}\n",
                         m.config().name, threads, cpu_kernel_level(), load_s, r.prompt_tokens, r.prefill_s,
                         r.prefill_tok_s(), r.ttft_s, r.generated_tokens, r.decode_s, r.decode_tok_s(),
                         r.ms_per_token(), r.stop_reason)
                 .c_str(),
             stderr);
}

int run(RunOpts& o) {
  if (!o.prompt.empty() + !o.prompt_file.empty() + !o.chat.empty() != 1)
    fail(ErrorKind::kInvalidArgument, "give exactly one of -p TEXT, -f FILE or --chat TEXT");
  if (!o.prompt_file.empty()) o.prompt = read_text_file(o.prompt_file, "--file");
  if (o.seed >= 0) o.sp.seed = static_cast<uint64_t>(o.seed);

  const auto t0 = std::chrono::steady_clock::now();
  auto model = Model::load(resolve_model_path(o.model), o.runtime);
  if (!model->load_warning().empty()) std::fprintf(stderr, "warning: %s\n", model->load_warning().c_str());
  ThreadPool pool(o.threads);
  Generator gen(*model, pool, o.ctx, parse_kv_type(o.kv_type));
  const double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  const Tokenizer& tok = model->tokenizer();
  GenerateOptions go;
  go.max_tokens = o.n_predict;
  go.sampling = o.sp;
  go.stop = o.stop;
  go.stop_at_eog = !o.ignore_eos;
  if (!o.json_schema.empty() || !o.json_schema_file.empty()) {
    if (!o.json_schema.empty() && !o.json_schema_file.empty())
      fail(ErrorKind::kInvalidArgument, "give --json-schema or --json-schema-file, not both");
    const std::string text = o.json_schema.empty() ? read_text_file(o.json_schema_file, "--json-schema-file")
                                                   : o.json_schema;
    const nlohmann::json schema = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (schema.is_discarded()) fail(ErrorKind::kInvalidArgument, "--json-schema: not valid JSON");
    go.json_schema = std::make_shared<const CompiledSchema>(compile_schema(schema));
  }
  std::vector<int32_t> prompt;
  if (!o.chat.empty()) {
    ChatTemplate tmpl = chat_template_for(model->file());
    std::vector<ChatMessage> msgs;
    if (!o.system.empty()) msgs.push_back({"system", o.system});
    msgs.push_back({"user", o.chat});
    prompt = tok.encode(tmpl.apply(msgs, true), true, true);
    for (auto& s : tmpl.stop_strings()) go.stop.push_back(s);
  } else {
    prompt = tok.encode(o.prompt, true, true);
  }

  GenerateReport r = gen.generate(prompt, go, [](std::string_view piece) {
    std::fwrite(piece.data(), 1, piece.size(), stdout);
    std::fflush(stdout);
    return true;
  });
  if (!o.chat.empty()) std::fputc('\n', stdout);
  std::fflush(stdout);
  print_report(o, *model, r, load_s, pool.size());
  return 0;
}

}  // namespace

void add_run_command(CLI::App& app, int& rc) {
  auto o = std::make_shared<RunOpts>();
  CLI::App* cmd = app.add_subcommand("run", "Generate text from a prompt or answer one chat message");
  cmd->add_option("-m,--model", o->model, "GGUF model file (default: the installed Gemma 3 270M)");
  cmd->add_option("-p,--prompt", o->prompt, "Text to continue (stdout gets exactly the continuation)");
  cmd->add_option("-f,--file", o->prompt_file, "Read the text to continue from FILE ('-': standard input)");
  cmd->add_option("--chat", o->chat, "A user message, formatted with the model's chat template");
  cmd->add_option("--system", o->system, "System message for --chat");
  cmd->add_option("-n,--n-predict", o->n_predict, "Tokens to generate (-1: until the context is full)")
      ->capture_default_str();
  cmd->add_option("--temp", o->sp.temperature, "Temperature (0: greedy)")->capture_default_str();
  cmd->add_option("--top-k", o->sp.top_k, "Top-k (0: off)")->capture_default_str();
  cmd->add_option("--top-p", o->sp.top_p, "Top-p (1: off)")->capture_default_str();
  cmd->add_option("--min-p", o->sp.min_p, "Min-p (0: off)")->capture_default_str();
  cmd->add_option("--repeat-penalty", o->sp.repeat_penalty, "Repetition penalty (1: off)")->capture_default_str();
  cmd->add_option("--repeat-last-n", o->sp.repeat_last_n, "Tokens the penalties look back over")
      ->capture_default_str();
  cmd->add_option("--frequency-penalty", o->sp.frequency_penalty, "Frequency penalty")->capture_default_str();
  cmd->add_option("--presence-penalty", o->sp.presence_penalty, "Presence penalty")->capture_default_str();
  cmd->add_option("--seed", o->seed, "Random seed (-1: random)")->capture_default_str();
  cmd->add_option("--stop", o->stop, "Stop string (repeatable)");
  cmd->add_option("-j,--json-schema", o->json_schema,
                  "The output is one JSON value fitting this schema ('{}': any JSON), and ends with it");
  cmd->add_option("--json-schema-file", o->json_schema_file, "The same, the schema read from FILE");
  cmd->add_option("-t,--threads", o->threads, "Threads (0: physical cores)")->capture_default_str();
  cmd->add_option("-c,--ctx-size", o->ctx, "Context size in tokens (0: min(model's, 4096))")
      ->capture_default_str();
  cmd->add_option("--kv-type", o->kv_type, "KV cache element type: f16 or f32")
      ->check(CLI::IsMember({"f16", "f32"}))
      ->capture_default_str();
  add_runtime_options(cmd, o->runtime);
  cmd->add_flag("--ignore-eos", o->ignore_eos, "Keep generating past end-of-generation tokens");
  cmd->add_flag("--json", o->json, "Print the phase report as one JSON object on stderr");
  cmd->callback([o, &rc] { rc = run(*o); });
}

}  // namespace tandem::cli

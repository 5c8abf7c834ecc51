// tandem run: one prompt or one chat turn, streamed to stdout; the phase
// report (prefill vs decode) to stderr.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <tuple>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/chat_terminal.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "core/error.h"
#include "runtime/json_parse.h"
#include "engine/json_schema.h"
#include "engine/llm_engine.h"
#include "engine/speculation.h"
#include "gguf/gguf.h"
#include "runtime/cpu_features.h"
#include "model/model.h"

namespace tandem::cli {
namespace {

struct RunOpts {
  std::string model, prompt, prompt_file, chat, system;
  std::vector<std::string> stop;
  int32_t n_predict = 256;
  int32_t threads = 0;
  int32_t ctx = 0;
  KvCacheFlags kv;
  KvStoreFlags store;
  std::string json_schema, json_schema_file;
  RuntimeOptions runtime;
  SpecFlags spec;
  std::string device = "cpu";
  bool json = false;
  bool interactive = false;  // --chat without a message
  bool ignore_eos = false;
  SamplingParams sp;
  int64_t seed = -1;
};

void print_report(const RunOpts& o, const Model& m, const Completion& c, double load_s, int threads) {
  const RequestTimings& t = c.timings;
  if (o.json) {
    nlohmann::json j = {
        {"model", m.file().path()},
        {"threads", threads},
        {"kernels", cpu_kernel_level()},
        {"load_s", load_s},
        {"prompt_tokens", t.prompt_tokens},
        {"prefill_s", t.prefill_s},
        {"prefill_tok_s", t.prefill_tok_s()},
        {"ttft_s", t.ttft_s},
        {"generated_tokens", t.generated_tokens},
        {"decode_s", t.decode_s},
        {"decode_tok_s", t.decode_tok_s()},
        {"ms_per_token", t.ms_per_token()},
        {"stop_reason", c.stop_cause},
        {"decode_steps", t.decode_steps},
        {"tokens_per_step", t.tokens_per_step()},
        {"spec", o.spec.mode},
        {"drafted_tokens", t.drafted},
        {"accepted_tokens", t.accepted},
        {"acceptance", t.acceptance()},
    };
    std::fprintf(stderr, "%s\n", j.dump().c_str());
    return;
  }
  std::fputs(fmt::format("\n--- {} | {} threads, {} kernels, loaded in {:.3f} s\n"
                         "prefill  {:6d} prompt tokens  {:8.3f} s  {:8.1f} tok/s   time to first token {:.3f} s\n"
                         "decode   {:6d} tokens         {:8.3f} s  {:8.1f} tok/s   {:.2f} ms/token   stop: {}\n",
                         m.config().name, threads, cpu_kernel_level(), load_s, t.prompt_tokens, t.prefill_s,
                         t.prefill_tok_s(), t.ttft_s, t.generated_tokens, t.decode_s, t.decode_tok_s(),
                         t.ms_per_token(), c.stop_cause)
                 .c_str(),
             stderr);
  if (o.spec.mode != "off")
    std::fputs(fmt::format("spec     {:6d} drafted, {} kept ({:.0f}%), {:.2f} tokens per decode step ({})\n",
                           t.drafted, t.accepted, 100 * t.acceptance(), t.tokens_per_step(), o.spec.mode)
                   .c_str(),
               stderr);
}

int run(RunOpts& o) {
  if (!o.prompt.empty() + !o.prompt_file.empty() + (!o.chat.empty() || o.interactive) != 1)
    fail(ErrorKind::kInvalidArgument, "give exactly one of -p TEXT, -f FILE or --chat [TEXT]");
  if (!o.prompt_file.empty()) o.prompt = read_text_file(o.prompt_file, "--file");
  if (o.seed >= 0) o.sp.seed = static_cast<uint64_t>(o.seed);

  RequestParams p;
  p.sampling = o.sp;
  p.max_tokens = o.n_predict;
  p.stop = o.stop;
  p.stop_at_eog = !o.ignore_eos;
  if (!o.json_schema.empty() || !o.json_schema_file.empty()) {
    if (!o.json_schema.empty() && !o.json_schema_file.empty())
      fail(ErrorKind::kInvalidArgument, "give --json-schema or --json-schema-file, not both");
    const std::string text = o.json_schema.empty() ? read_text_file(o.json_schema_file, "--json-schema-file")
                                                   : o.json_schema;
    p.json_schema = std::make_shared<const CompiledSchema>(compile_schema(parse_json(text, {}, "--json-schema")));
  }

  const auto t0 = std::chrono::steady_clock::now();
  // A GPU reads the file's layout: no repacked copy in host memory.
  RuntimeOptions runtime = o.runtime;
  if (o.device != "cpu") runtime.prepack = PrepackMode::kOff;
  auto model = Model::load(resolve_model_path(o.model), runtime);
  if (!model->load_warning().empty()) std::fprintf(stderr, "warning: %s\n", model->load_warning().c_str());
  std::unique_ptr<Model> draft;
  if (!o.spec.draft_model.empty())
    draft = Model::load(o.spec.draft_model, o.runtime);
  // One request on the serving engine: a pool of exactly one context, and
  // the whole prompt in one step.
  const int32_t ctx = o.ctx > 0 ? o.ctx : std::min(model->config().n_ctx_train, 4096);
  EngineConfig ec;
  ec.threads = o.threads;
  ec.max_context = ctx;
  ec.kv_tokens = ctx + 15;
  ec.kv_cache = kv_cache_types(o.kv);
  ec.kv_store = o.store.dir;
  ec.kv_store_bytes = kv_store_bytes(o.store);
  ec.max_seqs = 1;
  ec.max_waiting = 0;
  ec.policy = SchedulePolicy::kThroughput;
  ec.max_batch_tokens = ctx;
  // An interactive chat's turns and prefills reuse each other's blocks; a
  // KV store's blocks enter through the prefix cache.
  ec.prefix_caching = o.interactive || !o.store.dir.empty();
  if (o.interactive) ec.max_seqs = 2;  // a prefill may still run when the message is sent
  ec.spec.mode = parse_spec_mode(o.spec.mode);
  ec.spec.max_draft = o.spec.draft_max;
  ec.spec.adaptive = !o.spec.fixed;
  ec.device = o.device;
  ec.memory_available = o.runtime.memory_available;
  Engine engine(*model, ec, draft.get());
  const double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  const Intake& intake = engine.intake();
  if (o.interactive) {
    engine.start();
    return chat_in_terminal(engine, p, o.system);
  }
  std::vector<int32_t> prompt;
  if (!o.chat.empty()) {
    ChatPrompt chat = intake.chat({{"user", o.chat}}, o.system);
    prompt = std::move(chat.tokens);
    for (std::string& s : chat.stop) p.stop.push_back(std::move(s));
  } else {
    prompt = intake.prompt(o.prompt);
  }

  const Completion c = engine.run_one(std::move(prompt), p, [](std::string_view piece) {
    std::fwrite(piece.data(), 1, piece.size(), stdout);
    std::fflush(stdout);
    return true;
  });
  if (!o.chat.empty()) std::fputc('\n', stdout);
  std::fflush(stdout);
  print_report(o, *model, c, load_s, engine.threads());
  return 0;
}

}  // namespace

void add_run_command(CLI::App& app, int& rc) {
  auto o = std::make_shared<RunOpts>();
  CLI::App* cmd = app.add_subcommand("run", "Generate text from a prompt or answer one chat message");
  cmd->add_option("-m,--model", o->model, "GGUF model file (default: the installed Gemma 3 270M)");
  cmd->add_option("-p,--prompt", o->prompt, "Text to continue (stdout gets exactly the continuation)");
  cmd->add_option("-f,--file", o->prompt_file, "Read the text to continue from FILE ('-': standard input)");
  CLI::Option* chat = cmd->add_option("--chat", o->chat,
                                      "A user message, formatted with the model's chat template; without one, an "
                                      "interactive chat that prefills each message while it is typed")
                          ->expected(0, 1);
  cmd->add_option("--system", o->system, "System message for --chat");
  cmd->add_option("-n,--n-predict", o->n_predict, "Tokens to generate (-1: until the context is full; 0: none)")
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
  add_kv_cache_options(cmd, o->kv);
  add_kv_store_options(cmd, o->store);
  add_runtime_options(cmd, o->runtime);
  add_sparse_attention_option(cmd, o->runtime);
  add_spec_options(cmd, o->spec);
  add_device_option(cmd, o->device);
  cmd->add_flag("--ignore-eos", o->ignore_eos, "Keep generating past end-of-generation tokens");
  cmd->add_flag("--json", o->json, "Print the phase report as one JSON object on stderr");
  cmd->callback([o, chat, &rc] {
    o->interactive = chat->count() > 0 && o->chat.empty();
    rc = run(*o);
  });
}

}  // namespace tandem::cli

// tandem serve: the OpenAI-compatible HTTP server over the serving engine.
#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>

#include <fmt/format.h>

#include "cli/commands.h"
#include "cli/common.h"
#include "core/error.h"
#include "engine/llm_engine.h"
#include "model/model.h"
#include "server/http_server.h"

namespace tandem::cli {
namespace {

struct ServeOpts {
  std::string model, host = "127.0.0.1", api_key, alias, kv_memory, swap_space, policy = "latency";
  RuntimeOptions runtime;
  int port = 8080;
  int32_t threads = 0, ctx = 0, max_batch_tokens = 0, max_seqs = 32, max_waiting = 256, http_threads = 0;
  int64_t kv_tokens = 0;
  double step_factor = 1.5;
  bool no_prefix_cache = false;
};

int serve(const ServeOpts& o) {
  if (o.port < 0 || o.port > 65535) fail(ErrorKind::kInvalidArgument, "--port {} is not a TCP port", o.port);
  if (!o.kv_memory.empty() && o.kv_tokens > 0)
    fail(ErrorKind::kInvalidArgument, "give at most one of --kv-memory and --kv-tokens");
  if (o.policy != "latency" && o.policy != "throughput")
    fail(ErrorKind::kInvalidArgument, "--policy must be 'latency' or 'throughput', got '{}'", o.policy);

  // SIGINT/SIGTERM are taken by one thread with sigwait(), so they must be
  // blocked before any other thread exists (threads inherit the mask). A
  // client that hangs up must not kill the server through SIGPIPE.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  signal(SIGPIPE, SIG_IGN);

  auto model = Model::load(resolve_model_path(o.model), o.runtime);
  if (!model->load_warning().empty()) std::fprintf(stderr, "warning: %s\n", model->load_warning().c_str());
  EngineConfig ec;
  ec.threads = o.threads;
  ec.max_context = o.ctx > 0 ? o.ctx : std::min(model->config().n_ctx_train, 4096);
  ec.kv_tokens = o.kv_tokens;
  ec.kv_bytes = o.kv_memory.empty() ? 0 : parse_bytes(o.kv_memory, "--kv-memory");
  ec.swap_bytes = o.swap_space.empty() ? 0 : parse_bytes(o.swap_space, "--swap-space");
  ec.max_batch_tokens = o.max_batch_tokens;
  ec.max_seqs = o.max_seqs;
  ec.max_waiting = o.max_waiting;
  ec.policy = o.policy == "throughput" ? SchedulePolicy::kThroughput : SchedulePolicy::kLatency;
  ec.prefix_caching = !o.no_prefix_cache;
  ec.step_factor = o.step_factor;
  ec.memory_available = o.runtime.memory_available;
  Engine engine(*model, ec);

  server::ServerConfig sc;
  sc.host = o.host;
  sc.port = o.port;
  sc.api_key = o.api_key;
  sc.model_id = o.alias;
  sc.http_threads = o.http_threads;
  sc.max_context = ec.max_context;
  server::Server srv(engine, *model, sc);
  srv.bind();
  engine.start();

  std::atomic<bool> stopped_by_signal{false};
  std::thread waiter([&] {
    int sig = 0;
    sigwait(&stop_signals, &sig);
    if (!stopped_by_signal.exchange(true))
      std::fprintf(stderr, "tandem serve: %s, shutting down\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
    srv.stop();
  });
  std::fprintf(stderr, "tandem serve: %s on http://%s:%d (context %d, max %d sequences%s)\n",
               srv.model_id().c_str(), o.host.c_str(), srv.port(), ec.max_context, ec.max_seqs,
               o.api_key.empty() ? "" : ", API key required");
  std::fflush(stderr);
  srv.run();
  // run() also returns on a listener failure: wake the waiter so it can end.
  if (!stopped_by_signal.exchange(true)) pthread_kill(waiter.native_handle(), SIGTERM);
  waiter.join();
  engine.stop();
  return 0;
}

}  // namespace

void add_serve_command(CLI::App& app, int& rc) {
  auto o = std::make_shared<ServeOpts>();
  CLI::App* cmd = app.add_subcommand("serve", "OpenAI-compatible HTTP server with continuous batching");
  cmd->add_option("-m,--model", o->model, "GGUF model file (default: the installed Gemma 3 270M)");
  cmd->add_option("--host", o->host, "Address to listen on")->capture_default_str();
  cmd->add_option("--port", o->port, "TCP port (0: any free port)")->capture_default_str();
  cmd->add_option("--api-key", o->api_key, "Require 'Authorization: Bearer KEY' on every route but /health");
  cmd->add_option("--model-alias", o->alias, "Model id reported by /v1/models (default: the file name)");
  cmd->add_option("-t,--threads", o->threads, "Compute threads (0: physical cores)")->capture_default_str();
  cmd->add_option("-c,--ctx-size", o->ctx, "Context per sequence in tokens (0: min(model's, 4096))")
      ->capture_default_str();
  auto* mem = cmd->add_option("--kv-memory", o->kv_memory, "KV cache pool size in bytes (suffixes K, M, G)");
  cmd->add_option("--kv-tokens", o->kv_tokens, "KV cache pool size in tokens")->excludes(mem);
  cmd->add_option("--swap-space", o->swap_space,
                  "Host memory for the K/V of preempted sequences (suffixes K, M, G); without it they are "
                  "recomputed");
  cmd->add_option("--max-batch-tokens", o->max_batch_tokens, "Tokens per engine step (0: policy default)")
      ->capture_default_str();
  cmd->add_option("--max-seqs", o->max_seqs, "Sequences per engine step")->capture_default_str();
  cmd->add_option("--max-waiting", o->max_waiting, "Wait-queue bound; requests beyond it get 429")
      ->capture_default_str();
  cmd->add_option("--policy", o->policy, "Scheduling: latency (chat) or throughput (batch jobs)")
      ->capture_default_str();
  cmd->add_option("--step-factor", o->step_factor,
                  "Latency policy: steps that prefill next to running decodes aim at this multiple of a "
                  "decode-only step's time (<= 1: off, prompt chunks sized by tokens alone)")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 100.0));
  cmd->add_flag("--no-prefix-cache", o->no_prefix_cache, "Do not share KV blocks between requests");
  add_runtime_options(cmd, o->runtime);
  cmd->add_option("--http-threads", o->http_threads, "HTTP worker threads (0: max-seqs + max-waiting + 8)")
      ->capture_default_str();
  cmd->callback([o, &rc] { rc = serve(*o); });
}

}  // namespace tandem::cli

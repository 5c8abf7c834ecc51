// tandem serve: the OpenAI-compatible HTTP server over the serving engine.
#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstdio>
#include <memory>
#include <string>
#include <tuple>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "cli/commands.h"
#include "cli/common.h"
#include "core/error.h"
#include "engine/llm_engine.h"
#include "kv/kv_cache.h"
#include "model/model.h"
#include "server/api_server.h"

namespace tandem::cli {
namespace {

struct ServeOpts {
  std::string model, host = "127.0.0.1", alias, kv_memory, swap_space, policy = "latency", max_body = "64M";
  std::vector<std::string> api_key;  // repeatable: any of them is accepted
  bool cache_per_key = false;
  server::ParseLimits request;
  int64_t max_tokenize = 0;
  RuntimeOptions runtime;
  SpecFlags spec;
  KvCacheFlags kv;
  KvStoreFlags store;
  std::string device = "cpu";
  int32_t json_depth = 64;
  std::string kv_events, kv_events_replay, kv_events_topic, kv_events_format = "array-map", kv_events_seed;
  int port = 8080;
  int32_t threads = 0, ctx = 0, max_batch_tokens = 0, max_seqs = 32, max_waiting = 256, http_threads = 2;
  int32_t max_conns_per_ip = 128, max_conns = 1024;
  double head_timeout = 10, body_timeout = 60, idle_timeout = 60, write_timeout = 60;
  std::string body_budget;
  std::vector<std::string> allowed_hosts, cors_origins;
  int64_t kv_tokens = 0;
  double step_factor = 1.5;
  bool no_prefix_cache = false;
  std::string role = "both";
  int kv_port = 0;
  int32_t block_size = 16;
  double kv_pin = 30, kv_fetch_timeout = 30, kv_fetch_share = 0.1;
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

  // A GPU reads the file's layout: no repacked copy in host memory.
  RuntimeOptions runtime = o.runtime;
  if (o.device != "cpu") runtime.prepack = PrepackMode::kOff;
  const std::string model_path = resolve_model_path(o.model);
  auto model = Model::load(model_path, runtime);
  if (!model->load_warning().empty()) std::fprintf(stderr, "warning: %s\n", model->load_warning().c_str());
  std::unique_ptr<Model> draft;
  if (!o.spec.draft_model.empty())
    draft = Model::load(o.spec.draft_model, o.runtime);
  const server::Role role = server::parse_role(o.role);
  if (o.kv_port < 0 || o.kv_port > 65535) fail(ErrorKind::kInvalidArgument, "--kv-port {} is not a TCP port", o.kv_port);
  EngineConfig ec;
  ec.threads = o.threads;
  ec.max_context = o.ctx > 0 ? o.ctx : std::min(model->config().n_ctx_train, 4096);
  ec.kv_tokens = o.kv_tokens;
  ec.kv_bytes = o.kv_memory.empty() ? 0 : parse_bytes(o.kv_memory, "--kv-memory");
  ec.kv_cache = kv_cache_types(o.kv);
  ec.kv_store = o.store.dir;
  ec.kv_store_bytes = kv_store_bytes(o.store);
  ec.block_size = o.block_size;
  ec.kv_import_share = o.kv_fetch_share;  // the decode side paces the copy into its pool as it paces the fetch
  // A transferred block carries every layer of its positions: sliding-window
  // layers keep all their blocks too, as with --swa-full.
  if (role != server::Role::kBoth) ec.kv_cache.swa_full = true;
  ec.swap_bytes = o.swap_space.empty() ? 0 : parse_bytes(o.swap_space, "--swap-space");
  ec.max_batch_tokens = o.max_batch_tokens;
  ec.max_seqs = o.max_seqs;
  ec.max_waiting = o.max_waiting;
  ec.policy = o.policy == "throughput" ? SchedulePolicy::kThroughput : SchedulePolicy::kLatency;
  ec.prefix_caching = !o.no_prefix_cache;
  ec.step_factor = o.step_factor;
  ec.spec.mode = parse_spec_mode(o.spec.mode);
  ec.spec.max_draft = o.spec.draft_max;
  ec.spec.adaptive = !o.spec.fixed;
  ec.device = o.device;
  ec.memory_available = o.runtime.memory_available;
  Engine engine(*model, ec, draft.get());

  server::ServerConfig sc;
  sc.host = o.host;
  sc.port = o.port;
  sc.api_keys = o.api_key;
  if (o.cache_per_key && o.api_key.empty()) fail(ErrorKind::kInvalidArgument, "--cache-per-key needs --api-key");
  sc.cache_per_key = o.cache_per_key;
  sc.request = o.request;
  sc.max_tokenize = o.max_tokenize;
  sc.model_id = o.alias;
  sc.max_context = ec.max_context;
  sc.allowed_hosts = o.allowed_hosts;
  sc.cors_origins = o.cors_origins;
  sc.http.workers = o.http_threads;
  sc.http.head_timeout_s = o.head_timeout;
  sc.http.body_timeout_s = o.body_timeout;
  sc.http.idle_timeout_s = o.idle_timeout;
  sc.http.write_timeout_s = o.write_timeout;
  sc.http.max_connections = o.max_conns;
  sc.http.max_connections_per_ip = o.max_conns_per_ip;
  sc.http.max_body_bytes = static_cast<size_t>(parse_bytes(o.max_body, "--max-body"));
  if (!o.body_budget.empty())
    sc.http.body_budget_bytes = static_cast<size_t>(parse_bytes(o.body_budget, "--body-budget"));
  if (sc.http.body_budget_bytes != 0 && sc.http.body_budget_bytes < sc.http.max_body_bytes)
    fail(ErrorKind::kInvalidArgument, "--body-budget {} is smaller than --max-body {}", o.body_budget, o.max_body);
  sc.json.max_depth = o.json_depth;
  sc.kv_events.endpoint = o.kv_events;
  sc.kv_events.replay_endpoint = o.kv_events_replay;
  sc.kv_events.topic = o.kv_events_topic;
  using Layout = server::KvEventsConfig::Layout;
  sc.kv_events.layout = o.kv_events_format == "array" ? Layout::kArray
                        : o.kv_events_format == "map" ? Layout::kMap
                                                      : Layout::kArrayMap;
  sc.kv_events.hash_seed = o.kv_events_seed;
  if (o.kv_events.empty() && (!o.kv_events_replay.empty() || !o.kv_events_topic.empty()))
    fail(ErrorKind::kInvalidArgument, "--kv-events-replay and --kv-events-topic need --kv-events");
  if (o.kv_events.empty() && !o.kv_events_seed.empty())
    fail(ErrorKind::kInvalidArgument, "--kv-events-hash-seed needs --kv-events");
  sc.kv_transfer.role = role;
  sc.kv_transfer.host = o.host;
  sc.kv_transfer.port = o.kv_port;
  sc.kv_transfer.pin_s = o.kv_pin;
  sc.kv_transfer.fetch_timeout_s = o.kv_fetch_timeout;
  sc.kv_transfer.fetch_share = o.kv_fetch_share;
  server::Server srv(engine, sc);
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
  const MetricsSnapshot km = engine.metrics();
  const std::string window =
      km.kv_window > 0 ? fmt::format(" (sliding-window layers keep {} positions)", km.kv_window) : "";
  const KvShape kv_shape = model->kv_shape();
  const std::string layout =
      model->config().latent_attention()
          ? fmt::format(", latent: {} + {} values a layer", kv_shape.v_width, kv_shape.k_width)
          : "";
  std::fprintf(stderr, "tandem serve: KV cache %s, %lld tokens in %.1f MiB, %zu bytes per token%s%s\n",
               kv_format_name(kv_format(ec.kv_cache)).c_str(), static_cast<long long>(km.kv_tokens_total),
               static_cast<double>(engine.kv_bytes()) / (1024.0 * 1024.0),
               KvCache::bytes_per_token(kv_shape, kv_format(ec.kv_cache)), layout.c_str(), window.c_str());
  if (!srv.kv_events_endpoint().empty())
    std::fprintf(stderr, "tandem serve: KV events on %s%s%s\n", srv.kv_events_endpoint().c_str(),
                 srv.kv_events_replay_endpoint().empty() ? "" : ", replay on ",
                 srv.kv_events_replay_endpoint().c_str());
  if (role != server::Role::kBoth)
    std::fprintf(stderr, "tandem serve: role %s%s\n", server::role_name(role),
                 srv.kv_transfer_port() ? fmt::format(", KV transfer on tcp://{}:{}", o.host, srv.kv_transfer_port()).c_str()
                                        : "");
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
  cmd->add_option("--api-key", o->api_key,
                  "Require 'Authorization: Bearer KEY' on every route but /health and / (the web page: it holds "
                  "no data, and asks for the key for its calls); repeat it to accept several keys");
  cmd->add_option("--model-alias", o->alias, "Model id reported by /v1/models (default: the file name)");
  cmd->add_option("-t,--threads", o->threads, "Compute threads (0: physical cores)")->capture_default_str();
  cmd->add_option("-c,--ctx-size", o->ctx, "Context per sequence in tokens (0: min(model's, 4096))")
      ->capture_default_str();
  auto* mem = cmd->add_option("--kv-memory", o->kv_memory, "KV cache pool size in bytes (suffixes K, M, G)");
  cmd->add_option("--kv-tokens", o->kv_tokens, "KV cache pool size in tokens")->excludes(mem);
  add_kv_cache_options(cmd, o->kv);
  add_kv_store_options(cmd, o->store);
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
  cmd->add_flag("--cache-per-key", o->cache_per_key,
                "Share cached prompt blocks and /v1/prefill sessions only among clients of the same API key "
                "(with several --api-key)");
  cmd->add_option("--max-stop", o->request.max_stop, "Stop strings one request may give")
      ->capture_default_str()
      ->check(CLI::Range(0, 1024));
  cmd->add_option("--max-stop-length", o->request.max_stop_bytes, "Bytes of one stop string")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--max-messages", o->request.max_messages, "Messages one chat request may hold")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 24));
  cmd->add_option("--max-logprob-entries", o->request.max_logprob_entries,
                  "Logprob entries one request may ask for: choices x tokens x (1 + top logprobs)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
  cmd->add_option("--max-tokenize", o->max_tokenize,
                  "Tokens /tokenize may return and /detokenize take (0: the context length)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 40));
  add_runtime_options(cmd, o->runtime);
  add_sparse_attention_option(cmd, o->runtime);
  add_spec_options(cmd, o->spec);
  add_device_option(cmd, o->device);
  cmd->add_option("--http-threads", o->http_threads,
                  "Threads that parse and tokenize requests (connections themselves take none)")
      ->capture_default_str()
      ->check(CLI::Range(1, 64));
  cmd->add_option("--allowed-hosts", o->allowed_hosts,
                  "Host names the server answers to beside localhost and IP addresses ('*': any), comma-separated")
      ->delimiter(',');
  cmd->add_option("--cors-origin", o->cors_origins,
                  "Origin (scheme://host:port) whose web pages may call the API ('*': any); repeatable");
  cmd->add_option("--head-timeout", o->head_timeout, "Seconds a client has to send a request's head")
      ->capture_default_str()
      ->check(CLI::Range(0.1, 3600.0));
  cmd->add_option("--body-timeout", o->body_timeout, "Seconds a client has to send a request's body")
      ->capture_default_str()
      ->check(CLI::Range(0.1, 3600.0));
  cmd->add_option("--idle-timeout", o->idle_timeout, "Seconds a keep-alive connection may wait for its next request")
      ->capture_default_str()
      ->check(CLI::Range(0.1, 3600.0));
  cmd->add_option("--write-timeout", o->write_timeout,
                  "Seconds a client may read none of its response before the connection closes")
      ->capture_default_str()
      ->check(CLI::Range(0.1, 3600.0));
  cmd->add_option("--max-conns", o->max_conns,
                  "Connections in all (lowered to what the file-descriptor limit allows)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--max-conns-per-ip", o->max_conns_per_ip, "Connections one client address may hold")
      ->capture_default_str()
      ->check(CLI::Range(1, 65536));
  cmd->add_option("--max-body", o->max_body, "Largest request body, after chunked decoding (suffixes K, M, G)")
      ->capture_default_str();
  cmd->add_option("--body-budget", o->body_budget,
                  "Request bodies held in memory at once, over all connections (suffixes K, M, G; default: "
                  "--max-body)");
  cmd->add_option("--json-depth", o->json_depth, "Deepest nesting a request's JSON may have")
      ->capture_default_str()
      ->check(CLI::Range(2, 1000));
  cmd->add_option("--kv-events", o->kv_events,
                  "Publish the prefix cache's changes over ZeroMQ in vLLM's format, for prefix-aware routers "
                  "(tcp://*:5557 binds, tcp://HOST:PORT connects)");
  cmd->add_option("--kv-events-replay", o->kv_events_replay,
                  "ZeroMQ address where subscribers ask for missed KV event batches (ROUTER; e.g. tcp://*:5558)");
  cmd->add_option("--kv-events-topic", o->kv_events_topic, "Topic (first frame) of every KV event message");
  cmd->add_option("--kv-events-format", o->kv_events_format,
                  "MessagePack layout of the KV events, as one vLLM version or another sent them: array "
                  "(llm-d's indexer), array-map (vllm-router) or map (docs/scale-out.md)")
      ->check(CLI::IsMember({"array", "array-map", "map"}))
      ->capture_default_str();
  cmd->add_option("--kv-events-hash-seed", o->kv_events_seed,
                  "Seed of the KV events' block hashes: vLLM's PYTHONHASHSEED, llm-d's hashSeed (default: empty, "
                  "llm-d's default)");
  cmd->add_option("--role", o->role,
                  "prefill: compute prompts and keep their KV blocks for decode instances to fetch; decode: "
                  "fetch them before decoding (vllm-router's prefill/decode mode, docs/scale-out.md); both: "
                  "neither")
      ->check(CLI::IsMember({"both", "prefill", "decode"}))
      ->capture_default_str();
  cmd->add_option("--block-size", o->block_size,
                  "Tokens per KV block (a multiple of 16 for quantized KV types); prefill and decode instances "
                  "must agree")
      ->capture_default_str()
      ->check(CLI::Range(1, 1024));
  cmd->add_option("--kv-port", o->kv_port, "Prefill role: TCP port of the KV transfer listener (0: any free port)")
      ->capture_default_str();
  cmd->add_option("--kv-transfer-timeout", o->kv_pin,
                  "Prefill role: seconds a prompt's blocks wait for their decode instance before they are dropped")
      ->capture_default_str()
      ->check(CLI::Range(0.1, 3600.0));
  cmd->add_option("--kv-fetch-timeout", o->kv_fetch_timeout,
                  "Decode role: seconds a fetch of a prompt's blocks may take, connect to last byte")
      ->capture_default_str()
      ->check(CLI::Range(0.1, 3600.0));
  cmd->add_option("--kv-fetch-share", o->kv_fetch_share,
                  "Decode role: while sequences decode, the share of the time a fetch may take receiving blocks "
                  "and writing them into the pool (it waits in between, so decoding is not stalled); 1: as fast "
                  "as it can")
      ->capture_default_str()
      ->check(CLI::Range(0.01, 1.0));
  cmd->callback([o, &rc] { rc = serve(*o); });
}

}  // namespace tandem::cli

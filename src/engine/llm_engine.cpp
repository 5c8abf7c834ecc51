#include "engine/llm_engine.h"

#include <algorithm>
#include <deque>
#include <exception>
#include <mutex>
#include <string>

#include "core/error.h"
#include "runtime/thread_pool.h"
#include "engine/kv_pool_sizing.h"
#include "engine/kv_transfer.h"
#include "engine/kv_event_relay.h"
#include "engine/kv_store.h"
#include "engine/metrics_recorder.h"
#include "engine/prefill_pacer.h"
#include "engine/prefill_sessions.h"
#include "engine/prompt_scoring.h"
#include "engine/request_checks.h"
#include "engine/request_inbox.h"
#include "engine/scheduler.h"
#include "engine/sequence_factory.h"
#include "engine/sequence_output.h"
#include "engine/speculative_decoding.h"
#include "engine/step_batch.h"
#include "engine/streaming_window.h"
#include "kv/block_manager.h"
#include "model/executor.h"
#include "model/model_fingerprint.h"
#include "runtime/cpu_features.h"
#include "model/model.h"
#include "model/model_fingerprint.h"
#include "runtime/cpu_features.h"
#include "tokenizer/tokenizer.h"

namespace tandem {
namespace {

constexpr int64_t kPromptLogitBytes = int64_t{64} << 20;

}  // namespace

struct Engine::Impl {
  Impl(Model& m, const EngineConfig& c, Model* draft_model);

  Model& model;
  const EngineConfig cfg;
  int32_t max_context = 0;
  std::unique_ptr<Intake> intake;
  SequenceFactory seqs;
  ThreadPool pool;
  StepLog steps;  // the clock, and a record of the last steps
  MetricsRecorder metrics;

  // What a step goes through, and the modules it calls at its named points.
  std::unique_ptr<Executor> exec;  // the forward passes and the KV pool they write
  std::unique_ptr<BlockManager> blocks;
  std::unique_ptr<Scheduler> sched;
  std::unique_ptr<PrefillPacer> pacer;  // latency policy only
  std::unique_ptr<StreamingWindow> window;  // --kv-window: evicts between a sequence's sinks and its window
  std::unique_ptr<PrefillSessions> sessions;  // progressive prefill
  std::unique_ptr<SpeculativeDecoding> spec;  // cfg.spec.mode != kOff
  std::unique_ptr<KvEventRelay> kv_events;
  std::unique_ptr<KvStore> store;  // --kv-store
  KvBlockLayout block_layout;  // blocks outside the process (KV transfer)
  PromptScorer scored;  // prompt positions whose logprobs this step's logits give

  // Intake: filled by submit()/cancel() on any thread, drained by step().
  RequestInbox inbox;
  uint64_t next_request_id = 1, next_seq_id = 1, next_arrival = 1;  // under the inbox's lock
  // Sequences submitted and not finished (the inbox's, waiting, running,
  // swapped): what admission counts, exact at every moment.
  std::atomic<int64_t> live{0};
  std::thread loop;
  std::atomic<bool> stopping{false};

  // The live timeline: what the observer hears after each step.
  std::function<void(const StepReport&)> observer;
  StepReport report;
  uint64_t preemptions_seen = 0;

  // Decode instance: sequences whose transferred blocks are going into the
  // pool, a few per step (import_transferred), in arrival order; each joins
  // the scheduler once its blocks are all in.
  struct Importing {
    std::unique_ptr<Sequence> seq;
    KvImportResult total;  // over the steps so far
    bool started = false;
  };
  std::deque<Importing> importing;
  double import_s_per_block = 0;  // measured, for the per-step budget

  // Step scratch.
  StepBatch batch;
  Logits logits;  // sized for the largest step so far, reused
  struct Sampled {
    Sequence* seq;
    const float* logits;  // its first row; drafts add one row each
    int32_t token = -1;
    std::exception_ptr error;
    std::vector<int32_t> verified;  // speculation: the tokens its rows gave, in order
  };
  std::vector<Sampled> sampled;
  // Set by first_token for the session save of a prefill that ends there.
  std::shared_ptr<const std::vector<float>> finishing_logits;

  bool step();
  // The step's named points, in order.
  void drain_inbox();
  // Writes transferred blocks into the pool within this step's share
  // (cfg.kv_import_share of the last step's time while sequences decode;
  // all of them otherwise) and schedules the sequences whose blocks are in.
  void import_transferred();
  // Samples the first token of the sequences a session resumed whole, before
  // the step's forward pass. True when there were any.
  bool start_ready();
  double forward(std::span<const ScheduledSeq> scheduled);  // returns when it began
  void sample(std::span<const ScheduledSeq> scheduled);
  void accept(std::span<const ScheduledSeq> scheduled);
  // Runs between steps on the engine's thread: a requested cache reset, then
  // the step's KV events to their sink.
  void after_step() {
    if (kv_events->reset_if_requested()) update_gauges();
    kv_events->publish();
  }

  // Speculation: keeps the rows of `s` its verification kept, then accepts
  // their tokens.
  void accept_verified(Sequence* s, const Sampled& x, int32_t nv);
  // Accepts `token`, sampled from `logits` (and forks the other choices of an n > 1 request).
  void handle_logits(Sequence* seq, const float* logits, int32_t token);
  // The first token of a choice (after its prompt's logprobs, when asked).
  void first_token(Sequence* seq, const float* logits, int32_t token);
  // False when the token ended the sequence (it is gone then).
  bool accept_token(Sequence* seq, int32_t token, const float* logits);
  // reason: OpenAI's finish_reason; cause: what ended it (RequestEvent::stop_cause).
  void finish(Sequence* seq, const std::string& reason, const std::string& cause, const std::string& error = "");
  void emit(Sequence* seq, RequestEvent ev);
  void fail_all(const std::string& error);
  void update_gauges();
};

Engine::Impl::Impl(Model& m, const EngineConfig& c, Model* draft_model)
    : model(m), cfg(c), seqs(m.tokenizer()), pool(c.threads) {
  const ModelConfig& mc = m.config();
  max_context = c.max_context > 0 ? c.max_context : std::min(mc.n_ctx_train, 4096);
  if (max_context > mc.n_ctx_train)
    fail(ErrorKind::kInvalidArgument, "context size {} exceeds the model's training context {}", max_context,
         mc.n_ctx_train);
  intake = std::make_unique<Intake>(m, max_context);
  if (c.block_size <= 0 || c.max_seqs <= 0 || c.max_waiting < 0)
    fail(ErrorKind::kInvalidArgument, "block size, max sequences must be positive and max waiting >= 0");
  const KvFormat kv_fmt = kv_format(c.kv_cache);
  const KvCacheTypes& kc = c.kv_cache;
  check_streaming_window(kc, c.block_size, max_context, c.spec.mode, c.device);
  if (mc.latent_attention() && kc.heavy > 0)
    fail(ErrorKind::kInvalidArgument,
         "heavy hitters rank positions by attention mass, which latent attention ({}) does not record",
         mc.arch_name);
  const bool latency = c.policy == SchedulePolicy::kLatency;
  const int32_t batch_tokens = c.max_batch_tokens > 0 ? c.max_batch_tokens : (latency ? 256 : 1024);
  const int32_t chunk = latency ? std::min(batch_tokens, 128) : batch_tokens;
  KvPoolAsk ask;
  ask.kv_cache = kc;
  ask.format = kv_fmt;
  ask.block_size = c.block_size;
  ask.max_context = max_context;
  ask.max_seqs = c.max_seqs;
  ask.kv_tokens = c.kv_tokens;
  ask.kv_bytes = c.kv_bytes;
  ask.swap_bytes = c.swap_bytes;
  ask.prefill_chunk = chunk;
  // A streaming window keeps its own positions in every layer.
  ask.page_windowed_layers = !kc.swa_full && kc.window == 0 && c.device == "cpu";
  ask.memory_available = c.memory_available;
  const SparseAttention& sparse = m.options().sparse_attention;
  // Full-attention layers only keep key bounds: sliding-window layers already read little.
  if (sparse.budget > 0) {
    ask.key_bounds.assign(mc.n_layer, false);
    for (int32_t l = 0; l < mc.n_layer; ++l) ask.key_bounds[l] = !mc.layer_is_swa[l];
  }
  KvPlan plan = size_kv_pool(m, ask);
  if (sparse.budget > 0) {
    check_sparse_attention(sparse, c.block_size);
    if (kc.window > 0)
      fail(ErrorKind::kInvalidArgument,
           "--sparse-attention cannot be combined with a streaming window (--kv-window, --kv-heavy): the window "
           "evicts the blocks sparse attention chooses from");
    if (c.device != "cpu")
      fail(ErrorKind::kInvalidArgument, "--sparse-attention runs on the CPU only (--device {})", c.device);
    batch.sparse_budget = sparse.budget;
  }
  const KvPaging& paging = plan.paging;
  const int64_t n_blocks = plan.n_blocks, groups = paging.n_groups;
  if (c.device == "cpu") exec = make_cpu_executor(m, plan, pool);
  else if (c.device == "cuda") exec = make_cuda_executor(m, plan);
  else fail(ErrorKind::kInvalidArgument, "unknown device '{}' (cpu or cuda)", c.device);
  blocks = std::make_unique<BlockManager>(static_cast<int32_t>(n_blocks), c.block_size, c.prefix_caching,
                                          paging.n_windowed(), paging.window);
  blocks->set_copy_block([this](int32_t src, int32_t dst) { exec->copy_block(src, dst); });  // copy-on-write
  blocks->set_copy_slots([this](int32_t src, int32_t dst, int32_t from, int32_t to) {
    exec->copy_slots(src, dst, from, to);
  });
  SchedulerConfig sc;
  sc.max_batch_tokens = batch_tokens;
  sc.prefill_chunk = chunk;
  sc.shortest_prompt_first = latency;
  sc.max_seqs = c.max_seqs;
  sc.max_context = max_context;
  window = std::make_unique<StreamingWindow>(kc, c.block_size, mc.n_layer * m.kv_shape().k_width, *blocks, *exec);
  sc.stream_limit = window->limit();
  // Scoring a prompt keeps a row of logits per position: at most 64 MiB of
  // them a step (64 rows of Gemma 3's 262k vocabulary, 512 of a 32k one).
  sc.max_prompt_logit_rows = static_cast<int32_t>(
      std::max<int64_t>(16, kPromptLogitBytes / (int64_t{mc.n_vocab} * int64_t{sizeof(float)})));
  sched = std::make_unique<Scheduler>(sc, *blocks);
  sessions = std::make_unique<PrefillSessions>(*blocks, *exec, steps, c.max_sessions, c.session_ttl_s);
  sched->set_on_admit([this](Sequence& s) { sessions->resume(s); });
  if (c.swap_bytes > 0) {
    SwapSpace swap;
    swap.bytes = static_cast<size_t>(c.swap_bytes);
    swap.block_bytes = exec->block_bytes();
    swap.save = [this](int32_t block, std::byte* out) { exec->save_block(block, out); };
    swap.load = [this](int32_t block, const std::byte* in) { exec->load_block(block, in); };
    sched->set_swap(std::move(swap));
  }
  if (latency && c.step_factor > 1.0) {
    PacerConfig pc;
    pc.step_factor = c.step_factor;
    pc.max_tokens = sc.max_batch_tokens;
    pc.max_seqs = sc.max_seqs;
    pacer = std::make_unique<PrefillPacer>(pc);
  }
  metrics.set_pool(n_blocks, n_blocks * c.block_size / groups, paging.window, c.prefix_caching);
  kv_events = std::make_unique<KvEventRelay>(*blocks);
  // Blocks are only as good as the numbers that made them: the model, and
  // where and with which kernels it ran; key smoothing is measured from the
  // model over max_positions (model/key_smoothing.h). The KV store and the
  // KV transfer name their blocks by this one layout.
  {
    const std::string where = exec->device() + "/" + kernel_level_name(m.kernel_level());
    const uint64_t id = kv_checksum(std::as_bytes(std::span(where.data(), where.size())), model_fingerprint(m.file()));
    const uint64_t smoothing = kv_fmt.smooth_k ? kv_checksum({}, uint64_t(plan.max_positions)) | 1 : 0;
    block_layout = tandem::kv_block_layout(plan.shape, plan.format, paging, c.block_size, id, smoothing);
  }
  if (!c.kv_store.empty()) {
    if (!c.prefix_caching)
      fail(ErrorKind::kInvalidArgument, "--kv-store needs the prefix cache: its blocks enter and leave through it");
    store = std::make_unique<KvStore>(c.kv_store, c.kv_store_bytes, block_layout, *blocks, *exec);
  }

  check_speculation(c.spec, draft_model != nullptr);
  if (c.spec.mode != SpecMode::kOff) {
    spec = std::make_unique<SpeculativeDecoding>(c.spec, m, draft_model, max_context, c.max_seqs, pool);
    spec->calibrate(m, *blocks, *exec, logits, steps);
  }
}

void Engine::Impl::drain_inbox() {
  std::vector<std::unique_ptr<Sequence>> fresh;
  std::vector<uint64_t> cancel_ids;
  for (auto& task : inbox.take_tasks()) task();
  inbox.take(fresh, cancel_ids);
  for (auto& s : fresh) {
    if (observer) report.arrived.push_back({s->req->id, s->req->arrival_s});
    // Its prefix from the KV store, where the prefix cache ends: admission then finds it cached.
    if (store && !s->wants_prompt_logits())
      store->load(std::span<const int32_t>(s->tokens).first(size_t(s->n_prompt)), s->req->params.cache_salt);
    // Blocks computed by a prefill instance go into the prefix cache before
    // the sequence is scheduled: admission then finds them cached.
    if (const auto& imp = s->req->params.kv_import; imp && imp->run.n_blocks() > 0) {
      importing.push_back({std::move(s), {}, false});
      continue;
    }
    sched->add(std::move(s));
  }
  // Cancelled while their blocks go in: they join the scheduler to end
  // there, and the blocks already in stay in the prefix cache.
  for (auto it = importing.begin(); it != importing.end();) {
    if (std::find(cancel_ids.begin(), cancel_ids.end(), it->seq->req->id) == cancel_ids.end()) {
      ++it;
      continue;
    }
    if (const auto& imp = it->seq->req->params.kv_import; it->started && imp->done) imp->done(it->total);
    sched->add(std::move(it->seq));
    it = importing.erase(it);
  }
  if (!importing.empty()) import_transferred();
  if (cancel_ids.empty()) return;
  std::vector<Sequence*> doomed;
  sched->for_each([&](Sequence& s) {
    if (std::find(cancel_ids.begin(), cancel_ids.end(), s.req->id) != cancel_ids.end()) doomed.push_back(&s);
  });
  for (Sequence* s : doomed) finish(s, "cancelled", "cancelled");
}

void Engine::Impl::import_transferred() {
  // Blocks this step may write: everything when nothing decodes (nobody
  // waits on the step), else what the share of a step's time allows.
  int32_t budget = INT32_MAX;
  if (cfg.kv_import_share < 1 && sched->n_decoding() > 0) {
    const double last_step_s = steps.count() > 0 ? steps.recent(0).end_s - steps.recent(0).start_s : 0;
    if (import_s_per_block <= 0) budget = 4;  // a first measure of the copy
    else budget = std::max(1, static_cast<int32_t>(cfg.kv_import_share * last_step_s / import_s_per_block));
  }
  while (!importing.empty() && budget > 0) {
    Importing& im = importing.front();
    Sequence* raw = im.seq.get();
    const auto& imp = raw->req->params.kv_import;
    bool done = false;
    try {
      const KvImportResult r = import_blocks(*blocks, *exec, imp->run,
                                             std::span<const int32_t>(raw->tokens).first(size_t(raw->n_prompt)),
                                             raw->req->params.cache_salt, budget);
      if (r.loaded > 0) {
        const double per = r.seconds / r.loaded;
        import_s_per_block = import_s_per_block > 0 ? 0.8 * import_s_per_block + 0.2 * per : per;
      }
      if (!im.started) im.total.cached = r.cached;  // later calls count earlier imports as cached
      im.started = true;
      im.total.loaded += r.loaded;
      im.total.seconds += r.seconds;
      im.total.skipped = r.skipped;
      budget -= std::max(1, r.loaded);
      done = !r.skipped.empty() || r.cached + r.loaded >= imp->run.first + imp->run.n_blocks();
      if (done && imp->done) imp->done(im.total);
    } catch (const Error& e) {
      std::unique_ptr<Sequence> seq = std::move(im.seq);
      importing.pop_front();
      sched->add(std::move(seq));
      finish(raw, "error", "error", e.what());
      continue;
    }
    if (!done) break;
    std::unique_ptr<Sequence> seq = std::move(im.seq);
    importing.pop_front();
    sched->add(std::move(seq));
  }
}

void Engine::Impl::emit(Sequence* seq, RequestEvent ev) {
  ev.request_id = seq->req->id;
  ev.choice = seq->choice;
  ev.prompt_tokens = seq->n_prompt;
  ev.completion_tokens = seq->n_generated();
  ev.cached_prompt_tokens = seq->n_cached_prompt;
  if (seq->req->sink) seq->req->sink(ev);
}

void Engine::Impl::finish(Sequence* seq, const std::string& reason, const std::string& cause,
                          const std::string& error) {
  RequestEvent ev;
  if (reason != "cancelled" && reason != "error") final_text(*seq, reason != "stop", ev);
  ev.finished = true;
  ev.finish_reason = reason;
  ev.stop_cause = cause;
  ev.error = error;
  const double now = steps.now();
  if ((reason == "stop" || reason == "length") && seq->choice == 0 && !seq->req->params.session.empty())
    sessions->save(*seq, std::move(finishing_logits));
  if ((reason == "stop" || reason == "length") && seq->choice == 0 && seq->req->params.on_kv_export) {
    // A prefill instance's request: its prompt's blocks, before they go back.
    const int32_t bs = blocks->block_size();
    const int32_t n_full = tandem::kv_transfer_unsupported(*blocks).empty()
                               ? std::min(seq->n_prompt, seq->blocks.n_computed) / bs
                               : 0;
    seq->req->params.on_kv_export(export_blocks(*exec, seq->blocks.table, std::span<const int32_t>(seq->tokens).first(
                                                                              size_t(seq->n_prompt)),
                                                n_full, bs));
  }
  ev.timings = sequence_timings(*seq, now);
  emit(seq, ev);
  if (spec) spec->forget(*seq);
  if (observer && seq->choice == 0) report.finished.push_back({seq->req->id, reason});
  if (seq->fork_pending) {
    // Choice 0 of an n > 1 request ends before its prompt was done (cancelled,
    // failed): the other choices, never forked, end with it.
    end_unforked_choices(*seq, ev);
    seq->req->choices_left -= seq->req->params.n - 1;
  }
  blocks->free(seq->blocks);
  if (--seq->req->choices_left == 0) metrics.request_finished(reason == "cancelled", now - seq->req->arrival_s);
  seq->status = SeqStatus::kFinished;
  --live;
  sched->remove(seq);  // destroys it
}

bool Engine::Impl::accept_token(Sequence* seq, int32_t token, const float* lg) {
  const RequestParams& p = seq->req->params;
  const double now = steps.now();
  metrics.token(seq->first_token_s < 0, now - (seq->first_token_s < 0 ? seq->req->arrival_s : seq->last_token_s));
  if (seq->first_token_s < 0) seq->first_token_s = now;
  seq->last_token_s = now;

  if (p.stop_at_eog && model.tokenizer().is_eog(token)) {
    finish(seq, "stop", "eog");
    return false;
  }
  if (seq->json) seq->json->accept(token);
  RequestEvent ev;
  ev.tokens.push_back(token);
  if (p.logprobs >= 0) add_logprobs(ev, lg, model.config().n_vocab, token, p.logprobs);
  seq->tokens.push_back(token);
  const bool stop_string = push_text(*seq, token, ev);
  emit(seq, std::move(ev));
  if (stop_string || (seq->json && seq->json->complete())) {
    finish(seq, "stop", stop_string ? "stop" : "json");
  } else if (p.max_tokens >= 0 && seq->n_generated() >= p.max_tokens) {
    finish(seq, "length", "length");
  } else if (seq->slot(static_cast<int32_t>(seq->tokens.size())) >= max_context) {
    finish(seq, "length", "context");
  } else {
    return true;
  }
  return false;
}

void Engine::Impl::handle_logits(Sequence* seq, const float* lg, int32_t t) {
  const int32_t nv = model.config().n_vocab;
  if (seq->fork_pending) {
    // n > 1: the prompt ran once; the other choices share its blocks and
    // start from the same logits.
    seq->fork_pending = false;
    live += seq->req->params.n - 1;
    for (int32_t c = 1; c < seq->req->params.n; ++c) {
      auto child = seqs.make(seq->req, c);
      copy_prompt_state(*seq, *child);
      child->blocks = blocks->fork(seq->blocks);
      Sequence* raw = child.get();
      sched->add_running(std::move(child));
      first_token(raw, lg, raw->sampler->sample(std::span<const float>(lg, nv), raw->tokens, raw->json.get()));
    }
  }
  if (seq->n_generated() == 0) first_token(seq, lg, t);
  else accept_token(seq, t, lg);
}

// One step at its named points: intake (requests, cancellations, expired
// sessions, drafts) -> schedule -> forward -> sample -> accept (commit,
// slide the window, tokens out, stops) -> end of step (costs, the timeline).
bool Engine::Impl::step() {
  drain_inbox();
  sessions->expire();
  if (spec) spec->plan(*sched, window->limit());

  const int32_t prefill_budget = pacer ? pacer->budget(sched->n_decoding(), sched->n_prefilling()) : INT32_MAX;
  const std::vector<ScheduledSeq> scheduled = sched->schedule(prefill_budget);
  const bool started = start_ready();  // sessions' whole prompts, from their logits
  update_gauges();
  if (scheduled.empty()) return started;

  batch.build(scheduled, *window, scored);
  const double t0 = forward(scheduled);
  sample(scheduled);
  accept(scheduled);

  sched->for_each([](Sequence& q) { q.draft.clear(); });
  // The draft policy's cost of a step of R rows, each with logits (decodes
  // and drafts): prompt rows skip the output matrix, so a step holding them
  // would make drafts look cheaper than they are. Sampling and verifying
  // the rows count too.
  if (spec && batch.n_prefill_rows == 0) spec->observe_step(static_cast<int32_t>(batch.rows.size()), steps.now() - t0);
  if (observer) {
    ++report.step;
    report.preempted = static_cast<int32_t>(sched->preemptions() - preemptions_seen);
    preemptions_seen = sched->preemptions();
    observer(report);
    report.arrived.clear();
    report.finished.clear();
  }
  return true;
}

double Engine::Impl::forward(std::span<const ScheduledSeq> scheduled) {
  const int32_t nv = model.config().n_vocab;
  const size_t n_out = rows_with_logits(batch.rows) * static_cast<size_t>(nv);
  if (logits.size() < n_out) logits.resize(n_out);
  const double t0 = steps.now();
  exec->forward(batch.rows, batch.seq_kv_ptrs, std::span<float>(logits));
  const double t1 = steps.now();
  for (Sequence* s : batch.prompt_seqs) {
    if (s->first_step_s < 0) s->first_step_s = t0;
    s->prefill_s += t1 - t0;
  }
  const Phase phase = batch.phase();
  const int32_t rows = static_cast<int32_t>(batch.rows.size());
  steps.add({phase, t0, t1, rows, static_cast<int32_t>(scheduled.size())});
  // The pacer counts decoding sequences, as its budget is asked for them:
  // their drafts are part of what a decode step of theirs costs.
  if (pacer) pacer->observe(t1 - t0, batch.n_decode, batch.n_prefill_rows);
  if (observer) {
    report.start_s = t0;
    report.end_s = t1;
    report.phase = phase;
    report.rows = rows;
    report_parts(scheduled, report);
  }
  metrics.step(phase, rows, t1 - t0, batch.n_prompt_rows);
  if (batch.sparse_budget > 0) {
    const Model::SparseCounts sc = model.sparse_counts();
    metrics.sparse_blocks(sc.read, sc.held);
  }
  return t0;
}

void Engine::Impl::sample(std::span<const ScheduledSeq> scheduled) {
  // Every sequence whose logits came out, on all threads: each sampler (its
  // own RNG) reads only its own logits and history, so the tokens do not
  // depend on which thread draws them. A 262k vocabulary makes a greedy
  // pick ~50 us a sequence.
  const int32_t nv = model.config().n_vocab;
  scored.score(logits.data(), nv, pool);
  sampled.resize(0);
  for (size_t i = 0; i < scheduled.size(); ++i)
    if (batch.last_row[i] >= 0)
      sampled.push_back({scheduled[i].seq, logits.data() + batch.last_row[i] * nv, -1, nullptr, {}});
  auto draw = [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      Sampled& x = sampled[i];
      try {
        if (!x.seq->draft.empty()) verify_drafts(*x.seq, x.logits, nv, model.tokenizer(), x.verified);
        else x.token = x.seq->sampler->sample(std::span<const float>(x.logits, nv), x.seq->tokens, x.seq->json.get());
      } catch (...) {
        x.error = std::current_exception();
      }
    }
  };
  pool.parallel_for(static_cast<int64_t>(sampled.size()), 1, draw);  // inline for one sequence
}

void Engine::Impl::accept(std::span<const ScheduledSeq> scheduled) {
  // In batch order on this thread: commit blocks and accept the tokens
  // (events, stops, forks).
  const int32_t nv = model.config().n_vocab;
  size_t si = 0;
  for (size_t i = 0; i < scheduled.size(); ++i) {
    Sequence* s = scheduled[i].seq;
    if (!s->draft.empty() && batch.last_row[i] >= 0) {
      const Sampled& x = sampled[si++];
      if (x.error) std::rethrow_exception(x.error);
      accept_verified(s, x, nv);  // streams before the tokens may finish it
      continue;
    }
    const int32_t published = static_cast<int32_t>(s->blocks.prefix.size());
    blocks->commit(s->blocks, s->tokens, s->blocks.n_computed + scheduled[i].n_tokens);
    if (store) store->save(*s, published);  // before the window slides or a step reuses a page
    window->slide(*s);
    if (batch.last_row[i] < 0) continue;
    const Sampled& x = sampled[si++];
    if (x.error) std::rethrow_exception(x.error);
    handle_logits(s, x.logits, x.token);
  }
}

void Engine::Impl::accept_verified(Sequence* s, const Sampled& x, int32_t nv) {
  const int32_t m = static_cast<int32_t>(x.verified.size());
  const int32_t k = static_cast<int32_t>(s->draft.size());
  const int32_t kept = spec->keep(*s, x.verified, *blocks);
  window->slide(*s);
  metrics.speculation(k, kept, m);
  for (int32_t j = 0; j < m; ++j)
    if (!accept_token(s, x.verified[j], x.logits + int64_t{j} * nv)) return;  // it ended
}

void Engine::Impl::first_token(Sequence* seq, const float* lg, int32_t token) {
  if (seq->req->params.prompt_logprobs >= 0) emit(seq, prompt_logprobs_event(*seq));
  if (seq->req->params.max_tokens == 0) {
    // The prompt alone was asked for (a prefill, echo, scoring).
    if (seq->choice == 0 && !seq->req->params.session.empty())
      finishing_logits = std::make_shared<const std::vector<float>>(lg, lg + model.config().n_vocab);
    finish(seq, "length", "length");
    finishing_logits.reset();
    return;
  }
  accept_token(seq, token, lg);
}

bool Engine::Impl::start_ready() {
  const std::vector<Sequence*> todo = sessions->take_ready();
  if (todo.empty()) return false;
  const int32_t nv = model.config().n_vocab;
  const double now = steps.now();
  for (Sequence* s : todo) {
    // Preempted since its admission (a later prompt took its blocks): it
    // recomputes its prompt like any other.
    std::shared_ptr<const std::vector<float>> lg = std::move(s->start_logits);
    if (s->status != SeqStatus::kRunning || s->n_uncomputed() != 0 || !lg) continue;
    if (s->first_step_s < 0) s->first_step_s = now;
    const int32_t t = s->sampler->sample(std::span<const float>(lg->data(), nv), s->tokens, s->json.get());
    handle_logits(s, lg->data(), t);
  }
  return true;
}

void Engine::Impl::update_gauges() { metrics.gauges(*blocks, *sched, static_cast<int64_t>(sessions->size())); }

void Engine::Impl::fail_all(const std::string& error) {
  std::vector<Sequence*> all;
  sched->for_each([&](Sequence& s) { all.push_back(&s); });
  for (Sequence* s : all) finish(s, "error", "error", error);
}

Engine::Engine(Model& model, const EngineConfig& cfg, Model* draft)
    : model_(model), cfg_(cfg), impl_(std::make_unique<Impl>(model, cfg, draft)) {}

Engine::~Engine() { stop(); }

void Engine::start() {
  if (impl_->loop.joinable()) return;
  impl_->stopping = false;
  impl_->loop = std::thread([this] {
    Impl& I = *impl_;
    while (!I.stopping.load()) {
      bool busy = false;
      try {
        busy = I.step();
      } catch (const std::exception& e) {
        // A failed step must not take the server down: the requests in
        // flight end with an error and the engine carries on.
        I.fail_all(e.what());
      }
      I.after_step();
      if (!busy)
        I.inbox.wait(std::chrono::milliseconds(50),
                     [&] { return I.stopping.load() || I.kv_events->reset_requested(); });
    }
  });
}

void Engine::stop() {
  if (!impl_ || !impl_->loop.joinable()) return;
  impl_->stopping = true;
  impl_->inbox.notify();
  impl_->loop.join();
}

uint64_t Engine::submit(std::vector<int32_t> prompt, const RequestParams& params, EventSink sink) {
  Impl& I = *impl_;
  check_request(prompt, params, model_.config().n_vocab, I.max_context, I.cfg.kv_cache.window > 0);
  if (params.sparse_attention > 0) {
    if (I.batch.sparse_budget == 0)
      fail(ErrorKind::kInvalidArgument,
           "sparse_attention: sparse attention is off on this server (start it with --sparse-attention BUDGET)");
    SparseAttention sa = model_.options().sparse_attention;
    sa.budget = params.sparse_attention;
    try {
      check_sparse_attention(sa, I.cfg.block_size);
    } catch (const Error& e) {
      fail(ErrorKind::kInvalidArgument, "sparse_attention: {}", e.what());
    }
  }

  auto req = std::make_shared<RequestState>();
  req->params = params;
  req->sink = std::move(sink);
  req->n_prompt = static_cast<int32_t>(prompt.size());
  req->arrival_s = I.steps.now();
  req->choices_left = params.n;
  I.inbox.push([&] {
    // Only sequences that cannot start count as waiting: those beyond the
    // max_seqs that run at once.
    const int64_t would_wait = std::max<int64_t>(0, I.live + 1 - cfg_.max_seqs);
    if (would_wait > cfg_.max_waiting) {
      I.metrics.request_rejected();
      fail(ErrorKind::kResource, "the server is overloaded: {} requests are already waiting", would_wait - 1);
    }
    ++I.live;
    req->id = I.next_request_id++;
    auto s = I.seqs.make(req, 0);
    s->id = I.next_seq_id++;
    s->arrival_order = I.next_arrival++;
    s->tokens = std::move(prompt);
    s->n_prompt = req->n_prompt;
    start_prompt_scoring(*s);
    s->fork_pending = params.n > 1;
    return s;
  });
  return req->id;
}

void Engine::cancel(uint64_t request_id) {
  // A request still in the inbox is finished through the same path on the next step.
  impl_->inbox.cancel(request_id);
}

MetricsSnapshot Engine::metrics() const {
  MetricsSnapshot m = impl_->metrics.snapshot();
  if (impl_->store) {
    m.kv_store = true;
    m.store = impl_->store->stats();
  }
  return m;
}

void Engine::flush_kv_store() {
  if (impl_->store) impl_->store->flush();
}

bool Engine::step() {
  const bool busy = impl_->step();
  impl_->after_step();
  return busy;
}

Completion Engine::run_one(std::vector<int32_t> prompt, const RequestParams& params,
                           const std::function<bool(std::string_view)>& on_text) {
  if (impl_->loop.joinable()) fail(ErrorKind::kInvalidArgument, "run_one: the engine's loop thread is running");
  if (params.n != 1) fail(ErrorKind::kInvalidArgument, "run_one: one choice only (n = {})", params.n);
  Completion out;
  bool done = false, stop = false;
  const uint64_t id = submit(std::move(prompt), params, [&](const RequestEvent& ev) {
    out.tokens.insert(out.tokens.end(), ev.tokens.begin(), ev.tokens.end());
    out.text += ev.text;
    if (!ev.text.empty() && on_text && !stop && !on_text(ev.text)) stop = true;
    if (!ev.finished) return;
    done = true;
    out.finish_reason = ev.finish_reason;
    out.stop_cause = ev.stop_cause;
    out.error = ev.error;
    out.timings = ev.timings;
  });
  while (!done) {
    if (stop) cancel(id);
    try {
      if (!impl_->step() && !done) fail(ErrorKind::kResource, "run_one: the engine went idle before the request ended");
    } catch (const std::exception& e) {
      impl_->fail_all(e.what());
      throw;
    }
  }
  return out;
}

const Intake& Engine::intake() const { return *impl_->intake; }

void Engine::set_step_observer(std::function<void(const StepReport&)> fn) { impl_->observer = std::move(fn); }

void Engine::set_kv_event_sink(std::function<void(std::vector<KvCacheEvent>)> fn, std::string_view hash_seed) {
  impl_->kv_events->set_sink(std::move(fn), hash_seed);
}

int32_t Engine::cached_blocks(const std::vector<int32_t>& prompt, const std::string& salt, double timeout_s) {
  struct Answer {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    int32_t n = 0;
  };
  auto a = std::make_shared<Answer>();
  impl_->inbox.post([this, a, prompt, salt] {
    const int32_t n = impl_->blocks->cached_blocks(prompt, salt);
    std::lock_guard<std::mutex> lock(a->mu);
    a->n = n;
    a->done = true;
    a->cv.notify_all();
  });
  std::unique_lock<std::mutex> lock(a->mu);
  a->cv.wait_for(lock, std::chrono::duration<double>(timeout_s), [&] { return a->done; });
  return a->done ? a->n : 0;
}

KvBlockLayout Engine::kv_block_layout() const { return impl_->block_layout; }

std::string Engine::kv_transfer_unsupported() const { return tandem::kv_transfer_unsupported(*impl_->blocks); }

void Engine::reset_prefix_cache() {
  impl_->kv_events->request_reset();
  impl_->inbox.notify();
}

void Engine::check_invariants() {
  std::vector<BlockManager::LiveSeq> live;
  impl_->sched->for_each([&](Sequence& s) {
    if (s.status == SeqStatus::kRunning) live.push_back({&s.blocks, s.tokens});
  });
  impl_->sessions->add_live(live);
  impl_->blocks->check_invariants(live);
}

int Engine::threads() const { return static_cast<int>(impl_->pool.size()); }

size_t Engine::kv_bytes() const { return impl_->exec->kv_bytes(); }

size_t Engine::kv_block_bytes() const { return impl_->exec->block_bytes(); }

std::string Engine::device() const { return impl_->exec->device(); }

ThreadPool& Engine::compute_pool() { return impl_->pool; }

}  // namespace tandem

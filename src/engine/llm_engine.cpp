#include "engine/llm_engine.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <deque>
#include <exception>
#include <limits>
#include <mutex>
#include <optional>

#include "core/error.h"
#include "core/memory_info.h"
#include "core/thread_pool.h"
#include "engine/logprobs.h"
#include "engine/prefill_pacer.h"
#include "engine/scheduler.h"
#include "engine/step_log.h"
#include "kv/block_manager.h"
#include "kv/kv_cache.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

namespace tandem {
namespace {

constexpr int32_t kMaxChoices = 16;
constexpr int64_t kDefaultKvCapBytes = int64_t{2} << 30;
constexpr int64_t kPromptLogitBytes = int64_t{64} << 20;

}  // namespace

struct Engine::Impl {
  Impl(Model& m, const EngineConfig& c);

  Model& model;
  const EngineConfig cfg;
  int32_t max_context = 0;
  ThreadPool pool;
  std::unique_ptr<KvCache> kv;
  std::unique_ptr<BlockManager> blocks;
  std::unique_ptr<Scheduler> sched;
  std::unique_ptr<PrefillPacer> pacer;  // latency policy only
  StepLog steps;

  // Inbox: filled by submit()/cancel() on any thread, drained by step().
  std::mutex inbox_mu;
  std::condition_variable inbox_cv;
  std::vector<std::unique_ptr<Sequence>> inbox;
  std::vector<uint64_t> cancels;
  uint64_t next_request_id = 1;
  uint64_t next_seq_id = 1;
  uint64_t next_arrival = 1;

  mutable std::mutex metrics_mu;
  MetricsSnapshot metrics;

  std::thread loop;
  std::atomic<bool> stopping{false};

  // Step scratch.
  Batch batch;
  std::vector<SeqKv> seq_kv;
  std::vector<SeqKv*> seq_kv_ptrs;
  Logits logits;  // sized for the largest step so far, reused
  struct Sampled {
    Sequence* seq;
    const float* logits;
    int32_t token = -1;
    std::exception_ptr error;
  };
  std::vector<Sampled> sampled;
  struct Scored {  // a prompt position whose logprob this step's logits give
    Sequence* seq;
    int32_t pos;       // the prompt token scored
    int64_t logit_row;
  };
  std::vector<Scored> scored;
  std::vector<int64_t> last_row;  // per scheduled sequence: logits row of its last token, or -1

  bool step();
  void score_prompts();  // prompt logprobs from this step's logits, for `scored`
  void emit_prompt(Sequence* seq);
  // The first token of a choice (after its prompt's logprobs, when asked).
  void first_token(Sequence* seq, const float* logits, int32_t token);
  void drain_inbox();
  // Accepts `token`, sampled from `logits` (and forks the other choices of an n > 1 request).
  void handle_logits(Sequence* seq, const float* logits, int32_t token);
  void accept_token(Sequence* seq, int32_t token, const float* logits);
  void finish(Sequence* seq, const std::string& reason, const std::string& error = "");
  void emit(Sequence* seq, RequestEvent ev);
  void fail_all(const std::string& error);
  std::unique_ptr<Sequence> make_seq(const std::shared_ptr<RequestState>& req, int32_t choice);
  // Every token's text, made at the first constrained request (any thread).
  std::shared_ptr<const std::vector<std::string>> token_pieces();
  std::once_flag pieces_once;
  std::shared_ptr<const std::vector<std::string>> pieces;
  void update_gauges();
};

Engine::Impl::Impl(Model& m, const EngineConfig& c) : model(m), cfg(c), pool(c.threads) {
  const ModelConfig& mc = m.config();
  max_context = c.max_context > 0 ? c.max_context : std::min(mc.n_ctx_train, 4096);
  if (max_context > mc.n_ctx_train)
    fail(ErrorKind::kInvalidArgument, "context size {} exceeds the model's training context {}", max_context,
         mc.n_ctx_train);
  if (c.block_size <= 0 || c.max_seqs <= 0 || c.max_waiting < 0)
    fail(ErrorKind::kInvalidArgument, "block size, max sequences must be positive and max waiting >= 0");
  const KvShape shape = m.kv_shape();
  const int64_t per_token = static_cast<int64_t>(KvCache::bytes_per_token(shape, c.kv_type));
  if (c.swap_bytes < 0) fail(ErrorKind::kInvalidArgument, "swap space must be >= 0 bytes, got {}", c.swap_bytes);
  // The pool and the swap space are committed as they fill, so the kernel
  // accepts sizes beyond the machine's memory and the OOM killer settles it
  // later: a size asked for must fit what is available now, and the default
  // takes at most half of it.
  const std::optional<uint64_t> avail = available_memory_bytes(c.memory_available);
  int64_t tokens = c.kv_tokens;
  if (tokens <= 0 && c.kv_bytes > 0) tokens = c.kv_bytes / per_token;
  const bool sized_by_default = tokens <= 0;
  if (sized_by_default) {
    tokens = std::min<int64_t>(int64_t{c.max_seqs} * max_context, kDefaultKvCapBytes / per_token);
    if (avail) tokens = std::min<int64_t>(tokens, static_cast<int64_t>(*avail / 2) / per_token);
  }
  const int64_t n_blocks = tokens / c.block_size;
  if (n_blocks < (max_context + c.block_size - 1) / c.block_size)
    fail(sized_by_default ? ErrorKind::kResource : ErrorKind::kInvalidArgument,
         "the KV pool ({} tokens{}) cannot hold one full context of {} tokens", tokens,
         sized_by_default ? ", half the memory available" : "", max_context);
  if (n_blocks > INT32_MAX) fail(ErrorKind::kInvalidArgument, "KV pool of {} blocks is too large", n_blocks);
  const uint64_t pool_bytes = static_cast<uint64_t>(n_blocks) * c.block_size * per_token;
  if (avail && pool_bytes + static_cast<uint64_t>(c.swap_bytes) > *avail)
    fail(ErrorKind::kResource,
         "the KV pool ({} MiB) and swap space ({} MiB) need more than the {} MiB of memory available; ask for less",
         pool_bytes >> 20, c.swap_bytes >> 20, *avail >> 20);
  kv = std::make_unique<KvCache>(shape, static_cast<int32_t>(n_blocks), c.block_size, c.kv_type);
  blocks = std::make_unique<BlockManager>(static_cast<int32_t>(n_blocks), c.block_size, c.prefix_caching);
  blocks->set_copy_block([this](int32_t src, int32_t dst) { kv->copy_block(src, dst); });  // copy-on-write
  SchedulerConfig sc;
  const bool latency = c.policy == SchedulePolicy::kLatency;
  sc.max_batch_tokens = c.max_batch_tokens > 0 ? c.max_batch_tokens : (latency ? 256 : 1024);
  sc.prefill_chunk = latency ? std::min(sc.max_batch_tokens, 128) : sc.max_batch_tokens;
  sc.shortest_prompt_first = latency;
  sc.max_seqs = c.max_seqs;
  sc.max_context = max_context;
  // Scoring a prompt keeps a row of logits per position: at most 64 MiB of
  // them a step (64 rows of Gemma 3's 262k vocabulary, 512 of a 32k one).
  sc.max_prompt_logit_rows = static_cast<int32_t>(
      std::max<int64_t>(16, kPromptLogitBytes / (int64_t{mc.n_vocab} * int64_t{sizeof(float)})));
  sched = std::make_unique<Scheduler>(sc, *blocks);
  if (c.swap_bytes > 0) {
    SwapSpace swap;
    swap.bytes = static_cast<size_t>(c.swap_bytes);
    swap.block_bytes = kv->block_bytes();
    swap.save = [this](int32_t block, std::byte* out) { kv->save_block(block, out); };
    swap.load = [this](int32_t block, const std::byte* in) { kv->load_block(block, in); };
    sched->set_swap(std::move(swap));
  }
  if (latency && c.step_factor > 1.0) {
    PacerConfig pc;
    pc.step_factor = c.step_factor;
    pc.max_tokens = sc.max_batch_tokens;
    pc.max_seqs = sc.max_seqs;
    pacer = std::make_unique<PrefillPacer>(pc);
  }
  metrics.kv_blocks_total = n_blocks;
}

std::unique_ptr<Sequence> Engine::Impl::make_seq(const std::shared_ptr<RequestState>& req, int32_t choice) {
  auto s = std::make_unique<Sequence>();
  s->req = req;
  s->choice = choice;
  SamplingParams sp = req->params.sampling;
  if (sp.seed != 0xFFFFFFFF) sp.seed += static_cast<uint64_t>(choice);  // distinct, reproducible choices
  s->sampler = std::make_unique<Sampler>(sp);
  s->decoder = std::make_unique<StreamDecoder>(model.tokenizer());
  if (req->params.json_object || req->params.json_schema)
    s->json = std::make_unique<JsonConstraint>(token_pieces(), model.tokenizer(), req->params.json_schema);
  return s;
}

std::shared_ptr<const std::vector<std::string>> Engine::Impl::token_pieces() {
  std::call_once(pieces_once, [this] { pieces = tandem::token_pieces(model.tokenizer()); });
  return pieces;
}

void Engine::Impl::drain_inbox() {
  std::vector<std::unique_ptr<Sequence>> fresh;
  std::vector<uint64_t> cancel_ids;
  {
    std::lock_guard<std::mutex> lock(inbox_mu);
    fresh.swap(inbox);
    cancel_ids.swap(cancels);
  }
  for (auto& s : fresh) sched->add(std::move(s));
  if (cancel_ids.empty()) return;
  std::vector<Sequence*> doomed;
  sched->for_each([&](Sequence& s) {
    if (std::find(cancel_ids.begin(), cancel_ids.end(), s.req->id) != cancel_ids.end()) doomed.push_back(&s);
  });
  for (Sequence* s : doomed) finish(s, "cancelled");
}

void Engine::Impl::emit(Sequence* seq, RequestEvent ev) {
  ev.request_id = seq->req->id;
  ev.choice = seq->choice;
  ev.prompt_tokens = seq->n_prompt;
  ev.completion_tokens = seq->n_generated();
  ev.cached_prompt_tokens = seq->n_cached_prompt;
  if (seq->req->sink) seq->req->sink(ev);
}

void Engine::Impl::finish(Sequence* seq, const std::string& reason, const std::string& error) {
  RequestEvent ev;
  if (reason != "cancelled" && reason != "error") {
    // Whatever the stop-string check held back is now final.
    if (reason != "stop") seq->text += seq->decoder->flush();
    StopMatch m = find_stop(seq->text, seq->req->params.stop);
    const size_t end = m.pos != std::string::npos ? m.pos : seq->text.size();
    if (end > seq->emitted) ev.text = seq->text.substr(seq->emitted, end - seq->emitted);
    seq->emitted = std::max(seq->emitted, end);
  }
  ev.finished = true;
  ev.finish_reason = reason;
  ev.error = error;
  emit(seq, std::move(ev));
  blocks->free(seq->blocks);
  const double now = steps.now();
  {
    std::lock_guard<std::mutex> lock(metrics_mu);
    if (reason == "cancelled") ++metrics.requests_cancelled;
    if (--seq->req->choices_left == 0) {
      ++metrics.requests_finished;
      metrics.e2e.observe(now - seq->req->arrival_s);
    }
  }
  seq->status = SeqStatus::kFinished;
  sched->remove(seq);  // destroys it
}

void Engine::Impl::accept_token(Sequence* seq, int32_t token, const float* lg) {
  const RequestParams& p = seq->req->params;
  const double now = steps.now();
  {
    std::lock_guard<std::mutex> lock(metrics_mu);
    if (seq->first_token_s < 0) metrics.ttft.observe(now - seq->req->arrival_s);
    else metrics.itl.observe(now - seq->last_token_s);
    ++metrics.generation_tokens;
  }
  if (seq->first_token_s < 0) seq->first_token_s = now;
  seq->last_token_s = now;

  if (p.stop_at_eog && model.tokenizer().is_eog(token)) {
    finish(seq, "stop");
    return;
  }
  if (seq->json) seq->json->accept(token);
  RequestEvent ev;
  ev.tokens.push_back(token);
  if (p.logprobs >= 0) {
    std::vector<TokenLogprob> top;
    ev.logprobs.push_back(token_logprob(std::span<const float>(lg, model.config().n_vocab), token, p.logprobs, &top));
    ev.top_logprobs.push_back(std::move(top));
  }
  seq->tokens.push_back(token);
  seq->text += seq->decoder->push(token);
  StopMatch m = find_stop(seq->text, p.stop);
  const size_t upto = m.pos != std::string::npos ? m.pos : m.safe_len;
  if (upto > seq->emitted) {
    ev.text = seq->text.substr(seq->emitted, upto - seq->emitted);
    seq->emitted = upto;
  }
  emit(seq, std::move(ev));
  if (m.pos != std::string::npos || (seq->json && seq->json->complete())) {
    finish(seq, "stop");
  } else if ((p.max_tokens >= 0 && seq->n_generated() >= p.max_tokens) ||
             static_cast<int32_t>(seq->tokens.size()) >= max_context) {
    finish(seq, "length");
  }
}

void Engine::Impl::handle_logits(Sequence* seq, const float* lg, int32_t t) {
  const int32_t nv = model.config().n_vocab;
  if (seq->fork_pending) {
    // n > 1: the prompt ran once; the other choices share its blocks and
    // start from the same logits.
    seq->fork_pending = false;
    for (int32_t c = 1; c < seq->req->params.n; ++c) {
      auto child = make_seq(seq->req, c);
      child->arrival_order = seq->arrival_order;
      child->tokens = seq->tokens;
      child->n_prompt = seq->n_prompt;
      child->n_cached_prompt = seq->n_cached_prompt;
      child->prompt_lp = seq->prompt_lp;
      child->prompt_top = seq->prompt_top;
      child->blocks = blocks->fork(seq->blocks);
      Sequence* raw = child.get();
      sched->add_running(std::move(child));
      first_token(raw, lg, raw->sampler->sample(std::span<const float>(lg, nv), raw->tokens, raw->json.get()));
    }
  }
  if (seq->n_generated() == 0) first_token(seq, lg, t);
  else accept_token(seq, t, lg);
}

bool Engine::Impl::step() {
  drain_inbox();
  const int32_t prefill_budget = pacer ? pacer->budget(sched->n_decoding(), sched->n_prefilling()) : INT32_MAX;
  std::vector<ScheduledSeq> sched_batch = sched->schedule(prefill_budget);
  update_gauges();
  if (sched_batch.empty()) return false;

  // Rows of every scheduled sequence, in order; a row wants logits when it is
  // the sequence's last uncomputed token, or when it predicts a prompt token
  // whose logprob is asked for (the logits of row p score token p + 1).
  batch.clear();
  seq_kv.resize(sched_batch.size());
  seq_kv_ptrs.resize(sched_batch.size());
  scored.clear();
  last_row.assign(sched_batch.size(), -1);
  int32_t n_decode = 0, n_prefill_rows = 0, n_prompt_rows = 0, n_logit_rows = 0;
  for (size_t i = 0; i < sched_batch.size(); ++i) {
    Sequence* s = sched_batch[i].seq;
    const int32_t n = sched_batch[i].n_tokens, start = s->n_computed();
    const int32_t n_tok = static_cast<int32_t>(s->tokens.size());
    const int32_t score_from = s->wants_prompt_logits() ? static_cast<int32_t>(s->prompt_lp.size()) : s->n_prompt;
    seq_kv[i].blocks = s->blocks.table;
    seq_kv[i].n_tokens = start;
    seq_kv_ptrs[i] = &seq_kv[i];
    for (int32_t j = 0; j < n; ++j) {
      const int32_t pos = start + j;
      const bool score = pos + 1 >= score_from && pos + 1 < s->n_prompt;
      if (score) scored.push_back({s, pos + 1, n_logit_rows});
      const bool last = pos + 1 == n_tok;
      if (last) last_row[i] = n_logit_rows;
      batch.push_back({s->tokens[pos], pos, static_cast<int32_t>(i), score || last});
      n_logit_rows += score || last;
      if (pos < s->n_prompt) ++n_prompt_rows;
    }
    if (n == 1 && start + 1 == n_tok && start >= s->n_prompt) ++n_decode;
    else n_prefill_rows += n;
  }

  const int32_t nv = model.config().n_vocab;
  const size_t n_out = rows_with_logits(batch) * static_cast<size_t>(nv);
  if (logits.size() < n_out) logits.resize(n_out);
  const double t0 = steps.now();
  model.forward(batch, seq_kv_ptrs, *kv, pool, std::span<float>(logits));
  const double t1 = steps.now();
  const Phase phase = n_prefill_rows == 0 ? Phase::kDecode : (n_decode == 0 ? Phase::kPrefill : Phase::kMixed);
  steps.add({phase, t0, t1, static_cast<int32_t>(batch.size()), static_cast<int32_t>(sched_batch.size())});
  if (pacer) pacer->observe(t1 - t0, n_decode, n_prefill_rows);
  {
    std::lock_guard<std::mutex> lock(metrics_mu);
    metrics.prompt_tokens += n_prompt_rows;
    MetricsSnapshot::PhaseTotals& pt = metrics.phases[static_cast<size_t>(phase)];
    ++pt.steps;
    pt.rows += batch.size();
    pt.seconds += t1 - t0;
  }

  // Sample every sequence whose logits came out, on all threads: each
  // sampler (its own RNG) reads only its own logits and history, so the
  // tokens do not depend on which thread draws them. Then, in batch order on
  // this thread, commit blocks and accept the tokens (events, stops, forks).
  // A 262k vocabulary makes a greedy pick ~50 us a sequence.
  score_prompts();
  sampled.clear();
  for (size_t i = 0; i < sched_batch.size(); ++i)
    if (last_row[i] >= 0) sampled.push_back({sched_batch[i].seq, logits.data() + last_row[i] * nv, -1, nullptr});
  auto sample = [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      Sampled& x = sampled[i];
      try {
        x.token = x.seq->sampler->sample(std::span<const float>(x.logits, nv), x.seq->tokens, x.seq->json.get());
      } catch (...) {
        x.error = std::current_exception();
      }
    }
  };
  pool.parallel_for(static_cast<int64_t>(sampled.size()), 1, sample);  // inline for one sequence
  size_t si = 0;
  for (size_t i = 0; i < sched_batch.size(); ++i) {
    Sequence* s = sched_batch[i].seq;
    blocks->commit(s->blocks, s->tokens, s->n_computed() + sched_batch[i].n_tokens);
    if (last_row[i] < 0) continue;
    const Sampled& x = sampled[si++];
    if (x.error) std::rethrow_exception(x.error);
    handle_logits(s, x.logits, x.token);
  }
  return true;
}

void Engine::Impl::score_prompts() {
  if (scored.empty()) return;
  // Positions of one sequence come in order and continue its prompt_lp.
  for (const Scored& x : scored) {
    x.seq->prompt_lp.resize(x.pos + 1);
    x.seq->prompt_top.resize(x.pos + 1);
  }
  const int32_t nv = model.config().n_vocab;
  pool.parallel_for(static_cast<int64_t>(scored.size()), 1, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const Scored& x = scored[i];
      Sequence& s = *x.seq;
      s.prompt_lp[x.pos] = token_logprob(std::span<const float>(logits.data() + x.logit_row * nv, nv), s.tokens[x.pos],
                                         s.req->params.prompt_logprobs, &s.prompt_top[x.pos]);
    }
  });
}

void Engine::Impl::emit_prompt(Sequence* seq) {
  RequestEvent ev;
  ev.prompt_logprobs = seq->prompt_lp;
  ev.prompt_top_logprobs = seq->prompt_top;
  emit(seq, std::move(ev));
}

void Engine::Impl::first_token(Sequence* seq, const float* lg, int32_t token) {
  if (seq->req->params.prompt_logprobs >= 0) emit_prompt(seq);
  if (seq->req->params.max_tokens == 0) {
    finish(seq, "length");  // the prompt alone was asked for (echo)
    return;
  }
  accept_token(seq, token, lg);
}

void Engine::Impl::update_gauges() {
  const BlockStats bs = blocks->stats();
  std::lock_guard<std::mutex> lock(metrics_mu);
  metrics.running = static_cast<int64_t>(sched->n_running());
  metrics.waiting = static_cast<int64_t>(sched->n_waiting());
  metrics.swapped = static_cast<int64_t>(sched->n_swapped());
  metrics.swap_outs = sched->swap_outs();
  metrics.kv_blocks_used = bs.used;
  metrics.kv_blocks_free = bs.free;
  metrics.kv_blocks_cached = bs.cached_free;
  metrics.prefix_cache_queried_tokens = bs.queried_tokens;
  metrics.prefix_cache_hit_tokens = bs.hit_tokens;
  metrics.preemptions = sched->preemptions();
}

void Engine::Impl::fail_all(const std::string& error) {
  std::vector<Sequence*> all;
  sched->for_each([&](Sequence& s) { all.push_back(&s); });
  for (Sequence* s : all) finish(s, "error", error);
}

Engine::Engine(Model& model, const EngineConfig& cfg)
    : model_(model), cfg_(cfg), impl_(std::make_unique<Impl>(model, cfg)) {}

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
      if (!busy) {
        std::unique_lock<std::mutex> lock(I.inbox_mu);
        I.inbox_cv.wait_for(lock, std::chrono::milliseconds(50),
                            [&] { return I.stopping.load() || !I.inbox.empty() || !I.cancels.empty(); });
      }
    }
  });
}

void Engine::stop() {
  if (!impl_ || !impl_->loop.joinable()) return;
  impl_->stopping = true;
  impl_->inbox_cv.notify_all();
  impl_->loop.join();
}

uint64_t Engine::submit(std::vector<int32_t> prompt, const RequestParams& params, EventSink sink) {
  Impl& I = *impl_;
  const int32_t nv = model_.config().n_vocab;
  if (prompt.empty()) fail(ErrorKind::kInvalidArgument, "the prompt is empty");
  for (int32_t t : prompt)
    if (t < 0 || t >= nv) fail(ErrorKind::kInvalidArgument, "prompt token id {} is outside the vocabulary (0..{})", t, nv - 1);
  if (static_cast<int64_t>(prompt.size()) >= I.max_context)
    fail(ErrorKind::kInvalidArgument,
         "the prompt has {} tokens, which leaves no room in the context of {} tokens", prompt.size(), I.max_context);
  if (params.n < 1 || params.n > kMaxChoices)
    fail(ErrorKind::kInvalidArgument, "n = {} is outside [1, {}]", params.n, kMaxChoices);
  if (params.logprobs > 20) fail(ErrorKind::kInvalidArgument, "logprobs = {} is more than 20", params.logprobs);
  if (params.prompt_logprobs > 20)
    fail(ErrorKind::kInvalidArgument, "prompt_logprobs = {} is more than 20", params.prompt_logprobs);
  for (const auto& [id, bias] : params.sampling.logit_bias)
    if (id < 0 || id >= nv)
      fail(ErrorKind::kInvalidArgument, "logit_bias token id {} is outside the vocabulary (0..{})", id, nv - 1);
  Sampler check(params.sampling);  // throws on absurd sampling parameters

  auto req = std::make_shared<RequestState>();
  req->params = params;
  req->sink = std::move(sink);
  req->n_prompt = static_cast<int32_t>(prompt.size());
  req->arrival_s = I.steps.now();
  req->choices_left = params.n;
  std::lock_guard<std::mutex> lock(I.inbox_mu);
  const int64_t queued = static_cast<int64_t>(I.inbox.size()) + [&] {
    std::lock_guard<std::mutex> ml(I.metrics_mu);
    return I.metrics.waiting;
  }();
  if (queued >= cfg_.max_waiting) {
    std::lock_guard<std::mutex> ml(I.metrics_mu);
    ++I.metrics.requests_rejected;
    fail(ErrorKind::kResource, "the server is overloaded: {} requests are already waiting", queued);
  }
  req->id = I.next_request_id++;
  auto s = I.make_seq(req, 0);
  s->id = I.next_seq_id++;
  s->arrival_order = I.next_arrival++;
  s->tokens = std::move(prompt);
  s->n_prompt = req->n_prompt;
  if (params.prompt_logprobs >= 0) {  // nothing comes before the first token to score it
    s->prompt_lp.push_back({s->tokens[0], std::numeric_limits<float>::quiet_NaN()});
    s->prompt_top.emplace_back();
  }
  s->fork_pending = params.n > 1;
  I.inbox.push_back(std::move(s));
  I.inbox_cv.notify_all();
  return req->id;
}

void Engine::cancel(uint64_t request_id) {
  std::lock_guard<std::mutex> lock(impl_->inbox_mu);
  // A request still in the inbox is finished through the same path on the next step.
  impl_->cancels.push_back(request_id);
  impl_->inbox_cv.notify_all();
}

MetricsSnapshot Engine::metrics() const {
  std::lock_guard<std::mutex> lock(impl_->metrics_mu);
  return impl_->metrics;
}

bool Engine::step() { return impl_->step(); }

}  // namespace tandem

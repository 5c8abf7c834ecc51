#include "engine/speculative_decoding.h"

#include <algorithm>

#include "core/error.h"
#include "engine/draft_model.h"
#include "engine/scheduler.h"
#include "engine/sequence.h"
#include "engine/step_log.h"
#include "kv/block_manager.h"
#include "kv/kv_cache.h"
#include "model/executor.h"
#include "tokenizer/tokenizer.h"

namespace tandem {

void check_speculation(const SpecConfig& cfg, bool has_draft_model) {
  if (cfg.max_draft < 1 || cfg.ngram_min < 1 || cfg.ngram_max < cfg.ngram_min)
    fail(ErrorKind::kInvalidArgument, "speculation: --draft-max must be >= 1 and the n-gram sizes 1 <= min <= max");
  if (cfg.mode == SpecMode::kDraft && !has_draft_model)
    fail(ErrorKind::kInvalidArgument, "speculation with a draft model needs --draft-model FILE");
  if (cfg.mode != SpecMode::kDraft && has_draft_model)
    fail(ErrorKind::kInvalidArgument, "--draft-model is given but speculation is '{}' (use --spec draft)",
         spec_mode_name(cfg.mode));
}

SpeculativeDecoding::SpeculativeDecoding(const SpecConfig& cfg, const Model& target, Model* draft,
                                         int32_t max_context, int32_t max_seqs, ThreadPool& pool)
    : cfg_(cfg), max_context_(max_context), max_seqs_(max_seqs), policy_(cfg) {
  if (cfg.mode == SpecMode::kNgram) drafter_ = std::make_unique<NgramDrafter>(cfg);
  else drafter_ = make_draft_model_drafter(target, *draft, cfg, max_context, max_seqs, pool);
}

void SpeculativeDecoding::calibrate(const Model& model, BlockManager& blocks, Executor& exec, Logits& logits,
                                    const StepLog& clock) {
  // Up to the most rows a step of drafts can take (64 at most; beyond, the
  // curve is extended and real steps fill it in).
  const int32_t top = std::min({64, max_context_, max_seqs_ * (1 + cfg_.max_draft)});
  std::vector<int32_t> sizes;
  for (int32_t r = 1; r <= top; r *= 2) sizes.push_back(r);
  SeqBlocks sb;
  const std::vector<int32_t> ids(static_cast<size_t>(top), model.tokenizer().bos_id() >= 0 ? model.tokenizer().bos_id() : 0);
  if (!blocks.can_allocate(ids, false)) return;  // a pool this small learns from its steps alone
  blocks.allocate(sb, ids, false);
  if (!blocks.can_append(sb, top)) {  // windowed groups' pages
    blocks.free(sb);
    return;
  }
  blocks.append(sb, top);
  SeqKv sk;
  sk.blocks = sb.table;
  for (const auto& w : sb.windowed) sk.windowed.push_back(w.table);
  SeqKv* one[] = {&sk};
  Batch b;
  for (int32_t rows : sizes) {
    b.clear();
    for (int32_t p = 0; p < rows; ++p) b.push_back({ids[p], p, 0, true});
    if (logits.size() < static_cast<size_t>(rows) * model.config().n_vocab)
      logits.resize(static_cast<size_t>(rows) * model.config().n_vocab);
    double best = 0;
    for (int rep = 0; rep < 2; ++rep) {  // the first also faults in what it touches
      sk.n_tokens = 0;
      const double t0 = clock.now();
      exec.forward(b, one, std::span<float>(logits));
      const double t = clock.now() - t0;
      if (rep > 0 && (best == 0 || t < best)) best = t;
    }
    policy_.target_cost().observe(rows, best);
  }
  blocks.free(sb);
}

void SpeculativeDecoding::plan(Scheduler& sched, int32_t stream_limit) {
  std::vector<Sequence*> cand;
  std::vector<double> acceptance;
  std::vector<int32_t> avail;
  sched.for_each([&](Sequence& s) {
    s.draft.clear();
    const RequestParams& p = s.req->params;
    // Decoding now, unconstrained (a JSON constraint's state advances token
    // by token), and the request allows it.
    if (s.status != SeqStatus::kRunning || s.n_uncomputed() != 1 || s.fork_pending || s.n_generated() == 0 ||
        s.json || p.spec_max == 0)
      return;
    int32_t cap = p.spec_max > 0 ? std::min(p.spec_max, cfg_.max_draft) : cfg_.max_draft;
    // k drafts can give k + 1 tokens, and their positions must fit the context.
    if (p.max_tokens >= 0) cap = std::min(cap, p.max_tokens - s.n_generated() - 1);
    cap = std::min(cap, max_context_ - s.slot(static_cast<int32_t>(s.tokens.size())));
    // Nor cross a streaming window's eviction point.
    if (stream_limit > 0) cap = std::min(cap, stream_limit - s.slot(static_cast<int32_t>(s.tokens.size())));
    if (cap <= 0) return;
    const int32_t a = drafter_->available(s, cap);
    if (a <= 0) return;
    if (s.spec.drafted == 0 && s.spec.acceptance == 0) s.spec.acceptance = cfg_.prior_acceptance;
    cand.push_back(&s);
    acceptance.push_back(s.spec.acceptance);
    avail.push_back(a);
  });
  if (cand.empty()) return;
  std::vector<int32_t> k(cand.size(), 0);
  policy_.choose(static_cast<int32_t>(sched.n_decoding()), acceptance, avail, drafter_.get(), k);
  std::vector<Sequence*> go;
  std::vector<int32_t> want;
  for (size_t i = 0; i < cand.size(); ++i)
    if (k[i] > 0) {
      go.push_back(cand[i]);
      want.push_back(k[i]);
    }
  if (go.empty()) return;
  std::vector<std::vector<int32_t>> out(go.size());
  drafter_->propose(go, want, out);
  for (size_t i = 0; i < go.size(); ++i) go[i]->draft = std::move(out[i]);
}

void verify_drafts(Sequence& s, const float* logits, int32_t nv, const Tokenizer& tok, std::vector<int32_t>& verified) {
  // Same logits, same sampler state and history as plain decoding; a draft
  // is kept while it equals the token sampled before it.
  std::vector<int32_t> history = s.tokens;
  const int32_t rows = static_cast<int32_t>(s.draft.size()) + 1;
  const bool eog_stops = s.req->params.stop_at_eog;
  for (int32_t j = 0; j < rows; ++j) {
    const int32_t y = s.sampler->sample(std::span<const float>(logits + int64_t{j} * nv, nv), history, nullptr);
    verified.push_back(y);
    history.push_back(y);
    if (j + 1 == rows || y != s.draft[j] || (eog_stops && tok.is_eog(y))) break;
  }
}

int32_t SpeculativeDecoding::keep(Sequence& s, std::span<const int32_t> verified, BlockManager& blocks) {
  const int32_t start = s.n_computed();
  const int32_t m = static_cast<int32_t>(verified.size());
  const int32_t k = static_cast<int32_t>(s.draft.size());
  int32_t kept = 0;
  while (kept < std::min(m, k) && verified[kept] == s.draft[kept]) ++kept;
  // Rows [start, start + m) held the last token and the drafts kept before
  // the last verified one: their K/V stands; the slots after are given back.
  std::vector<int32_t> fed = s.tokens;
  fed.insert(fed.end(), s.draft.begin(), s.draft.begin() + (m - 1));
  blocks.commit(s.blocks, fed, s.slot(start) + m);
  blocks.truncate(s.blocks, s.slot(start) + m);
  // Running acceptance: each draft up to the first miss is one observation.
  const int32_t observed = std::min(k, kept + 1);
  for (int32_t j = 0; j < observed; ++j) s.spec.acceptance += 0.1 * ((j < kept ? 1.0 : 0.0) - s.spec.acceptance);
  s.spec.drafted += k;
  s.spec.accepted += kept;
  return kept;
}

}  // namespace tandem

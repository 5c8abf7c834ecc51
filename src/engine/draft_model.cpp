#include "engine/draft_model.h"

#include <algorithm>
#include <chrono>
#include <unordered_map>
#include <vector>

#include "core/error.h"
#include "runtime/thread_pool.h"
#include "engine/sequence.h"
#include "kv/block_manager.h"
#include "kv/kv_cache.h"
#include "model/executor.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

namespace tandem {
namespace {

constexpr int32_t kBlockSize = 16;
constexpr int64_t kMaxPoolBytes = int64_t{1} << 30;

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void check_vocab(const Tokenizer& t, const Tokenizer& d) {
  if (t.n_vocab() != d.n_vocab())
    fail(ErrorKind::kInvalidArgument, "the draft model's vocabulary has {} tokens, the model's {}: they must be the same",
         d.n_vocab(), t.n_vocab());
  if (t.bos_id() != d.bos_id() || t.eos_id() != d.eos_id())
    fail(ErrorKind::kInvalidArgument, "the draft model's BOS/EOS ids ({}/{}) differ from the model's ({}/{})",
         d.bos_id(), d.eos_id(), t.bos_id(), t.eos_id());
  for (int32_t id = 0; id < t.n_vocab(); ++id) {
    const std::string a = t.token_to_piece(id, true), b = d.token_to_piece(id, true);
    if (a != b)
      fail(ErrorKind::kInvalidArgument, "the draft model's token {} is '{}' where the model's is '{}': the "
                                        "vocabularies differ", id, b.substr(0, 40), a.substr(0, 40));
  }
}

class DraftModelDrafter final : public Drafter {
 public:
  DraftModelDrafter(Model& draft, const SpecConfig& cfg, int32_t max_context, int32_t max_seqs, ThreadPool& pool)
      : n_vocab_(draft.config().n_vocab), cfg_(cfg) {
    // The draft runs on a runner of its own: the draft model on the same
    // threads over an f16 cache of its own, every layer in one block table.
    KvPlan plan;
    plan.shape = draft.kv_shape();
    plan.block_size = kBlockSize;
    plan.format = kv_format(KvType::kF16, KvType::kF16);
    const int64_t per_token = static_cast<int64_t>(KvCache::bytes_per_token(plan.shape, plan.format));
    int64_t tokens = std::min<int64_t>(int64_t{max_seqs} * max_context, kMaxPoolBytes / per_token);
    tokens = std::max<int64_t>(tokens, max_context + kBlockSize);
    plan.n_blocks = static_cast<int32_t>(tokens / kBlockSize);
    runner_ = make_cpu_executor(draft, plan, pool);
    blocks_ = std::make_unique<BlockManager>(plan.n_blocks, kBlockSize, false);
    calibrate(std::min({64, max_context, max_seqs * (1 + cfg.max_draft)}));
  }

  int32_t available(Sequence& seq, int32_t cap) override {
    // Room for what is behind plus the drafts, or no drafts at all.
    const Own& o = own(seq);
    const int32_t end = static_cast<int32_t>(seq.tokens.size()) + cap;
    return blocks_->can_append(o.blocks, std::max(end, o.blocks.n_computed)) ? cap : 0;
  }

  void propose(std::span<Sequence* const> seqs, std::span<const int32_t> want,
               std::span<std::vector<int32_t>> out) override {
    std::vector<Own*> st(seqs.size());
    std::vector<SeqKv> kvs(seqs.size());
    std::vector<size_t> who;
    Batch b;
    // Pass 1: catch up from the first position where the draft's cache and
    // the sequence part (what the target rejected is rewritten, what it kept
    // and added is fed), and draft the first token.
    for (size_t i = 0; i < seqs.size(); ++i) {
      Sequence& s = *seqs[i];
      Own& o = own(s);
      st[i] = &o;
      const int32_t size = static_cast<int32_t>(s.tokens.size());
      int32_t keep = 0;
      while (keep < o.blocks.n_computed && keep < size && o.fed[keep] == s.tokens[keep]) ++keep;
      keep = std::min(keep, size - 1);  // the last token's logits are needed
      blocks_->rollback(o.blocks, keep);
      o.fed.resize(keep);
      blocks_->append(o.blocks, size + want[i] - 1);  // the catch-up and every draft but the last
      for (int32_t p = keep; p < size; ++p) {
        b.push_back({s.tokens[p], p, static_cast<int32_t>(who.size()), p + 1 == size});
        o.fed.push_back(s.tokens[p]);
      }
      kvs[i].blocks = o.blocks.table;
      kvs[i].n_tokens = keep;
      who.push_back(i);
      out[i].clear();
    }
    pass(b, kvs, who, out);
    // Then one row per pass for each sequence that wants more.
    for (int32_t n = 1;; ++n) {
      b.clear();
      who.clear();
      for (size_t i = 0; i < seqs.size(); ++i) {
        if (static_cast<int32_t>(out[i].size()) != n || n >= want[i]) continue;
        b.push_back({out[i].back(), static_cast<int32_t>(st[i]->fed.size()), static_cast<int32_t>(who.size()), true});
        st[i]->fed.push_back(out[i].back());
        who.push_back(i);
      }
      if (who.empty()) break;
      pass(b, kvs, who, out);
    }
    for (Own* o : st) blocks_->commit(o->blocks, o->fed, static_cast<int32_t>(o->fed.size()));
  }

  void forget(Sequence& seq, int32_t n_tokens) override {
    if (n_tokens >= 0) return;  // the next pass finds where the tokens part from its cache
    auto it = own_.find(seq.id);
    if (it == own_.end()) return;
    blocks_->free(it->second.blocks);
    own_.erase(it);
  }

  double cost(int32_t rows, int32_t passes) const override { return passes * cost_.at(rows); }

 private:
  struct Own {
    SeqBlocks blocks;
    std::vector<int32_t> fed;  // the tokens at the positions its cache holds
  };

  Own& own(Sequence& s) { return own_[s.id]; }

  // One forward pass over the rows of the sequences `who` (row.seq indexes
  // who); each sequence's one row with logits gives its greedy pick.
  void pass(const Batch& b, std::vector<SeqKv>& kvs, const std::vector<size_t>& who,
            std::span<std::vector<int32_t>> out) {
    const int32_t nv = n_vocab_;
    std::vector<SeqKv*> ptrs;
    for (size_t i : who) ptrs.push_back(&kvs[i]);
    const size_t rows = rows_with_logits(b);
    if (logits_.size() < rows * nv) logits_.resize(rows * nv);
    const double t0 = now_s();
    runner_->forward(b, ptrs, std::span<float>(logits_));
    cost_.observe(static_cast<int32_t>(b.size()), now_s() - t0);
    for (size_t j = 0; j < who.size(); ++j) {
      const float* l = logits_.data() + j * nv;
      out[who[j]].push_back(static_cast<int32_t>(std::max_element(l, l + nv) - l));
    }
  }

  void calibrate(int32_t top) {
    SeqBlocks sb;
    const std::vector<int32_t> ids(static_cast<size_t>(top), 0);
    if (!blocks_->can_allocate(ids, false)) return;
    blocks_->allocate(sb, ids, false);
    SeqKv sk;
    sk.blocks = sb.table;
    std::vector<SeqKv*> one = {&sk};
    for (int32_t rows = 1; rows <= top; rows *= 2) {
      Batch b;
      for (int32_t p = 0; p < rows; ++p) b.push_back({0, p, 0, p + 1 == rows});
      if (logits_.size() < static_cast<size_t>(n_vocab_)) logits_.resize(n_vocab_);
      double best = 0;
      for (int rep = 0; rep < 2; ++rep) {
        sk.n_tokens = 0;
        const double t0 = now_s();
        runner_->forward(b, one, std::span<float>(logits_));
        const double t = now_s() - t0;
        if (rep > 0 && (best == 0 || t < best)) best = t;
      }
      cost_.observe(rows, best);
    }
    blocks_->free(sb);
  }

  int32_t n_vocab_;
  SpecConfig cfg_;
  std::unique_ptr<Executor> runner_;
  std::unique_ptr<BlockManager> blocks_;
  std::unordered_map<uint64_t, Own> own_;
  Logits logits_;
  CostCurve cost_;
};

}  // namespace

std::unique_ptr<Drafter> make_draft_model_drafter(const Model& target, Model& draft, const SpecConfig& cfg,
                                                  int32_t max_context, int32_t max_seqs, ThreadPool& pool) {
  check_vocab(target.tokenizer(), draft.tokenizer());
  if (draft.config().n_ctx_train < max_context)
    fail(ErrorKind::kInvalidArgument, "the draft model's context ({} tokens) is shorter than the context {}",
         draft.config().n_ctx_train, max_context);
  return std::make_unique<DraftModelDrafter>(draft, cfg, max_context, max_seqs, pool);
}

}  // namespace tandem

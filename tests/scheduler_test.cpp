// The scheduler and the prefill pacer on their own: which sequences a step
// runs and how many of their tokens.
#include <algorithm>
#include <memory>

#include <gtest/gtest.h>

#include "engine/prefill_pacer.h"
#include "engine/scheduler.h"
#include "kv/block_manager.h"

namespace tandem {
namespace {

std::unique_ptr<Sequence> make_seq(uint64_t arrival, int32_t n_prompt, int32_t priority = 0) {
  auto s = std::make_unique<Sequence>();
  s->req = std::make_shared<RequestState>();
  s->req->params.priority = priority;
  s->arrival_order = arrival;
  s->id = arrival;
  for (int32_t i = 0; i < n_prompt; ++i) s->tokens.push_back(static_cast<int32_t>(arrival * 1000 + i));
  s->n_prompt = n_prompt;
  return s;
}

int32_t tokens_of(const std::vector<ScheduledSeq>& batch, const Sequence* s) {
  for (const ScheduledSeq& b : batch)
    if (b.seq == s) return b.n_tokens;
  return 0;
}

// Runs a batch as the engine would: K/V written, then committed.
void commit(BlockManager& bm, const std::vector<ScheduledSeq>& batch) {
  for (const ScheduledSeq& b : batch) bm.commit(b.seq->blocks, b.seq->tokens, b.seq->n_computed() + b.n_tokens);
}

TEST(Scheduler, ShortPromptOvertakesALongOneButTheLongOneKeepsMoving) {
  BlockManager bm(256, 16, false);
  SchedulerConfig cfg{.max_batch_tokens = 64, .max_seqs = 8, .prefill_chunk = 64, .shortest_prompt_first = true};
  Scheduler sched(cfg, bm);
  auto long_seq = make_seq(1, 1000);
  Sequence* lp = long_seq.get();
  sched.add(std::move(long_seq));
  auto b = sched.schedule();
  EXPECT_EQ(tokens_of(b, lp), 64);
  commit(bm, b);

  auto short_seq = make_seq(2, 20);
  Sequence* sp = short_seq.get();
  sched.add(std::move(short_seq));
  b = sched.schedule(/*prefill_budget=*/24);
  // The oldest prompt's reserved quarter first, then the short one, shortest first.
  EXPECT_EQ(tokens_of(b, lp), 6);
  EXPECT_EQ(tokens_of(b, sp), 18);
  commit(bm, b);
  b = sched.schedule(24);
  EXPECT_EQ(tokens_of(b, sp), 2);   // its last prompt tokens
  EXPECT_EQ(tokens_of(b, lp), 22);  // the rest of the budget
  commit(bm, b);
  EXPECT_EQ(sp->n_uncomputed(), 0);
}

// A prompt being scored (prompt_logprobs) takes at most max_prompt_logit_rows
// rows a step, all scored prompts together, and skips the prefix cache; the
// others fill the rest of the budget.
TEST(Scheduler, ScoredPromptsAreCappedAndComputedInFull) {
  BlockManager bm(64, 16, true);
  SchedulerConfig cfg{.max_batch_tokens = 64, .max_seqs = 8, .prefill_chunk = 64, .max_prompt_logit_rows = 10};
  Scheduler sched(cfg, bm);
  // A first sequence computes and publishes the first two blocks of prompt 1.
  auto warm = make_seq(1, 40);
  Sequence* pw = warm.get();
  sched.add(std::move(warm));
  auto b = sched.schedule();
  EXPECT_EQ(tokens_of(b, pw), 40);
  commit(bm, b);
  sched.remove(pw);
  auto scored = [](uint64_t arrival) {
    auto s = make_seq(arrival, 40);
    s->tokens = make_seq(1, 40)->tokens;  // prompt 1 again
    s->req->params.prompt_logprobs = 0;
    s->prompt_lp.push_back({s->tokens[0], 0});
    s->score_next = 1;
    return s;
  };
  auto a = scored(2), c = scored(3);
  auto plain = make_seq(4, 100);
  Sequence *pa = a.get(), *pc = c.get(), *pp = plain.get();
  sched.add(std::move(a));
  sched.add(std::move(c));
  sched.add(std::move(plain));
  b = sched.schedule();
  EXPECT_EQ(pa->n_cached_prompt, 0);  // its blocks are cached, but it must compute them
  EXPECT_EQ(tokens_of(b, pa) + tokens_of(b, pc), 10);
  EXPECT_EQ(tokens_of(b, pp), 54);
  // Once every prompt position is scored, the cap no longer applies.
  pa->score_next = 40;
  commit(bm, b);
  b = sched.schedule();
  EXPECT_EQ(tokens_of(b, pa), 40 - pa->n_computed());
  EXPECT_LE(tokens_of(b, pc), 10);
}

// Rows before the first scored position need no logits: a prompt scored from
// its middle (perplexity's second half) takes its context rows in the same
// step as the first scored ones, without spending the logits cap on them.
TEST(Scheduler, ContextRowsOfAScoredPromptCostNoLogits) {
  BlockManager bm(64, 16, false);
  SchedulerConfig cfg{.max_batch_tokens = 128, .max_seqs = 8, .prefill_chunk = 128, .max_prompt_logit_rows = 10};
  Scheduler sched(cfg, bm);
  auto s = make_seq(1, 64);
  s->req->params.on_prompt_row = [](int32_t, std::span<const float>) {};
  s->req->params.rows_from = 32;
  s->score_next = 33;
  Sequence* p = s.get();
  sched.add(std::move(s));
  auto b = sched.schedule();
  EXPECT_EQ(tokens_of(b, p), 32 + 10);  // rows 0..31 free, then ten scored rows
  commit(bm, b);
  p->score_next = 43;
  b = sched.schedule();
  EXPECT_EQ(tokens_of(b, p), 10);
}

TEST(Scheduler, ArrivalOrderWithoutShortestFirst) {
  BlockManager bm(256, 16, false);
  SchedulerConfig cfg{.max_batch_tokens = 64, .max_seqs = 8, .prefill_chunk = 64};
  Scheduler sched(cfg, bm);
  auto a = make_seq(1, 200), b = make_seq(2, 10);
  Sequence *pa = a.get(), *pb = b.get();
  sched.add(std::move(a));
  sched.add(std::move(b));
  auto batch = sched.schedule();
  EXPECT_EQ(tokens_of(batch, pa), 64);
  EXPECT_EQ(tokens_of(batch, pb), 0);
}

TEST(Scheduler, DecodesAreNeverCappedByThePrefillBudget) {
  BlockManager bm(256, 16, false);
  SchedulerConfig cfg{.max_batch_tokens = 64, .max_seqs = 8, .prefill_chunk = 64, .shortest_prompt_first = true};
  Scheduler sched(cfg, bm);
  std::vector<Sequence*> seqs;
  for (int i = 0; i < 3; ++i) {
    auto s = make_seq(i + 1, 5);
    seqs.push_back(s.get());
    sched.add(std::move(s));
  }
  auto b = sched.schedule();
  commit(bm, b);
  for (Sequence* s : seqs) s->tokens.push_back(7);  // each sampled a token: decoding now
  EXPECT_EQ(sched.n_decoding(), 3);
  auto late = make_seq(9, 40);
  Sequence* lp = late.get();
  sched.add(std::move(late));
  b = sched.schedule(0);  // a decode-only (calibration) step
  EXPECT_EQ(b.size(), 3u);
  EXPECT_EQ(tokens_of(b, lp), 0);
  EXPECT_EQ(sched.n_waiting(), 1u);  // not admitted on a step without prompt tokens
  EXPECT_EQ(sched.n_prefilling(), 1);
  commit(bm, b);
  for (Sequence* s : seqs) s->tokens.push_back(7);
  b = sched.schedule(5);
  EXPECT_EQ(b.size(), 4u);
  EXPECT_EQ(sched.n_prefilling(), 1);  // admitted, 35 prompt tokens to go
  EXPECT_EQ(tokens_of(b, lp), 5);
}

// Drafts ride along only in the budget left after every decoding sequence's
// own row: a long draft never pushes another sequence out of the step.
TEST(Scheduler, DraftsNeverCostADecodeItsPlace) {
  BlockManager bm(256, 16, false);
  SchedulerConfig cfg{.max_batch_tokens = 10, .max_seqs = 8, .prefill_chunk = 10};
  Scheduler sched(cfg, bm);
  std::vector<Sequence*> seqs;
  for (int i = 0; i < 4; ++i) {
    auto s = make_seq(i + 1, 2);
    seqs.push_back(s.get());
    sched.add(std::move(s));
  }
  auto b = sched.schedule();
  commit(bm, b);
  for (Sequence* s : seqs) s->tokens.push_back(7);
  seqs[0]->draft = {1, 2, 3, 4, 5, 6, 7, 8};  // 9 rows: more than the 6 spare
  seqs[1]->draft = {1, 2, 3};                 // fits the 6 spare rows
  seqs[2]->draft = {1, 2, 3, 4};              // 3 spare rows left: dropped
  b = sched.schedule();
  ASSERT_EQ(b.size(), 4u);
  EXPECT_EQ(tokens_of(b, seqs[0]), 1);
  EXPECT_EQ(tokens_of(b, seqs[1]), 4);
  EXPECT_EQ(tokens_of(b, seqs[2]), 1);
  EXPECT_EQ(tokens_of(b, seqs[3]), 1);
  EXPECT_TRUE(seqs[0]->draft.empty());
  EXPECT_TRUE(seqs[2]->draft.empty());
}

TEST(PrefillPacer, SizesPromptWorkByMeasuredCost) {
  PacerConfig pc{.step_factor = 1.5, .min_tokens = 4, .max_tokens = 256, .recalibrate_every = 8};
  PrefillPacer p(pc);
  EXPECT_EQ(p.budget(0), 256);  // nothing decoding: no reason to hold prefill back
  EXPECT_EQ(p.budget(4), 0);    // decoding but never measured: a decode-only step first
  p.observe(0.25, 4, 0);        // decode-only step of 4 rows
  EXPECT_EQ(p.budget(4), 4);    // token cost unknown: the minimum
  p.observe(0.375, 4, 8);       // 8 prompt rows added 0.125 s
  // (1.5 - 1) * 0.25 s / (0.125 s / 8)
  EXPECT_EQ(p.budget(4), 8);
  EXPECT_EQ(p.budget(5), 8);    // a slightly different batch keeps the estimate
  EXPECT_EQ(p.budget(9), 0);    // more than twice the rows: measure again
  EXPECT_EQ(p.budget(1), 0);    // less than half
  for (int i = 0; i < 7; ++i) p.observe(0.375, 4, 8);
  EXPECT_EQ(p.budget(4), 0);    // 8 mixed steps since the last decode-only one
  p.observe(0.25, 4, 0);
  EXPECT_EQ(p.budget(4), 8);
  // Prompts that will join the batch: 1.5 tokens more per joining sequence
  // (8 + 1.5 * 4 with 4 waiting, 8 + 1.5 with one).
  EXPECT_EQ(p.budget(4, 4), 14);
  EXPECT_EQ(p.budget(4, 1), 9);
  // A burst: 12 prompts waiting beside 4 decoders: 8 + 1.5 * 12 beats
  // tripling the allowance (24).
  EXPECT_EQ(p.budget(4, 12), 26);
  // 40 waiting beside 4: ten times the allowance (80), more than 8 + 1.5 * 40 (68).
  EXPECT_EQ(p.budget(4, 40), 80);
}

// Only the sequences that fit under max_seqs count as joining.
TEST(PrefillPacer, JoiningSequencesStopAtMaxSeqs) {
  PrefillPacer p({.step_factor = 1.5, .min_tokens = 4, .max_tokens = 256, .recalibrate_every = 64, .max_seqs = 8});
  p.observe(0.25, 4, 0);
  p.observe(0.375, 4, 8);
  EXPECT_EQ(p.budget(4, 2), 11);  // 8 + 1.5 * 2
  EXPECT_EQ(p.budget(4, 4), 14);  // 8 + 1.5 * 4
  EXPECT_EQ(p.budget(4, 6), 14);  // 4 decoding + 4 joining fill the 8
  EXPECT_EQ(p.budget(8, 6), 0);   // remeasure (twice the rows)
}

// A burst grows the batch a few decoders at a time: each growth beyond 25%
// is measured again, so the new rows' cost is not charged to the prompt
// tokens beside them; and a prefill-only step of a few tokens (it costs
// about a whole decode step) is no guess of a token's cost.
TEST(PrefillPacer, RemeasuresGrowingBatchesAndIgnoresTinyFirstGuesses) {
  PrefillPacer p({.step_factor = 1.5, .min_tokens = 4, .max_tokens = 256, .recalibrate_every = 64});
  p.observe(0.019, 0, 2);       // 2 prompt tokens alone: no guess from that
  p.observe(0.010, 1, 0);       // decode-only, 1 row
  EXPECT_EQ(p.budget(1), 4);    // token cost still unknown: the minimum
  p.observe(0.080, 0, 128);     // 128 prompt tokens alone: 0.625 ms a token at most
  EXPECT_EQ(p.budget(1), 8);    // 0.5 * 10 ms / 0.625 ms
  p.observe(0.020, 8, 0);       // decode-only, 8 rows
  p.observe(0.024, 8, 8);       // 8 prompt rows added 4 ms
  EXPECT_EQ(p.budget(8), 16);   // 0.5 * 20 ms / 0.594 ms (0.625 moved a quarter of the way to 0.5)
  EXPECT_EQ(p.budget(10), 16);  // within 25% of the measured 8 rows
  EXPECT_EQ(p.budget(11), 0);   // beyond: a decode-only step first
  EXPECT_EQ(p.budget(6), 0);
}

TEST(PrefillPacer, ClampsAndCanBeOff) {
  PrefillPacer p({.step_factor = 3.0, .min_tokens = 4, .max_tokens = 64, .recalibrate_every = 64});
  p.observe(0.5, 2, 0);
  p.observe(0.5 + 0.001, 2, 100);  // very cheap tokens
  EXPECT_EQ(p.budget(2), 64);
  PrefillPacer q({.step_factor = 1.01, .min_tokens = 4, .max_tokens = 64, .recalibrate_every = 64});
  q.observe(0.01, 2, 0);
  q.observe(0.5, 2, 10);  // very expensive tokens
  EXPECT_EQ(q.budget(2), 4);
  PrefillPacer off({.step_factor = 1.0});
  EXPECT_FALSE(off.enabled());
  EXPECT_EQ(off.budget(3), 256);
}

}  // namespace
}  // namespace tandem

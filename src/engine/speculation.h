// Speculative decoding: a drafter guesses the next few tokens of a decoding
// sequence, and the target model checks them as extra rows of its step.
//
// Decode reads every weight once per step whatever the rows, so k more rows
// cost far less than k more steps while the step is bound by memory. The
// sequence then samples its rows in order exactly as plain decoding would
// (same logits: a row's result does not depend on the rows beside it; same
// sampler, same random draws) and keeps each draft only while it equals the
// token sampled before it. The output is the one plain decoding gives, token
// for token, greedy or seeded; for a deterministic draft this is Leviathan et
// al.'s rejection rule (a draft d is kept with probability p(d), and on a
// miss the token comes from p without d), with the coin shared.
//
// How many tokens to draft is decided each step (SpecPolicy) from the
// measured cost of a step of R rows on this machine and model, the draft
// model's own, and each sequence's acceptance so far: drafts are added while
// the expected tokens per second grow, so speculation fades as the batch
// grows and steps stop being memory-bound, and stops for text it cannot guess.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

namespace tandem {

struct Sequence;

enum class SpecMode { kOff, kNgram, kDraft };
SpecMode parse_spec_mode(std::string_view name);  // "off", "ngram", "draft"; throws otherwise
const char* spec_mode_name(SpecMode m);

struct SpecConfig {
  SpecMode mode = SpecMode::kOff;
  int32_t max_draft = 16;  // tokens drafted per sequence and step at most
  // Prompt lookup (ngram): the longest suffix of the sequence, of at most
  // ngram_max and at least ngram_min tokens, seen earlier in it.
  int32_t ngram_min = 2;
  int32_t ngram_max = 4;
  // Acceptance a sequence is credited with before it has drafted.
  double prior_acceptance = 0.6;
  // Drafts are taken only while they raise the expected tokens per second by
  // at least this factor: a margin for the error of the estimates.
  double min_gain = 1.03;
  // false: always draft max_draft tokens where the drafter can (to measure
  // what the policy would have chosen against).
  bool adaptive = true;
};

// Measured time of a forward pass as a function of its rows: exact where a
// row count was seen (a running average), straight lines between, extended
// from the last two points beyond them.
class CostCurve {
 public:
  void observe(int32_t rows, double seconds);
  double at(int32_t rows) const;  // 0 when nothing has been seen
  bool empty() const { return points_ == 0; }

 private:
  std::vector<double> t_;  // per row count; < 0: unseen
  int32_t points_ = 0;
};

// A sequence's drafting record.
struct SpecState {
  double acceptance = 0;   // running estimate of P(a drafted token is kept)
  int32_t drafted = 0;     // totals, for the request's report
  int32_t accepted = 0;
  int32_t steps = 0;       // decode steps of this sequence
  // Prompt lookup: for each n-gram (of ngram_min..ngram_max tokens) of the
  // tokens indexed so far, where its latest occurrence ends.
  std::unordered_map<uint64_t, int32_t> ngrams;
  int32_t indexed = 0;     // tokens whose n-grams are in the index
  int32_t match_end = -1;  // where the continuation found by the last lookup starts
  int32_t match_len = 0;   // and how long it is
};

// Proposes drafts. A drafter may hold state per sequence (in SpecState, or
// its own keyed by sequence id); forget() drops it.
class Drafter {
 public:
  virtual ~Drafter() = default;
  // The most tokens it could draft for `seq` now (capped by `cap`).
  virtual int32_t available(Sequence& seq, int32_t cap) = 0;
  // Drafts for several sequences at once (a draft model runs them as one
  // batch): want[i] tokens for seqs[i] into out[i]. A drafter may return fewer.
  virtual void propose(std::span<Sequence* const> seqs, std::span<const int32_t> want,
                       std::span<std::vector<int32_t>> out) = 0;
  // The sequence's tokens were cut back to `n_tokens` or it ended (-1).
  virtual void forget(Sequence& seq, int32_t n_tokens) {}
  // Seconds of drafting for a step of `rows` draft rows per draft pass and
  // `passes` passes (0 for a drafter that costs nothing).
  virtual double cost(int32_t rows, int32_t passes) const { return 0; }
};

// Prompt lookup decoding: drafts copied from the sequence itself (prompt and
// output so far), after the latest earlier occurrence of its longest suffix.
class NgramDrafter final : public Drafter {
 public:
  explicit NgramDrafter(const SpecConfig& cfg) : cfg_(cfg) {}
  int32_t available(Sequence& seq, int32_t cap) override;
  void propose(std::span<Sequence* const> seqs, std::span<const int32_t> want,
               std::span<std::vector<int32_t>> out) override;
  void forget(Sequence& seq, int32_t n_tokens) override;

 private:
  void index(Sequence& seq);
  SpecConfig cfg_;
};

// Chooses each decoding sequence's draft length for one step.
class SpecPolicy {
 public:
  explicit SpecPolicy(const SpecConfig& cfg) : cfg_(cfg) {}
  CostCurve& target_cost() { return target_; }
  // base_rows: the step's rows without drafts (decodes and prompt chunks).
  // acceptance[i], avail[i]: sequence i's estimate and the most it may draft.
  // Fills k[i]. `draft` gives the drafter's cost (nullptr: free).
  void choose(int32_t base_rows, std::span<const double> acceptance, std::span<const int32_t> avail,
              const Drafter* draft, std::span<int32_t> k) const;

 private:
  SpecConfig cfg_;
  CostCurve target_;
};

}  // namespace tandem

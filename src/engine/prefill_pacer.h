// Sizes the prefill work of a step in time rather than in tokens.
//
// On a CPU prefill is compute-bound: one prompt token costs a large fraction
// of what a whole decode step costs (a decode step reads every weight once
// for all its rows). A step that carries a fixed chunk of 128 prompt tokens
// next to running chats therefore takes several decode steps' time, and the
// chats' time per output token grows with it. The pacer measures what a
// decode-only step costs and what one prompt token adds to a step, and gives
// each step only as many prompt tokens as keep it within `step_factor` times
// the decode-only step: the chats slow down by a bounded factor whatever the
// model and machine, and long prompts still advance every step.
//
// When more sequences wait for their prompt than are decoding (a burst of
// new requests), holding them all back to spare the few decoders trades many
// long first-token waits for a small saving per token; the allowance then
// grows with the ratio, (step_factor - 1) * waiting / decoding, so the pain is
// shared per sequence and the batch fills up (what makes batching pay).
//
// The decode-only step is also measured on the batch as it is, not as it will
// be: with 8 decoding and 8 waiting (a closed loop of 16 clients settles
// there) the ratio is 1, a step affords a few prompt tokens, and the batch
// stays half prefilling at ~2x the weight reads per token. Every waiting
// sequence will decode beside the others within a few steps, adding about a
// prompt token's cost to each of their steps; so a step may also take
// step_factor times the cost of that fuller batch: `step_factor` more prompt
// tokens per sequence that can join (up to max_seqs).
#pragma once

#include <cstdint>

namespace tandem {

struct PacerConfig {
  double step_factor = 1.5;  // a mixed step aims at this multiple of a decode-only step; <= 1: no pacing
  int32_t min_tokens = 4;    // prompt tokens per step at least, so prefill always advances
  int32_t max_tokens = 256;  // and at most (the scheduler's budget)
  int32_t recalibrate_every = 64;  // mixed steps between two decode-only measurements
  // A decode-only measurement holds for batches within this ratio of its
  // decode rows. Wider, a burst that grows the batch from 7 to 10 decoders
  // would charge the 3 new rows' cost to the prompt tokens beside them, and
  // the allowance would shrink just when most sequences wait.
  double recalibrate_ratio = 1.25;
  // A prefill-only step gives the first per-token guess only with at least
  // this many rows: a few prompt tokens cost about a decode step (every
  // weight is read either way), which would make tokens look 10x dearer.
  int32_t min_guess_rows = 32;
  int32_t max_seqs = 1 << 30;  // the scheduler's sequence limit: at most this many decode together
};

class PrefillPacer {
 public:
  explicit PrefillPacer(const PacerConfig& cfg) : cfg_(cfg) {}

  // Prompt tokens the next step may carry when `decode_rows` sequences are
  // decoding and `prefill_seqs` have prompt tokens left (running or waiting).
  // 0 asks for a decode-only step to measure its cost (at most once every
  // `recalibrate_every` mixed steps, or when the number of decoding
  // sequences has moved beyond `recalibrate_ratio` of the measured one).
  int32_t budget(int32_t decode_rows, int32_t prefill_seqs = 0) const;

  // Records a finished step: its wall time, how many sequences decoded in it
  // (with their drafts, if any) and how many prompt rows it ran.
  void observe(double seconds, int32_t decode_rows, int32_t prefill_rows);

  bool enabled() const { return cfg_.step_factor > 1.0; }
  double decode_step_s() const { return t_decode_; }       // < 0: not measured yet
  double prefill_token_s() const { return t_token_; }      // < 0: not measured yet

 private:
  bool other_batch(int32_t decode_rows) const;

  PacerConfig cfg_;
  double t_decode_ = -1;     // seconds of a decode-only step (moving average)
  int32_t decode_rows_at_ = 0;  // decoding sequences when t_decode_ was measured
  double t_token_ = -1;      // seconds one prompt token adds to a step (moving average)
  int32_t mixed_since_ = 0;  // mixed steps since t_decode_ was last measured
};

}  // namespace tandem

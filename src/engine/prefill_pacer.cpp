#include "engine/prefill_pacer.h"

#include <algorithm>
#include <cmath>

namespace tandem {
namespace {

// Moving averages follow a change within a few steps but ride out one
// preempted or descheduled step.
constexpr double kAlpha = 0.25;

double blend(double avg, double x) { return avg < 0 ? x : avg + kAlpha * (x - avg); }

}  // namespace

bool PrefillPacer::other_batch(int32_t decode_rows) const {
  const double r = cfg_.recalibrate_ratio;
  return decode_rows > r * decode_rows_at_ || decode_rows * r < decode_rows_at_;
}

int32_t PrefillPacer::budget(int32_t decode_rows, int32_t prefill_seqs) const {
  if (!enabled() || decode_rows == 0) return cfg_.max_tokens;
  const bool stale = t_decode_ < 0 || mixed_since_ >= cfg_.recalibrate_every || other_batch(decode_rows);
  if (stale) return 0;
  if (t_token_ <= 0) return cfg_.min_tokens;
  const double per_step = (cfg_.step_factor - 1.0) * t_decode_ / t_token_;
  const double share = std::max(1.0, static_cast<double>(prefill_seqs) / decode_rows);
  const int32_t joining = std::clamp(prefill_seqs, 0, std::max(0, cfg_.max_seqs - decode_rows));
  const double n = std::floor(std::max(per_step * share, per_step + cfg_.step_factor * joining));
  return static_cast<int32_t>(std::clamp(n, static_cast<double>(cfg_.min_tokens), static_cast<double>(cfg_.max_tokens)));
}

void PrefillPacer::observe(double seconds, int32_t decode_rows, int32_t prefill_rows) {
  if (seconds <= 0) return;
  if (prefill_rows == 0) {
    if (decode_rows == 0) return;
    t_decode_ = decode_rows_at_ > 0 && other_batch(decode_rows) ? seconds  // a different batch: start over
                                                                 : blend(t_decode_, seconds);
    decode_rows_at_ = decode_rows;
    mixed_since_ = 0;
    return;
  }
  if (decode_rows == 0) {
    // A prefill-only step also pays for reading the weights, so it
    // overstates a token's share of a mixed step; use it only as a first guess.
    if (t_token_ < 0 && prefill_rows >= cfg_.min_guess_rows) t_token_ = seconds / prefill_rows;
    return;
  }
  ++mixed_since_;
  if (t_decode_ < 0) return;
  // What the prompt rows added to the step; a step that ran faster than the
  // decode-only average (noise) still counts the rows as costing something.
  const double added = std::max(seconds - t_decode_, 0.1 * t_decode_);
  t_token_ = blend(t_token_, added / prefill_rows);
}

}  // namespace tandem

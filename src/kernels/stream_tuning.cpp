#include "kernels/stream_tuning.h"

#include "runtime/cpu_features.h"

namespace tandem {

StreamTuning stream_tuning(const RuntimeOptions& opts) {
  StreamTuning t;
  const CpuFeatures& f = cpu_features();
  // AMD family 19h (Zen 3, Zen 4): its hardware prefetcher streams the row
  // kernels' weights better alone, f16 / bf16 decode reads one row at a time,
  // and the repacked panels are prefetched a little way ahead from 8 rows on
  // (fewer rows run slower with it). Zen 5 (1Ah) measured the opposite for
  // the row kernels, so it keeps the defaults. docs/performance.md has the numbers.
  if (f.vendor == CpuVendor::kAmd && f.family == 0x19) {
    t.software_prefetch = false;
    t.float_single_row = true;
    t.panel_prefetch_bytes = 2048;
    t.panel_prefetch_min_rows = 8;
  }
  switch (opts.prefetch) {
    case PrefetchMode::kAuto: break;
    case PrefetchMode::kOff:
      t.software_prefetch = false;
      t.panel_prefetch_bytes = 0;
      t.panel_prefetch_next = false;
      break;
    case PrefetchMode::kOn:
      t.software_prefetch = true;
      t.panel_prefetch_min_rows = 1;
      break;
  }
  if (opts.panel_pair_min_rows) t.panel_pair_min_rows = *opts.panel_pair_min_rows;
  if (!opts.stream_out) t.stream_out_min_bytes = -1;
  return t;
}

}  // namespace tandem

// The engine's metrics in Prometheus text exposition format 0.0.4, for
// GET /metrics.
#pragma once

#include <string>

#include "engine/metrics.h"

namespace tandem::server {

// Histograms (cumulative _bucket{le=...}, _sum, _count), counters (_total) and
// gauges, each with # HELP and # TYPE lines, all named tandem_*.
std::string render_prometheus(const MetricsSnapshot& m);

}  // namespace tandem::server

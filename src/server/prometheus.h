// The engine's metrics in Prometheus text exposition format 0.0.4, for
// GET /metrics.
#pragma once

#include <cstdint>
#include <string>

#include "engine/metrics.h"

namespace tandem::server {

// What the vLLM-named families say beside the engine's metrics.
struct ServingInfo {
  std::string model_name;  // the model_name label, as vLLM sets it
  int32_t block_size = 16;
  std::string cache_dtype = "f16";  // kv_format_name: "q8_0", "k q8_0 / v f16", ...
};

// Histograms (cumulative _bucket{le=...}, _sum, _count), counters (_total) and
// gauges, each with # HELP and # TYPE lines, named tandem_*; then the gauges
// and counters that routers and the Gateway API Inference Extension's
// endpoint picker read under vLLM's names (vllm:num_requests_waiting,
// vllm:num_requests_running, vllm:kv_cache_usage_perc, vllm:cache_config_info,
// ...), with vLLM's meaning.
std::string render_prometheus(const MetricsSnapshot& m, const ServingInfo& info);

}  // namespace tandem::server

// Prometheus text rendering of the engine's metrics.
#include "server/prometheus.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>

namespace tandem::server {
namespace {

struct Parsed {
  std::map<std::string, std::string> types;  // family -> type
  std::map<std::string, double> samples;     // "name{labels}" -> value
  std::vector<std::string> order;            // sample keys in output order
};

// A strict reader of the 0.0.4 text format as render_prometheus writes it:
// HELP/TYPE comments, then "name[{le="..."}] value" lines; every sample
// belongs to a family declared before it.
Parsed parse(const std::string& text) {
  Parsed p;
  std::istringstream in(text);
  std::string line;
  const std::regex type_re(R"re(# TYPE ([a-zA-Z_:][a-zA-Z0-9_:]*) (counter|gauge|histogram))re");
  const std::regex help_re(R"re(# HELP ([a-zA-Z_:][a-zA-Z0-9_:]*) .+)re");
  const std::regex sample_re(R"re(([a-zA-Z_:][a-zA-Z0-9_:]*)(\{((?:[a-zA-Z_]+="(?:[^"\\]|\\.)*",?)+)\})? (\S+))re");
  std::string family;
  while (std::getline(in, line)) {
    std::smatch m;
    if (std::regex_match(line, m, type_re)) {
      EXPECT_EQ(p.types.count(m[1]), 0u) << "family declared twice: " << line;
      p.types[m[1]] = m[2];
      family = m[1];
    } else if (std::regex_match(line, m, help_re)) {
      continue;
    } else if (std::regex_match(line, m, sample_re)) {
      const std::string name = m[1];
      EXPECT_EQ(name.rfind(family, 0), 0u) << "sample outside its family: " << line;
      const std::string v = m[4];
      char* end = nullptr;
      const double d = v == "+Inf" ? INFINITY : std::strtod(v.c_str(), &end);
      if (v != "+Inf") {
        EXPECT_EQ(*end, '\0') << "bad value: " << line;
      }
      const std::string key = name + (m[2].matched ? m[2].str() : "");
      p.samples[key] = d;
      p.order.push_back(key);
    } else {
      ADD_FAILURE() << "unparseable line: '" << line << "'";
    }
  }
  return p;
}

const ServingInfo kInfo{"gemma-3-270m", 16};

MetricsSnapshot sample_metrics() {
  MetricsSnapshot m;
  m.running = 3;
  m.waiting = 2;
  m.swapped = 1;
  m.kv_blocks_used = 40;
  m.kv_blocks_free = 88;
  m.kv_blocks_cached = 8;
  m.kv_blocks_total = 128;
  m.requests_finished = 17;
  m.requests_cancelled = 2;
  m.requests_rejected = 5;
  m.prompt_tokens = 1234;
  m.generation_tokens = 5678;
  m.prefix_cache_queried_tokens = 1000;
  m.prefix_cache_hit_tokens = 250;
  m.preemptions = 4;
  m.phases[static_cast<size_t>(Phase::kDecode)] = {80, 640, 1.5};
  m.phases[static_cast<size_t>(Phase::kPrefill)] = {4, 512, 0.25};
  m.phases[static_cast<size_t>(Phase::kMixed)] = {15, 1200, 0.75};
  for (double v : {0.005, 0.02, 0.02, 0.7, 100.0}) m.ttft.observe(v);
  m.itl.observe(0.003);
  return m;
}

TEST(ServerPrometheus, EveryMetricWithItsType) {
  const Parsed p = parse(render_prometheus(sample_metrics(), kInfo));
  const std::map<std::string, std::string> want = {
      {"tandem_time_to_first_token_seconds", "histogram"},
      {"tandem_inter_token_latency_seconds", "histogram"},
      {"tandem_e2e_request_latency_seconds", "histogram"},
      {"tandem_prompt_tokens_total", "counter"},
      {"tandem_generation_tokens_total", "counter"},
      {"tandem_requests_finished_total", "counter"},
      {"tandem_preemptions_total", "counter"},
      {"tandem_prefix_cache_hit_tokens_total", "counter"},
      {"tandem_prefix_cache_queried_tokens_total", "counter"},
      {"tandem_requests_running", "gauge"},
      {"tandem_requests_waiting", "gauge"},
      {"tandem_requests_swapped", "gauge"},
      {"tandem_kv_blocks_used", "gauge"},
      {"tandem_kv_blocks_free", "gauge"},
      {"tandem_prefix_cache_hit_ratio", "gauge"},
  };
  for (const auto& [name, type] : want) {
    ASSERT_TRUE(p.types.count(name)) << name;
    EXPECT_EQ(p.types.at(name), type) << name;
  }
  EXPECT_EQ(p.samples.at("tandem_prompt_tokens_total"), 1234);
  EXPECT_EQ(p.samples.at("tandem_generation_tokens_total"), 5678);
  EXPECT_EQ(p.samples.at("tandem_requests_finished_total"), 17);
  EXPECT_EQ(p.samples.at("tandem_requests_cancelled_total"), 2);
  EXPECT_EQ(p.samples.at("tandem_preemptions_total"), 4);
  EXPECT_EQ(p.samples.at("tandem_requests_running"), 3);
  EXPECT_EQ(p.samples.at("tandem_requests_waiting"), 2);
  EXPECT_EQ(p.samples.at("tandem_requests_swapped"), 1);
  EXPECT_EQ(p.samples.at("tandem_kv_blocks_used"), 40);
  EXPECT_EQ(p.samples.at("tandem_kv_blocks_free"), 88);
  EXPECT_DOUBLE_EQ(p.samples.at("tandem_prefix_cache_hit_ratio"), 0.25);
  EXPECT_EQ(p.types.at("tandem_engine_phase_seconds_total"), "counter");
  EXPECT_EQ(p.samples.at("tandem_engine_steps_total"), 99);  // the phases' sum
  EXPECT_EQ(p.samples.at("tandem_engine_phase_steps_total{phase=\"decode\"}"), 80);
  EXPECT_EQ(p.samples.at("tandem_engine_phase_steps_total{phase=\"mixed\"}"), 15);
  EXPECT_EQ(p.samples.at("tandem_engine_phase_rows_total{phase=\"prefill\"}"), 512);
  EXPECT_DOUBLE_EQ(p.samples.at("tandem_engine_phase_seconds_total{phase=\"decode\"}"), 1.5);
  EXPECT_DOUBLE_EQ(p.samples.at("tandem_engine_phase_seconds_total{phase=\"mixed\"}"), 0.75);
}

TEST(ServerPrometheus, HistogramBucketsAreCumulative) {
  const Parsed p = parse(render_prometheus(sample_metrics(), kInfo));
  const std::string h = "tandem_time_to_first_token_seconds";
  // Observed 0.005, 0.02, 0.02, 0.7, 100 against bounds 0.01 0.025 0.05 0.1 0.25 0.5 1 2.5 5 10 30.
  EXPECT_EQ(p.samples.at(h + "_bucket{le=\"0.01\"}"), 1);
  EXPECT_EQ(p.samples.at(h + "_bucket{le=\"0.025\"}"), 3);
  EXPECT_EQ(p.samples.at(h + "_bucket{le=\"0.5\"}"), 3);
  EXPECT_EQ(p.samples.at(h + "_bucket{le=\"1\"}"), 4);
  EXPECT_EQ(p.samples.at(h + "_bucket{le=\"30\"}"), 4);
  EXPECT_EQ(p.samples.at(h + "_bucket{le=\"+Inf\"}"), 5);
  EXPECT_EQ(p.samples.at(h + "_count"), 5);
  EXPECT_NEAR(p.samples.at(h + "_sum"), 100.745, 1e-9);
  // Buckets ascend and never decrease, and +Inf comes last before _sum and _count.
  double prev_le = -1, prev_count = -1;
  std::vector<std::string> keys;
  for (const std::string& k : p.order)
    if (k.rfind(h + "_", 0) == 0) keys.push_back(k);
  ASSERT_EQ(keys.size(), 11u + 1 + 2);
  for (size_t i = 0; i < 12; ++i) {
    const size_t q = keys[i].find("le=\"");
    ASSERT_NE(q, std::string::npos) << keys[i];
    const std::string le = keys[i].substr(q + 4, keys[i].size() - q - 6);
    const double bound = le == "+Inf" ? INFINITY : std::stod(le);
    EXPECT_GT(bound, prev_le);
    EXPECT_GE(p.samples.at(keys[i]), prev_count);
    prev_le = bound;
    prev_count = p.samples.at(keys[i]);
  }
  EXPECT_EQ(keys[12], h + "_sum");
  EXPECT_EQ(keys[13], h + "_count");
}

TEST(ServerPrometheus, EmptyMetricsRender) {
  const Parsed p = parse(render_prometheus(MetricsSnapshot{}, kInfo));
  EXPECT_EQ(p.samples.at("tandem_prefix_cache_hit_ratio"), 0);
  EXPECT_EQ(p.samples.at("tandem_e2e_request_latency_seconds_bucket{le=\"+Inf\"}"), 0);
  EXPECT_EQ(p.samples.at("tandem_e2e_request_latency_seconds_count"), 0);
}

// The families the Gateway API Inference Extension's endpoint picker and
// vLLM dashboards read, with vLLM's names, labels and meaning.
TEST(ServerPrometheus, VllmFamilies) {
  MetricsSnapshot m = sample_metrics();
  const Parsed p = parse(render_prometheus(m, kInfo));
  const std::string model = "{model_name=\"gemma-3-270m\"}";
  EXPECT_EQ(p.types.at("vllm:num_requests_running"), "gauge");
  EXPECT_EQ(p.samples.at("vllm:num_requests_running" + model), 3);
  EXPECT_EQ(p.samples.at("vllm:num_requests_waiting" + model), 3);  // waiting 2 + swapped 1
  EXPECT_DOUBLE_EQ(p.samples.at("vllm:kv_cache_usage_perc" + model), 40.0 / 128);
  EXPECT_DOUBLE_EQ(p.samples.at("vllm:gpu_cache_usage_perc" + model), 40.0 / 128);
  EXPECT_EQ(p.samples.at("vllm:cache_config_info{block_size=\"16\",cache_dtype=\"f16\",enable_prefix_caching=\"True\",num_gpu_blocks=\"128\"}"),
            1);
  EXPECT_EQ(p.types.at("vllm:prefix_cache_hits_total"), "counter");
  EXPECT_EQ(p.samples.at("vllm:prefix_cache_queries_total" + model), 1000);
  EXPECT_EQ(p.samples.at("vllm:prefix_cache_hits_total" + model), 250);
  EXPECT_EQ(p.samples.at("vllm:num_preemptions_total" + model), 4);
  // A label value is escaped, whatever the model is called.
  const Parsed q = parse(render_prometheus(m, ServingInfo{"a\"b\\c\nd", 32}));
  EXPECT_EQ(q.samples.at("vllm:num_requests_running{model_name=\"a\\\"b\\\\c\\nd\"}"), 3);
}

}  // namespace
}  // namespace tandem::server

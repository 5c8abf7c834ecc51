#include "server/prometheus.h"

#include <cmath>

#include <fmt/format.h>

namespace tandem::server {
namespace {

// Prometheus reads Go-style floats: +Inf, -Inf, NaN; anything else as printed
// by fmt (shortest round-trip form).
std::string number(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  return fmt::format("{}", v);
}

void header(std::string& out, const char* name, const char* type, const char* help) {
  out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
}

void histogram(std::string& out, const char* name, const char* help, const Histogram& h) {
  header(out, name, "histogram", help);
  uint64_t cumulative = 0;
  for (size_t i = 0; i < h.bounds.size(); ++i) {
    cumulative += i < h.counts.size() ? h.counts[i] : 0;
    out += fmt::format("{}_bucket{{le=\"{}\"}} {}\n", name, number(h.bounds[i]), cumulative);
  }
  // The +Inf bucket is the total by definition, whatever the per-bucket counts say.
  out += fmt::format("{}_bucket{{le=\"+Inf\"}} {}\n", name, h.count);
  out += fmt::format("{}_sum {}\n", name, number(h.sum));
  out += fmt::format("{}_count {}\n", name, h.count);
}

template <typename T>
void single(std::string& out, const char* name, const char* type, const char* help, T value) {
  header(out, name, type, help);
  if constexpr (std::is_floating_point_v<T>) out += fmt::format("{} {}\n", name, number(value));
  else out += fmt::format("{} {}\n", name, value);
}

// One counter family with a sample per forward-step phase.
template <typename Get>
void per_phase(std::string& out, const char* name, const char* help, const MetricsSnapshot& m, Get get) {
  header(out, name, "counter", help);
  for (Phase p : {Phase::kDecode, Phase::kPrefill, Phase::kMixed})
    out += fmt::format("{}{{phase=\"{}\"}} {}\n", name, phase_name(p), get(m.phases[static_cast<size_t>(p)]));
}

// A label value with \\, \" and newlines escaped, as the text format asks.
std::string label_value(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\' || c == '"') out.push_back('\\');
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out.push_back(c);
  }
  return out;
}

// The families vLLM exposes that schedulers read, under vLLM's names.
void vllm_families(std::string& out, const MetricsSnapshot& m, const ServingInfo& info) {
  const std::string model = fmt::format("model_name=\"{}\"", label_value(info.model_name));
  const auto gauge = [&](const char* name, const char* help, auto value) {
    header(out, name, "gauge", help);
    out += fmt::format("{}{{{}}} {}\n", name, model, number(double(value)));
  };
  const auto counter = [&](const char* name, const char* help, uint64_t value) {
    header(out, name, "counter", help);
    out += fmt::format("{}{{{}}} {}\n", name, model, value);
  };
  gauge("vllm:num_requests_running", "Number of requests in model execution batches.", m.running);
  // Swapped-out sequences wait to run again, as vLLM's preempted requests do.
  gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", m.waiting + m.swapped);
  const double usage = m.kv_blocks_total ? double(m.kv_blocks_used) / double(m.kv_blocks_total) : 0.0;
  gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", usage);
  gauge("vllm:gpu_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage (the name before vLLM 0.10).",
        usage);
  header(out, "vllm:cache_config_info", "gauge", "Information of the KV cache configuration.");
  out += fmt::format(
      "vllm:cache_config_info{{block_size=\"{}\",cache_dtype=\"{}\",enable_prefix_caching=\"{}\",num_gpu_blocks=\"{}\"}} "
      "1\n",
      info.block_size, info.cache_dtype, m.prefix_caching ? "True" : "False", m.kv_blocks_total);
  counter("vllm:prefix_cache_queries_total", "Prefix cache queries, in terms of number of queried tokens.",
          m.prefix_cache_queried_tokens);
  counter("vllm:prefix_cache_hits_total", "Prefix cache hits, in terms of number of cached tokens.",
          m.prefix_cache_hit_tokens);
  counter("vllm:prompt_tokens_total", "Number of prefill tokens processed.", m.prompt_tokens);
  counter("vllm:generation_tokens_total", "Number of generation tokens processed.", m.generation_tokens);
  counter("vllm:num_preemptions_total", "Cumulative number of preemptions from the engine.", m.preemptions);
}

}  // namespace

std::string render_prometheus(const MetricsSnapshot& m, const ServingInfo& info) {
  std::string out;
  histogram(out, "tandem_time_to_first_token_seconds", "Time from request arrival to its first generated token.",
            m.ttft);
  histogram(out, "tandem_inter_token_latency_seconds", "Time between consecutive generated tokens of a request.",
            m.itl);
  histogram(out, "tandem_e2e_request_latency_seconds", "Time from request arrival to its end.", m.e2e);

  single(out, "tandem_prompt_tokens_total", "counter", "Prompt tokens of submitted requests.", m.prompt_tokens);
  single(out, "tandem_generation_tokens_total", "counter", "Generated tokens.", m.generation_tokens);
  single(out, "tandem_requests_finished_total", "counter", "Requests that ended (any reason).", m.requests_finished);
  single(out, "tandem_requests_cancelled_total", "counter", "Requests cancelled (client gone or shutdown).",
         m.requests_cancelled);
  single(out, "tandem_requests_rejected_total", "counter", "Requests refused because the wait queue was full.",
         m.requests_rejected);
  single(out, "tandem_preemptions_total", "counter", "Sequences preempted for lack of KV blocks.", m.preemptions);
  single(out, "tandem_swap_outs_total", "counter", "Preempted sequences whose K/V was swapped to host memory.",
         m.swap_outs);
  single(out, "tandem_spec_drafted_tokens_total", "counter", "Speculative decoding: tokens drafted.", m.spec_drafted);
  single(out, "tandem_spec_accepted_tokens_total", "counter", "Speculative decoding: drafted tokens kept.",
         m.spec_accepted);
  single(out, "tandem_spec_steps_total", "counter", "Speculative decoding: sequence-steps that verified drafts.",
         m.spec_steps);
  single(out, "tandem_spec_step_tokens_total", "counter",
         "Speculative decoding: tokens those sequence-steps gave (over tandem_spec_steps_total: tokens per step).",
         m.spec_step_tokens);
  single(out, "tandem_sparse_attention_blocks_read_total", "counter",
         "Sparse attention: KV blocks (per layer and KV head) its decode rows read.", m.sparse_blocks_read);
  single(out, "tandem_sparse_attention_blocks_held_total", "counter",
         "Sparse attention: KV blocks (per layer and KV head) those rows' sequences held (dense attention's reads).",
         m.sparse_blocks_held);
  single(out, "tandem_prefix_cache_hit_tokens_total", "counter", "Prompt tokens served from the prefix cache.",
         m.prefix_cache_hit_tokens);
  single(out, "tandem_prefix_cache_queried_tokens_total", "counter", "Prompt tokens looked up in the prefix cache.",
         m.prefix_cache_queried_tokens);
  single(out, "tandem_engine_steps_total", "counter", "Engine steps (batched forward passes).", m.steps());
  using PT = MetricsSnapshot::PhaseTotals;
  per_phase(out, "tandem_engine_phase_steps_total", "Engine steps by phase (decode-only, prefill-only, mixed).", m,
            [](const PT& t) { return t.steps; });
  per_phase(out, "tandem_engine_phase_seconds_total", "Wall time of the forward passes by phase.", m,
            [](const PT& t) { return number(t.seconds); });
  per_phase(out, "tandem_engine_phase_rows_total", "Token rows run by forward passes, by phase.", m,
            [](const PT& t) { return t.rows; });

  single(out, "tandem_requests_running", "gauge", "Sequences scheduled in the running batch.", m.running);
  single(out, "tandem_requests_waiting", "gauge", "Requests in the wait queue.", m.waiting);
  single(out, "tandem_requests_swapped", "gauge", "Sequences whose KV blocks are swapped to host memory.",
         m.swapped);
  single(out, "tandem_kv_blocks_used", "gauge", "KV blocks held by sequences.", m.kv_blocks_used);
  single(out, "tandem_kv_blocks_free", "gauge", "KV blocks held by no sequence (cached ones included).",
         m.kv_blocks_free);
  single(out, "tandem_kv_blocks_cached", "gauge",
         "Free KV blocks still holding a reusable prefix (part of the free count).", m.kv_blocks_cached);
  single(out, "tandem_kv_blocks_total", "gauge", "KV blocks in the pool.", m.kv_blocks_total);
  single(out, "tandem_kv_tokens_total", "gauge",
         "Token positions the KV pool holds with every layer's K/V (more while sliding-window layers give theirs back).",
         m.kv_tokens_total);
  single(out, "tandem_kv_blocks_published", "gauge",
         "KV blocks in the prefix cache (held or free): what the KV events announce.", m.kv_blocks_published);
  const double ratio = m.prefix_cache_queried_tokens
                           ? static_cast<double>(m.prefix_cache_hit_tokens) / m.prefix_cache_queried_tokens
                           : 0.0;
  single(out, "tandem_prefix_cache_hit_ratio", "gauge", "Prefix-cache hit tokens over queried tokens (0 when none).",
         ratio);
  if (m.kv_store) {  // --kv-store (engine/kv_store.h)
    const KvStoreStats& st = m.store;
    single(out, "tandem_kv_store_blocks_read_total", "counter", "KV blocks read from the KV store into the prefix cache.",
           st.blocks_read);
    single(out, "tandem_kv_store_bytes_read_total", "counter", "Bytes of KV blocks read from the KV store.",
           st.bytes_read);
    single(out, "tandem_kv_store_read_failures_total", "counter",
           "KV store files refused (corrupt, truncated, another model or format): recomputed instead.",
           st.read_failures);
    single(out, "tandem_kv_store_read_seconds_total", "counter",
           "Time spent reading, checking and loading KV store files.", number(st.read_seconds));
    single(out, "tandem_kv_store_blocks_written_total", "counter", "KV blocks written to the KV store.",
           st.blocks_written);
    single(out, "tandem_kv_store_bytes_written_total", "counter", "Bytes of KV block files written.",
           st.bytes_written);
    single(out, "tandem_kv_store_write_failures_total", "counter",
           "KV blocks not written (the OS refused, or the writer was too far behind).", st.write_failures);
    single(out, "tandem_kv_store_write_seconds_total", "counter", "Time the writer thread spent encoding and writing.",
           number(st.write_seconds));
    single(out, "tandem_kv_store_capture_seconds_total", "counter",
           "Time the engine's thread spent copying blocks out for the writer.", number(st.capture_seconds));
    single(out, "tandem_kv_store_blocks_evicted_total", "counter",
           "KV store files removed to keep it within --kv-store-size.", st.blocks_evicted);
    single(out, "tandem_kv_store_bytes", "gauge", "Bytes of KV store files, as this instance knows them.", st.bytes);
  }
  vllm_families(out, m, info);
  return out;
}

}  // namespace tandem::server

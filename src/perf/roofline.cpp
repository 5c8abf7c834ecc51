#include "perf/roofline.h"

#include <unistd.h>

#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "runtime/thread_pool.h"

namespace tandem {
namespace {

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

nlohmann::json peak_json(const PeakMeasure& p) { return {{"value", p.value}, {"isa", p.isa}}; }

template <typename T>
T field(const nlohmann::json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end()) fail(ErrorKind::kInvalidFile, "roofline: missing field \"{}\"", key);
  try {
    return it->get<T>();
  } catch (const nlohmann::json::exception&) {
    fail(ErrorKind::kInvalidFile, "roofline: field \"{}\" has the wrong type ({})", key, it->type_name());
  }
}

PeakMeasure peak_from_json(const nlohmann::json& j, const char* key) {
  const auto obj = field<nlohmann::json>(j, key);
  if (!obj.is_object()) fail(ErrorKind::kInvalidFile, "roofline: field \"{}\" is not an object", key);
  PeakMeasure p;
  p.value = field<double>(obj, "value");
  p.isa = field<std::string>(obj, "isa");
  if (!(p.value > 0)) fail(ErrorKind::kInvalidFile, "roofline: \"{}\".value must be positive, got {}", key, p.value);
  return p;
}

bool same_key(const nlohmann::json& e, const std::string& cpu, int threads, const std::string& level) {
  return e.is_object() && e.value("cpu", "") == cpu && e.value("threads", -1) == threads &&
         e.value("kernel_level", "") == level;
}

}  // namespace

Roofline measure_roofline(ThreadPool& pool, const RooflineSizes& sz, KernelLevel level) {
  Roofline r;
  r.cpu = cpu_model_name();
  r.threads = pool.size();
  r.kernel_level = kernel_level_name(level);
  r.source = "measured";
  r.measured_at = utc_now();
  r.read_bytes = sz.read_bytes;
  r.read_gb_s = measure_read_bandwidth(pool, sz.read_bytes, sz.read_passes, level);
  r.fp32_gop_s = measure_fp32_fma_peak(pool, sz.compute_iters, sz.compute_trials, level);
  r.int8_gop_s = measure_int8_dot_peak(pool, sz.compute_iters, sz.compute_trials, level);
  r.bf16_gop_s = measure_bf16_dot_peak(pool, sz.compute_iters, sz.compute_trials, level);
  return r;
}

nlohmann::json roofline_to_json(const Roofline& r) {
  return {{"cpu", r.cpu},
          {"threads", r.threads},
          {"kernel_level", r.kernel_level},
          {"source", r.source},
          {"measured_at", r.measured_at},
          {"read_bytes", r.read_bytes},
          {"read_gb_s", peak_json(r.read_gb_s)},
          {"fp32_gop_s", peak_json(r.fp32_gop_s)},
          {"int8_gop_s", peak_json(r.int8_gop_s)},
          {"bf16_gop_s", peak_json(r.bf16_gop_s)}};
}

Roofline roofline_from_json(const nlohmann::json& j) {
  if (!j.is_object()) fail(ErrorKind::kInvalidFile, "roofline: expected a JSON object, got {}", j.type_name());
  Roofline r;
  r.cpu = field<std::string>(j, "cpu");
  r.threads = field<int>(j, "threads");
  r.kernel_level = field<std::string>(j, "kernel_level");
  r.source = field<std::string>(j, "source");
  r.measured_at = field<std::string>(j, "measured_at");
  r.read_bytes = field<size_t>(j, "read_bytes");
  r.read_gb_s = peak_from_json(j, "read_gb_s");
  r.fp32_gop_s = peak_from_json(j, "fp32_gop_s");
  r.int8_gop_s = peak_from_json(j, "int8_gop_s");
  r.bf16_gop_s = peak_from_json(j, "bf16_gop_s");
  return r;
}

std::string cpu_model_name() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      const size_t colon = line.find(':');
      if (colon == std::string::npos) break;
      size_t b = line.find_first_not_of(" \t", colon + 1);
      return b == std::string::npos ? "" : line.substr(b);
    }
  }
  return "unknown";
}

std::optional<Roofline> load_cached_roofline(const std::string& path, const std::string& cpu, int threads,
                                             const std::string& kernel_level) {
  if (path.empty()) return std::nullopt;
  std::ifstream in(path);
  if (!in) return std::nullopt;
  // A cache is an optimization: a damaged one is the same as none.
  try {
    const nlohmann::json j = nlohmann::json::parse(in);
    if (!j.is_object() || !j.contains("entries") || !j["entries"].is_array()) return std::nullopt;
    for (const auto& e : j["entries"]) {
      if (!same_key(e, cpu, threads, kernel_level)) continue;
      Roofline r = roofline_from_json(e);
      r.source = "cached";
      return r;
    }
  } catch (const nlohmann::json::exception&) {
  } catch (const Error&) {
  }
  return std::nullopt;
}

void save_roofline(const std::string& path, const Roofline& r) {
  if (path.empty()) fail(ErrorKind::kIo, "roofline cache: no path (HOME is not set)");
  nlohmann::json entries = nlohmann::json::array();
  {
    std::ifstream in(path);
    if (in) {
      try {
        const nlohmann::json old = nlohmann::json::parse(in);
        if (old.is_object() && old.contains("entries") && old["entries"].is_array())
          for (const auto& e : old["entries"])
            if (!same_key(e, r.cpu, r.threads, r.kernel_level)) entries.push_back(e);
      } catch (const nlohmann::json::exception&) {
        // Overwrite a damaged cache.
      }
    }
  }
  nlohmann::json e = roofline_to_json(r);
  e["source"] = "measured";
  entries.push_back(e);
  std::error_code ec;
  const std::filesystem::path p(path);
  if (p.has_parent_path()) std::filesystem::create_directories(p.parent_path(), ec);
  // Write then rename, so a concurrent reader never sees half a file.
  const std::string tmp = path + ".tmp" + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::trunc);
    if (!out) fail(ErrorKind::kIo, "roofline cache: cannot write {}", tmp);
    out << nlohmann::json{{"entries", entries}}.dump(2) << "\n";
    if (!out) fail(ErrorKind::kIo, "roofline cache: cannot write {}", tmp);
  }
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::filesystem::remove(tmp, ec);
    fail(ErrorKind::kIo, "roofline cache: cannot rename to {}: {}", path, ec.message());
  }
}

Roofline roofline_for_bench(int threads, bool measure, const std::string& cache_path, std::string& warning) {
  const KernelLevel level = active_kernel_level();
  if (!measure) {
    if (auto cached = load_cached_roofline(cache_path, cpu_model_name(), threads, kernel_level_name(level)))
      return *cached;
  }
  ThreadPool pool(threads);
  Roofline r = measure_roofline(pool, measure ? RooflineSizes::full() : RooflineSizes::quick(), level);
  if (!measure) {
    r.source = "quick";
    return r;
  }
  try {
    save_roofline(cache_path, r);
  } catch (const Error& e) {
    warning += e.what();
  }
  return r;
}

}  // namespace tandem

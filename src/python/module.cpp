// The Python front end's native half (module tandem._core): one Engine, its
// requests submitted as a batch and stepped on the calling thread with the
// GIL released, their events handed back as plain tuples. The Python half
// (python/tandem/) turns those into vLLM-shaped objects.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nanobind/nanobind.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>

#include "core/error.h"
#include "engine/intake.h"
#include "engine/json_schema.h"
#include "engine/llm_engine.h"
#include "engine/speculation.h"
#include "kv/kv_cache.h"
#include "model/model.h"
#include "runtime/cpu_features.h"
#include "runtime/json_parse.h"
#include "runtime/options.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace tandem::python {
namespace {

// Keyword options of LLM(...) read from a dict; every key must be consumed,
// so a misspelt option is an error naming it rather than silently ignored.
class Options {
 public:
  explicit Options(nb::dict d) : d_(std::move(d)) {}

  template <typename T>
  std::optional<T> take(const char* key) {
    if (!d_.contains(key)) return std::nullopt;
    nb::object v = d_[key];
    nb::del(d_[key]);
    if (v.is_none()) return std::nullopt;
    try {
      return nb::cast<T>(v);
    } catch (const nb::cast_error&) {
      fail(ErrorKind::kInvalidArgument, "{}: {} is not a valid value", key,
           nb::cast<std::string>(nb::repr(v)));
    }
  }

  void check_all_used(const char* what) const {
    if (d_.size() == 0) return;
    std::string names;
    for (auto [k, v] : d_) names += (names.empty() ? "" : ", ") + nb::cast<std::string>(nb::str(k));
    fail(ErrorKind::kInvalidArgument, "unknown {}: {}", what, names);
  }

 private:
  nb::dict d_;
};

// The one place the Python engine options map onto the engine's and the
// runtime's (engine/llm_engine.h EngineConfig, runtime/options.h).
struct LoadConfig {
  EngineConfig engine;
  RuntimeOptions runtime;
  std::string draft_model;
};

LoadConfig load_config(nb::dict opts) {
  Options o(std::move(opts));
  LoadConfig c;
  EngineConfig& e = c.engine;
  // Offline batches: large prompt chunks, every prompt of a call admitted at once.
  e.policy = SchedulePolicy::kThroughput;
  e.max_seqs = 256;
  e.max_waiting = 1 << 20;
  if (auto v = o.take<int32_t>("threads")) e.threads = *v;
  if (auto v = o.take<int32_t>("max_model_len")) e.max_context = *v;
  if (auto v = o.take<int64_t>("kv_cache_tokens")) e.kv_tokens = *v;
  if (auto v = o.take<int64_t>("kv_cache_memory")) e.kv_bytes = *v;
  if (auto v = o.take<int32_t>("block_size")) e.block_size = *v;
  if (auto v = o.take<int32_t>("max_num_seqs")) e.max_seqs = *v;
  if (auto v = o.take<int32_t>("max_num_batched_tokens")) e.max_batch_tokens = *v;
  if (auto v = o.take<bool>("enable_prefix_caching")) e.prefix_caching = *v;
  if (auto v = o.take<double>("swap_space")) e.swap_bytes = static_cast<int64_t>(*v * (1ull << 30));
  if (auto v = o.take<std::string>("scheduling")) {
    if (*v != "throughput" && *v != "latency")
      fail(ErrorKind::kInvalidArgument, "scheduling: '{}' is neither 'throughput' nor 'latency'", *v);
    e.policy = *v == "latency" ? SchedulePolicy::kLatency : SchedulePolicy::kThroughput;
  }
  // KV cache element types: kv_cache_dtype for both, the llama.cpp names for each.
  const std::optional<std::string> both = o.take<std::string>("kv_cache_dtype");
  auto kv_type = [&](const char* key) {
    const std::optional<std::string> own = o.take<std::string>(key);
    try {
      return parse_kv_type(own ? *own : both.value_or("f16"));
    } catch (const Error& err) {
      fail(ErrorKind::kInvalidArgument, "{}: {}", own ? key : "kv_cache_dtype", err.what());
    }
  };
  e.kv_cache.k = kv_type("cache_type_k");
  e.kv_cache.v = kv_type("cache_type_v");
  if (auto v = o.take<std::string>("kv_rotation")) e.kv_cache.rotation = parse_kv_rotation(*v);
  if (auto v = o.take<bool>("kv_smoothing")) e.kv_cache.smooth_keys = *v;
  if (auto v = o.take<bool>("swa_full")) e.kv_cache.swa_full = *v;
  if (auto v = o.take<int32_t>("kv_window")) e.kv_cache.window = *v;
  if (auto v = o.take<int32_t>("kv_sinks")) e.kv_cache.sinks = *v;
  if (auto v = o.take<int32_t>("kv_heavy")) e.kv_cache.heavy = *v;
  if (auto v = o.take<std::string>("speculative")) e.spec.mode = parse_spec_mode(*v);
  if (auto v = o.take<int32_t>("num_speculative_tokens")) e.spec.max_draft = *v;
  if (auto v = o.take<bool>("speculative_adaptive")) e.spec.adaptive = *v;
  if (auto v = o.take<std::string>("draft_model")) c.draft_model = *v;
  if (auto v = o.take<std::string>("device")) e.device = *v;
  if (auto v = o.take<std::string>("kernels")) {
    std::string warning;
    c.runtime.kernels = choose_kernel_level(*v, best_kernel_level(), &warning);
    if (!warning.empty()) fail(ErrorKind::kInvalidArgument, "kernels: {}", warning);
  }
  if (auto v = o.take<std::string>("prepack")) c.runtime.prepack = parse_prepack_mode(*v);
  if (auto v = o.take<std::string>("repack_cache")) c.runtime.repack_cache = *v;
  if (auto v = o.take<bool>("huge_pages")) c.runtime.huge_pages = *v;
  if (auto v = o.take<int64_t>("memory_available")) {
    if (*v <= 0) fail(ErrorKind::kInvalidArgument, "memory_available: must be positive, got {}", *v);
    c.runtime.memory_available = e.memory_available = static_cast<uint64_t>(*v);
  }
  o.check_all_used("engine option");
  if (e.max_seqs <= 0) fail(ErrorKind::kInvalidArgument, "max_num_seqs: must be positive, got {}", e.max_seqs);
  if (e.device != "cpu") c.runtime.prepack = PrepackMode::kOff;  // a GPU reads the file's layout
  return c;
}

// One request's sampling parameters, from the dict SamplingParams builds.
RequestParams request_params(nb::dict d) {
  Options o(std::move(d));
  RequestParams p;
  SamplingParams& s = p.sampling;
  if (auto v = o.take<float>("temperature")) s.temperature = *v;
  if (auto v = o.take<int32_t>("top_k")) s.top_k = *v;
  if (auto v = o.take<float>("top_p")) s.top_p = *v;
  if (auto v = o.take<float>("min_p")) s.min_p = *v;
  if (auto v = o.take<float>("repetition_penalty")) s.repeat_penalty = *v;
  if (auto v = o.take<int32_t>("repeat_last_n")) s.repeat_last_n = *v;
  if (auto v = o.take<float>("frequency_penalty")) s.frequency_penalty = *v;
  if (auto v = o.take<float>("presence_penalty")) s.presence_penalty = *v;
  if (auto v = o.take<uint64_t>("seed")) s.seed = *v;
  if (auto v = o.take<std::vector<std::pair<int32_t, float>>>("logit_bias")) s.logit_bias = *v;
  if (auto v = o.take<int32_t>("max_tokens")) p.max_tokens = *v;
  if (auto v = o.take<std::vector<std::string>>("stop")) p.stop = *v;
  if (auto v = o.take<bool>("ignore_eos")) p.stop_at_eog = !*v;
  if (auto v = o.take<int32_t>("n")) p.n = *v;
  if (auto v = o.take<int32_t>("logprobs")) p.logprobs = *v;
  if (auto v = o.take<int32_t>("prompt_logprobs")) p.prompt_logprobs = *v;
  if (auto v = o.take<std::string>("json_schema"))
    p.json_schema = std::make_shared<const CompiledSchema>(compile_schema(parse_json(*v, {}, "json_schema")));
  o.check_all_used("sampling parameter");
  return p;
}

nb::str utf8(std::string_view s) {
  // The engine hands out whole characters; "replace" guards a model that
  // emits bytes that are not UTF-8 at all.
  PyObject* o = PyUnicode_DecodeUTF8(s.data(), static_cast<Py_ssize_t>(s.size()), "replace");
  if (!o) throw nb::python_error();
  return nb::steal<nb::str>(o);
}

nb::list logprob_list(const std::vector<TokenLogprob>& v) {
  nb::list out;
  for (const TokenLogprob& t : v) out.append(nb::make_tuple(t.token, t.logprob));
  return out;
}

nb::list top_list(const std::vector<std::vector<TokenLogprob>>& v) {
  nb::list out;
  for (const auto& row : v) out.append(logprob_list(row));
  return out;
}

nb::dict timings_dict(const RequestTimings& t) {
  nb::dict d;
  d["queued_s"] = t.queued_s;
  d["prefill_s"] = t.prefill_s;
  d["ttft_s"] = t.ttft_s;
  d["decode_s"] = t.decode_s;
  d["prompt_tokens"] = t.prompt_tokens;
  d["cached_tokens"] = t.cached_tokens;
  d["generated_tokens"] = t.generated_tokens;
  d["preemptions"] = t.preemptions;
  d["decode_steps"] = t.decode_steps;
  d["drafted"] = t.drafted;
  d["accepted"] = t.accepted;
  return d;
}

// A request's event, tagged with its place in the submitted list.
struct TaggedEvent {
  int32_t index;
  RequestEvent ev;
};

// What the sinks of one batch's requests fill (on the stepping thread).
struct RequestBatchState {
  std::mutex mu;
  std::deque<TaggedEvent> events;
};

class PyEngine;

// The requests of one generate / stream call.
class RequestBatch {
 public:
  RequestBatch(PyEngine* engine, std::shared_ptr<RequestBatchState> state, std::vector<uint64_t> ids, int32_t choices)
      : engine_(engine), state_(std::move(state)), ids_(std::move(ids)), open_choices_(choices) {}
  // Steps the engine until this batch has events, and returns them as tuples.
  nb::list poll();
  void cancel();
  bool done() const { return open_choices_ == 0; }

 private:
  PyEngine* engine_;
  std::shared_ptr<RequestBatchState> state_;
  std::vector<uint64_t> ids_;
  int32_t open_choices_;
};

class PyEngine {
 public:
  PyEngine(const std::string& path, nb::dict opts) {
    LoadConfig c = load_config(std::move(opts));
    nb::gil_scoped_release release;
    model_ = Model::load(path, c.runtime);
    if (!c.draft_model.empty()) draft_ = Model::load(c.draft_model, c.runtime);
    engine_ = std::make_unique<Engine>(*model_, c.engine, draft_.get());
  }

  const Intake& intake() const { return engine_->intake(); }

  std::unique_ptr<RequestBatch> submit(const std::vector<std::vector<int32_t>>& prompts, nb::list params) {
    if (static_cast<size_t>(nb::len(params)) != prompts.size())
      fail(ErrorKind::kInvalidArgument, "{} prompts but {} sampling parameter sets", prompts.size(),
           nb::len(params));
    std::vector<RequestParams> ps;
    for (size_t i = 0; i < prompts.size(); ++i) ps.push_back(request_params(nb::cast<nb::dict>(params[i])));
    auto state = std::make_shared<RequestBatchState>();
    std::vector<uint64_t> ids;
    int32_t choices = 0;
    nb::gil_scoped_release release;
    std::lock_guard lock(step_mu_);  // no step takes half of the batch
    for (size_t i = 0; i < prompts.size(); ++i) {
      EventSink sink = [state, index = static_cast<int32_t>(i)](const RequestEvent& ev) {
        std::lock_guard l(state->mu);
        state->events.push_back({index, ev});
      };
      try {
        ids.push_back(engine_->submit(prompts[i], ps[i], std::move(sink)));
      } catch (const Error& e) {
        for (uint64_t id : ids) engine_->cancel(id);
        // Step the cancellations through so that nothing of this batch stays.
        while (engine_->step()) {
        }
        throw Error(e.kind(), prompts.size() > 1 ? fmt::format("prompt {}: {}", i, e.what()) : e.what());
      }
      choices += std::max(1, ps[i].n);
    }
    return std::make_unique<RequestBatch>(this, std::move(state), std::move(ids), choices);
  }

  // One engine step under the step lock, the GIL released; false when idle.
  bool step() {
    nb::gil_scoped_release release;
    std::lock_guard lock(step_mu_);
    return engine_->step();
  }

  void cancel(uint64_t id) { engine_->cancel(id); }

  nb::dict metrics() {
    // The gauges are taken at each step's schedule, so a request that
    // finished in the last step still counts as running until the next one:
    // step once (nothing left: a step that only refreshes them) unless
    // another thread is stepping now.
    {
      nb::gil_scoped_release release;
      std::unique_lock lock(step_mu_, std::try_to_lock);
      if (lock.owns_lock()) engine_->step();
    }
    const MetricsSnapshot m = engine_->metrics();
    nb::dict d;
    d["running"] = m.running;
    d["waiting"] = m.waiting;
    d["requests_finished"] = m.requests_finished;
    d["requests_cancelled"] = m.requests_cancelled;
    d["prompt_tokens"] = m.prompt_tokens;
    d["generation_tokens"] = m.generation_tokens;
    d["kv_blocks_used"] = m.kv_blocks_used;
    d["kv_blocks_total"] = m.kv_blocks_total;
    d["kv_tokens_total"] = m.kv_tokens_total;
    d["steps"] = m.steps();
    d["spec_drafted"] = m.spec_drafted;
    d["spec_accepted"] = m.spec_accepted;
    return d;
  }

  int threads() const { return engine_->threads(); }
  std::string device() const { return engine_->device(); }
  size_t kv_bytes() const { return engine_->kv_bytes(); }
  std::string architecture() const { return model_->config().arch_name; }

 private:
  std::unique_ptr<Model> model_, draft_;
  std::unique_ptr<Engine> engine_;
  std::mutex step_mu_;
};

nb::list RequestBatch::poll() {
  nb::list out;
  for (;;) {
    std::deque<TaggedEvent> got;
    {
      std::lock_guard l(state_->mu);
      got.swap(state_->events);
    }
    for (TaggedEvent& t : got) {
      const RequestEvent& e = t.ev;
      if (e.finished) --open_choices_;
      out.append(nb::make_tuple(t.index, e.choice, utf8(e.text), nb::cast(e.tokens), logprob_list(e.logprobs),
                                top_list(e.top_logprobs), logprob_list(e.prompt_logprobs),
                                top_list(e.prompt_top_logprobs), e.finished, e.finish_reason,
                                e.finished ? nb::object(timings_dict(e.timings)) : nb::none(), e.error,
                                e.prompt_tokens, e.cached_prompt_tokens));
    }
    if (nb::len(out) > 0 || done()) return out;
    if (!engine_->step()) {
      // Idle with this batch unfinished: only another thread's step can have
      // taken its last events, which the next round collects.
      std::lock_guard l(state_->mu);
      if (state_->events.empty())
        fail(ErrorKind::kResource, "the engine went idle with {} of this batch's choices unfinished",
             open_choices_);
    }
  }
}

void RequestBatch::cancel() {
  for (uint64_t id : ids_) engine_->cancel(id);
}

[[noreturn]] void rethrow_as_python(const Error& e) {
  switch (e.kind()) {
    case ErrorKind::kInvalidArgument:
    case ErrorKind::kInvalidFile:
      throw nb::value_error(e.what());
    case ErrorKind::kIo:
      PyErr_SetString(PyExc_OSError, e.what());
      throw nb::python_error();
    case ErrorKind::kUnsupported:
      PyErr_SetString(PyExc_NotImplementedError, e.what());
      throw nb::python_error();
    default:
      throw std::runtime_error(e.what());
  }
}

}  // namespace
}  // namespace tandem::python

NB_MODULE(_core, m) {
  using namespace tandem;
  using namespace tandem::python;
  m.doc() = "Tandem's engine, for the tandem package (use tandem.LLM)";

  // tandem::Error becomes the Python exception its kind suggests, with the engine's message.
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const Error& e) {
      try {
        rethrow_as_python(e);
      } catch (nb::python_error& pe) {
        pe.restore();
      } catch (const nb::builtin_exception& be) {
        PyErr_SetString(be.type() == nb::exception_type::value_error ? PyExc_ValueError : PyExc_RuntimeError,
                        be.what());
      } catch (const std::exception& other) {
        PyErr_SetString(PyExc_RuntimeError, other.what());
      }
    }
  });

  nb::class_<RequestBatch>(m, "Batch")
      .def("poll", &RequestBatch::poll, "Steps the engine until this batch has events; returns them as tuples")
      .def("cancel", &RequestBatch::cancel, "Cancels every request of the batch (they finish at the next step)")
      .def_prop_ro("done", &RequestBatch::done);

  nb::class_<PyEngine>(m, "Engine")
      .def(nb::init<const std::string&, nb::dict>(), "model"_a, "options"_a)
      .def("submit", &PyEngine::submit, "prompts"_a, "params"_a, nb::keep_alive<0, 1>())
      .def("step", &PyEngine::step)
      .def("metrics", &PyEngine::metrics)
      .def("prompt_ids", [](const PyEngine& e, const std::string& text) { return e.intake().prompt(text); })
      .def("tokenize",
           [](const PyEngine& e, const std::string& text, bool add_special, bool parse_special) {
             return e.intake().tokenize(text, add_special, parse_special);
           },
           "text"_a, "add_special"_a = true, "parse_special"_a = false)
      .def("detokenize", [](const PyEngine& e, const std::vector<int32_t>& ids) {
             return utf8(e.intake().detokenize(ids));
           })
      .def("piece", [](const PyEngine& e, int32_t id) {
             if (id < 0 || id >= e.intake().n_vocab())
               fail(ErrorKind::kInvalidArgument, "token id {} is outside the vocabulary of {}", id,
                    e.intake().n_vocab());
             return utf8(e.intake().piece(id));
           })
      .def("chat_ids",
           [](const PyEngine& e, const std::vector<std::pair<std::string, std::string>>& messages,
              const std::string& system) {
             std::vector<ChatMessage> ms;
             for (const auto& [role, content] : messages) ms.push_back({role, content});
             ChatPrompt c = e.intake().chat(ms, system);
             return std::make_pair(std::move(c.tokens), std::move(c.stop));
           },
           "messages"_a, "system"_a = "")
      .def_prop_ro("has_chat", [](const PyEngine& e) { return e.intake().has_chat(); })
      .def_prop_ro("chat_error", [](const PyEngine& e) { return e.intake().chat_error(); })
      .def_prop_ro("max_model_len", [](const PyEngine& e) { return e.intake().max_context(); })
      .def_prop_ro("vocab_size", [](const PyEngine& e) { return e.intake().n_vocab(); })
      .def_prop_ro("model_name", [](const PyEngine& e) { return e.intake().model_name(); })
      .def_prop_ro("architecture", &PyEngine::architecture)
      .def_prop_ro("threads", &PyEngine::threads)
      .def_prop_ro("device", &PyEngine::device)
      .def_prop_ro("kv_cache_bytes", &PyEngine::kv_bytes);
}

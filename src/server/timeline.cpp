#include "server/timeline.h"

#include <algorithm>

#include <nlohmann/json.hpp>

namespace tandem::server {

namespace {
constexpr size_t kMaxQueued = 4096;  // steps a subscriber may fall behind by
}

struct Timeline::Sub {
  std::mutex mu;
  std::deque<std::string> q;
  Waker wake;
  bool gone = false;
};

std::string step_json(const StepReport& r) {
  nlohmann::json parts = nlohmann::json::array(), arrived = nlohmann::json::array(),
                 finished = nlohmann::json::array();
  for (const StepReport::Part& p : r.parts) parts.push_back({p.request, p.choice, p.prompt_rows, p.decode_rows});
  for (const auto& [id, t] : r.arrived) arrived.push_back({id, t});
  for (const auto& [id, why] : r.finished) finished.push_back({id, why});
  const nlohmann::json j = {{"step", r.step},       {"t0", r.start_s},       {"t1", r.end_s},
                            {"phase", phase_name(r.phase)}, {"rows", r.rows}, {"parts", parts},
                            {"arrived", arrived},   {"finished", finished}, {"preempted", r.preempted}};
  return j.dump();
}

void Timeline::publish(const StepReport& r) {
  std::vector<std::shared_ptr<Sub>> subs;
  {
    std::lock_guard<std::mutex> lock(mu_);
    subs_.erase(std::remove_if(subs_.begin(), subs_.end(),
                               [](const std::shared_ptr<Sub>& s) {
                                 std::lock_guard<std::mutex> l(s->mu);
                                 return s->gone;
                               }),
                subs_.end());
    if (subs_.empty()) return;
    subs = subs_;
  }
  const std::string line = "data: " + step_json(r) + "\n\n";
  for (const auto& s : subs) {
    {
      std::lock_guard<std::mutex> lock(s->mu);
      if (s->q.size() >= kMaxQueued) s->q.pop_front();
      s->q.push_back(line);
    }
    s->wake();
  }
}

size_t Timeline::watchers() const {
  std::lock_guard<std::mutex> lock(mu_);
  return subs_.size();
}

namespace {

class TimelineStream final : public AsyncResponse {
 public:
  TimelineStream(std::shared_ptr<Timeline::Sub> sub, std::vector<http::Header> headers, double heartbeat_s)
      : sub_(std::move(sub)), headers_(std::move(headers)), heartbeat_s_(heartbeat_s) {}
  ~TimelineStream() override { cancel(); }

  bool pump(ResponseWriter& w, double now_s) override {
    if (!started_) {
      started_ = true;
      headers_.push_back({"Cache-Control", "no-cache"});
      headers_.push_back({"X-Accel-Buffering", "no"});
      w.start_stream(200, "text/event-stream", headers_);
      w.write(": tandem timeline\n\n");
      last_ = now_s;
    }
    std::string out;
    bool ended;
    {
      std::lock_guard<std::mutex> lock(sub_->mu);
      while (!sub_->q.empty()) {
        out += sub_->q.front();
        sub_->q.pop_front();
      }
      ended = sub_->gone;
    }
    if (out.empty() && now_s - last_ >= heartbeat_s_) out = ": keep-alive\n\n";
    if (!out.empty()) {
      w.write(out);
      last_ = now_s;
    }
    if (ended) w.end();  // the server stops
    return ended;
  }

  void cancel() override {
    std::lock_guard<std::mutex> lock(sub_->mu);
    sub_->gone = true;
  }

 private:
  std::shared_ptr<Timeline::Sub> sub_;
  std::vector<http::Header> headers_;
  double heartbeat_s_;
  bool started_ = false;
  double last_ = 0;
};

}  // namespace

std::unique_ptr<AsyncResponse> Timeline::subscribe(const Waker& wake, std::vector<http::Header> headers,
                                                   double heartbeat_s) {
  auto sub = std::make_shared<Sub>();
  sub->wake = wake;
  {
    std::lock_guard<std::mutex> lock(mu_);
    subs_.push_back(sub);
  }
  return std::make_unique<TimelineStream>(std::move(sub), std::move(headers), heartbeat_s);
}

}  // namespace tandem::server

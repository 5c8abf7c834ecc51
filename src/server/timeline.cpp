#include "server/timeline.h"

#include <algorithm>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace tandem::server {

namespace {
// What one subscriber may hold, whatever it reads: steps queued for it (the
// lines themselves are shared by every subscriber), bytes written to its
// connection and not yet read, and the kernel's send buffer. A subscriber that falls further behind loses
// its oldest steps and is told how many; one that reads nothing for the
// server's write timeout is disconnected by the HTTP layer.
constexpr size_t kMaxQueuedBytes = size_t{256} << 10;
constexpr size_t kMaxUnread = size_t{64} << 10;
constexpr int kSendBuffer = 64 << 10;  // in the kernel (which doubles it), for a live view only
}  // namespace

struct Timeline::Sub {
  std::mutex mu;
  std::deque<std::shared_ptr<const std::string>> q;
  size_t queued_bytes = 0;
  uint64_t dropped = 0;  // steps lost since the last write
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
  const auto line = std::make_shared<const std::string>("data: " + step_json(r) + "\n\n");
  for (const auto& s : subs) {
    bool was_empty;
    {
      std::lock_guard<std::mutex> lock(s->mu);
      was_empty = s->q.empty();
      s->q.push_back(line);
      s->queued_bytes += line->size();
      while (s->queued_bytes > kMaxQueuedBytes && s->q.size() > 1) {
        s->queued_bytes -= s->q.front()->size();
        s->q.pop_front();
        ++s->dropped;
      }
    }
    // A queue left non-empty is one the connection has no room for: the
    // loop's tick retries it, so a stalled subscriber costs no wake-ups.
    if (was_empty) s->wake();
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
      w.limit_send_buffer(kSendBuffer);
      w.start_stream(200, "text/event-stream", headers_);
      w.write(": tandem timeline\n\n");
      last_ = now_s;
    }
    std::string out;
    bool ended;
    const bool room = w.unread() < kMaxUnread;
    {
      std::lock_guard<std::mutex> lock(sub_->mu);
      if (room && sub_->dropped > 0) {
        out = fmt::format(": {} steps dropped: this client reads too slowly\n\n", sub_->dropped);
        sub_->dropped = 0;
      }
      while (room && !sub_->q.empty() && out.size() < kMaxUnread) {
        out += *sub_->q.front();
        sub_->queued_bytes -= sub_->q.front()->size();
        sub_->q.pop_front();
      }
      ended = sub_->gone;
    }
    if (room && out.empty() && now_s - last_ >= heartbeat_s_) out = ": keep-alive\n\n";
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

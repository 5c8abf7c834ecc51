#include "server/kv_events.h"

#include <zmq.h>

#include <chrono>

#include "core/error.h"
#include "runtime/msgpack_writer.h"

namespace tandem::server {
namespace {

bool binds(const std::string& endpoint) {
  return endpoint.find('*') != std::string::npos || endpoint.find("::") != std::string::npos ||
         endpoint.rfind("ipc://", 0) == 0 || endpoint.rfind("inproc://", 0) == 0;
}

std::string be64(uint64_t v) {
  std::string out(8, '\0');
  for (int i = 7; i >= 0; --i, v >>= 8) out[size_t(i)] = char(v & 0xff);
  return out;
}

// A run of events that one wire event carries.
struct Run {
  KvCacheEvent::Kind kind;
  size_t first, n;
};

std::vector<Run> runs(const std::vector<KvCacheEvent>& ev) {
  std::vector<Run> out;
  for (size_t i = 0; i < ev.size(); ++i) {
    const KvCacheEvent& e = ev[i];
    if (!out.empty() && i > 0 && out.back().kind == e.kind) {
      const KvCacheEvent& prev = ev[i - 1];
      // Stored blocks join while each continues the previous one's prefix.
      const bool joins = e.kind == KvCacheEvent::Kind::kRemoved ||
                         (e.kind == KvCacheEvent::Kind::kStored && e.has_parent && e.parent == prev.hash);
      if (joins) {
        ++out.back().n;
        continue;
      }
    }
    out.push_back({e.kind, i, 1});
  }
  return out;
}

void send_frame(void* sock, const std::string& s, bool more) {
  // PUB and ROUTER never block: past the high-water mark a message is dropped.
  zmq_send(sock, s.data(), s.size(), more ? ZMQ_SNDMORE : 0);
}

}  // namespace

std::string encode_kv_event_batch(const std::vector<KvCacheEvent>& events, double ts, const KvEventsConfig& cfg) {
  MsgpackWriter w;
  using Layout = KvEventsConfig::Layout;
  bool named = cfg.layout == Layout::kMap;  // the batch's fields by name
  // A struct of n fields: a map of them, or an array of them (plus the tag).
  const auto open = [&](uint32_t n_fields, const char* type) {
    if (named) {
      w.map(n_fields + (type ? 1 : 0));
      if (type) {
        w.str("type");
        w.str(type);
      }
    } else {
      w.array(n_fields + (type ? 1 : 0));
      if (type) w.str(type);
    }
  };
  const auto field = [&](const char* name) {
    if (named) w.str(name);
  };
  open(3, nullptr);
  field("ts");
  w.float64(ts);
  field("events");
  const std::vector<Run> rs = runs(events);
  w.array(uint32_t(rs.size()));
  const bool batch_named = named;
  named = cfg.layout != Layout::kArray;  // each event's fields by name
  for (const Run& r : rs) {
    const KvCacheEvent& first = events[r.first];
    switch (r.kind) {
      case KvCacheEvent::Kind::kStored: {
        open(named ? 7 : 6, "BlockStored");
        field("block_hashes");
        w.array(uint32_t(r.n));
        for (size_t i = 0; i < r.n; ++i) w.uint(events[r.first + i].hash);
        field("parent_block_hash");
        if (first.has_parent) w.uint(first.parent);
        else w.nil();
        field("token_ids");
        w.array(uint32_t(r.n * size_t(cfg.block_size)));
        for (size_t i = 0; i < r.n; ++i)
          for (int32_t t : events[r.first + i].tokens) w.integer(t);
        field("block_size");
        w.integer(cfg.block_size);
        field("lora_id");
        w.nil();
        field("medium");
        w.str(cfg.medium);
        if (named) {
          field("lora_name");
          w.nil();
        }
        break;
      }
      case KvCacheEvent::Kind::kRemoved:
        open(2, "BlockRemoved");
        field("block_hashes");
        w.array(uint32_t(r.n));
        for (size_t i = 0; i < r.n; ++i) w.uint(events[r.first + i].hash);
        field("medium");
        w.str(cfg.medium);
        break;
      case KvCacheEvent::Kind::kCleared:
        open(0, "AllBlocksCleared");
        break;
    }
  }
  named = batch_named;
  field("data_parallel_rank");
  w.integer(0);
  return w.take();
}

KvEventPublisher::KvEventPublisher(KvEventsConfig cfg) : cfg_(std::move(cfg)) {
  ctx_ = zmq_ctx_new();
  if (!ctx_) fail(ErrorKind::kIo, "KV events: cannot create a ZeroMQ context: {}", zmq_strerror(zmq_errno()));
  const auto open = [this](int type, const std::string& endpoint, const char* flag, std::string& actual) {
    void* s = zmq_socket(ctx_, type);
    const int linger_ms = 1000, hwm = 100000;
    zmq_setsockopt(s, ZMQ_LINGER, &linger_ms, sizeof linger_ms);
    zmq_setsockopt(s, ZMQ_SNDHWM, &hwm, sizeof hwm);
    const int rc = type == ZMQ_ROUTER || binds(endpoint) ? zmq_bind(s, endpoint.c_str())
                                                         : zmq_connect(s, endpoint.c_str());
    if (rc != 0) {
      const std::string why = zmq_strerror(zmq_errno());
      zmq_close(s);
      if (pub_) zmq_close(pub_);
      zmq_ctx_term(ctx_);
      fail(ErrorKind::kIo, "{} {}: {}", flag, endpoint, why);
    }
    char buf[256] = {};
    size_t len = sizeof buf;
    actual = zmq_getsockopt(s, ZMQ_LAST_ENDPOINT, buf, &len) == 0 && buf[0] ? buf : endpoint;
    return s;
  };
  pub_ = open(ZMQ_PUB, cfg_.endpoint, "--kv-events", endpoint_);
  if (!cfg_.replay_endpoint.empty())
    replay_ = open(ZMQ_ROUTER, cfg_.replay_endpoint, "--kv-events-replay", replay_endpoint_);
  thread_ = std::thread([this] { run(); });
}

KvEventPublisher::~KvEventPublisher() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
  zmq_close(pub_);
  if (replay_) zmq_close(replay_);
  zmq_ctx_term(ctx_);  // waits up to the linger time for what is still queued
}

void KvEventPublisher::publish(const std::vector<KvCacheEvent>& events) {
  const double ts = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  std::string payload = encode_kv_event_batch(events, ts, cfg_);
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.emplace_back(next_seq_++, std::move(payload));
  }
  cv_.notify_one();
}

uint64_t KvEventPublisher::published() const {
  std::lock_guard<std::mutex> lock(mu_);
  return next_seq_;
}

void KvEventPublisher::run() {
  std::deque<std::pair<uint64_t, std::string>> batch;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      // With a replay socket, wake now and then to answer it.
      cv_.wait_for(lock, std::chrono::milliseconds(replay_ ? 20 : 500),
                   [this] { return stopping_ || !queue_.empty(); });
      if (stopping_ && queue_.empty()) return;
      batch.swap(queue_);
    }
    for (auto& [seq, payload] : batch) {
      send_frame(pub_, cfg_.topic, true);
      send_frame(pub_, be64(seq), true);
      send_frame(pub_, payload, false);
      if (replay_) {
        sent_.emplace_back(seq, std::move(payload));
        if (sent_.size() > size_t(cfg_.buffer_batches)) sent_.pop_front();
      }
    }
    batch.clear();
    if (replay_) serve_replay();
  }
}

void KvEventPublisher::serve_replay() {
  for (;;) {
    zmq_pollitem_t item{replay_, 0, ZMQ_POLLIN, 0};
    if (zmq_poll(&item, 1, 0) <= 0 || !(item.revents & ZMQ_POLLIN)) return;
    // [identity, "", start sequence (8 bytes big-endian)]
    std::vector<std::string> frames;
    int more = 1;
    while (more) {
      zmq_msg_t m;
      zmq_msg_init(&m);
      if (zmq_msg_recv(&m, replay_, 0) < 0) {
        zmq_msg_close(&m);
        return;
      }
      if (frames.size() < 4) frames.emplace_back(static_cast<const char*>(zmq_msg_data(&m)), zmq_msg_size(&m));
      more = zmq_msg_more(&m);
      zmq_msg_close(&m);
    }
    if (frames.size() != 3 || frames[2].size() != 8) continue;  // not a replay request
    uint64_t start = 0;
    for (unsigned char c : frames[2]) start = start << 8 | c;
    // Each reply [identity, "", topic, seq, payload] reaches the asking DEALER
    // as [.., seq, payload]: readers take the last two frames.
    const auto reply = [&](uint64_t seq, const std::string& payload) {
      send_frame(replay_, frames[0], true);
      send_frame(replay_, std::string(), true);
      send_frame(replay_, cfg_.topic, true);
      send_frame(replay_, be64(seq), true);
      send_frame(replay_, payload, false);
    };
    for (const auto& [seq, payload] : sent_)
      if (seq >= start) reply(seq, payload);
    reply(~uint64_t(0), std::string());  // sequence -1: the end
  }
}

}  // namespace tandem::server

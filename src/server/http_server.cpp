#include "server/http_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>
#include <unordered_map>

#include <fmt/format.h>

#include "core/error.h"

namespace tandem::server {

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

constexpr uint64_t kListenId = 0;
constexpr uint64_t kWakeId = 1;
constexpr double kTickS = 0.1;           // timers and async heartbeats
constexpr double kLingerS = 2.0;         // reading what a refused client still sends, before closing
constexpr size_t kLingerBytes = size_t{64} << 20;
constexpr size_t kReadChunk = 64 << 10;
constexpr size_t kReadPerEvent = 256 << 10;  // per connection and wake-up, so one client cannot hog the loop
// A body up to this size gets its buffer at once; a larger one once this much
// of it has arrived, so a head alone claims neither budget nor address space.
constexpr size_t kBodyStep = size_t{1} << 20;
// Connections over a cap that are answered 503 (and lingered on briefly so
// the answer is read) rather than reset; beyond, they are closed unanswered.
constexpr int kMaxRefusing = 32;

// Content-Encoding that leaves the body as it is: empty, or only `identity`
// codings (names are case-insensitive).
bool identity_coding(std::string_view v) {
  size_t i = 0;
  while (i <= v.size()) {
    const size_t comma = std::min(v.find(',', i), v.size());
    std::string_view item = v.substr(i, comma - i);
    while (!item.empty() && (item.front() == ' ' || item.front() == '\t')) item.remove_prefix(1);
    while (!item.empty() && (item.back() == ' ' || item.back() == '\t')) item.remove_suffix(1);
    if (!item.empty()) {
      if (item.size() != 8) return false;
      for (size_t k = 0; k < 8; ++k)
        if (static_cast<char>(std::tolower(static_cast<unsigned char>(item[k]))) != "identity"[k]) return false;
    }
    i = comma + 1;
  }
  return true;
}

}  // namespace

struct Waker::Channel {
  std::mutex mu;
  int fd = -1;  // the loop's eventfd; -1 once the server is gone
  std::vector<uint64_t> woken;
  struct Done {
    uint64_t conn;
    Reply reply;
    size_t reserved;  // body budget the request held
  };
  std::vector<Done> done;  // handlers finished on a worker

  void signal() {  // mu held
    const uint64_t one = 1;
    if (fd >= 0) [[maybe_unused]] ssize_t n = ::write(fd, &one, sizeof one);
  }
};

void Waker::operator()() const {
  if (!ch_) return;
  std::lock_guard<std::mutex> lock(ch_->mu);
  if (ch_->fd < 0) return;
  const bool first = ch_->woken.empty() && ch_->done.empty();
  ch_->woken.push_back(conn_);
  if (first) ch_->signal();
}

struct HttpServer::Impl {
  enum class St {
    kHead,     // waiting for (the rest of) a request head
    kBody,     // reading its body
    kRunning,  // the handler runs (on a worker)
    kAsync,    // an AsyncResponse is being pumped
    kClosing,  // writing the last response, then closing
    kLinger,   // written and shut down for writing: reading what the client still sends
  };

  struct Conn {
    uint64_t id = 0;
    int fd = -1;
    std::string ip;
    St st = St::kHead;
    std::string in;
    std::string out;
    size_t out_off = 0;
    http::RequestHead head;
    bool is_head_method = false;
    std::string body;
    std::unique_ptr<http::ChunkedDecoder> chunked;
    size_t reserved = 0;      // body budget held
    bool waiting_budget = false;
    double t_head = -1;       // first byte of the current head
    double t_body = 0;
    double t_in = 0;          // last time the client sent a byte
    double t_idle = 0;        // since the last response (keep-alive idle)
    double t_progress = 0;    // last time output moved
    double linger_until = 0;
    size_t lingered = 0;
    std::unique_ptr<AsyncResponse> async;
    bool streaming = false;       // the response is a stream (its unread bytes are capped)
    bool stream_chunked = false;  // the response body goes out in chunks
    bool response_done = false;   // set by the writer when the response is complete
    bool close_after = false;
    bool reading = true;      // EPOLLIN registered
    bool writing = false;     // EPOLLOUT registered
    bool peer_closed = false; // the client shut down its side: no more EPOLLIN/EPOLLRDHUP
    bool keep_alive = true;   // of the request being answered
    int minor = 1;            // its HTTP/1.<minor>
    bool stop_cancelled = false;
    bool refused = false;     // over a cap: answered 503 and closed, not counted per address
    bool probed = false;      // the client half-closed: an interim 100 tells a half-close from a hang-up
  };

  struct Job {
    uint64_t conn;
    HttpRequest req;
    size_t reserved;
  };

  class Writer final : public ResponseWriter {
   public:
    Writer(Impl& s, Conn& c) : s_(s), c_(c) {}
    void respond(HttpResponse r) override { s_.write_response(c_, std::move(r)); }
    void start_stream(int status, std::string content_type, std::vector<http::Header> headers) override {
      s_.start_stream(c_, status, content_type, headers);
    }
    void write(std::string_view bytes) override { s_.stream_write(c_, bytes); }
    void end() override { s_.stream_end(c_); }
    size_t unread() const override { return c_.out.size() - c_.out_off; }
    void limit_send_buffer(int bytes) override {
      setsockopt(c_.fd, SOL_SOCKET, SO_SNDBUF, &bytes, sizeof bytes);
    }

   private:
    Impl& s_;
    Conn& c_;
  };

  Impl(HttpHandler& h, HttpLimits l) : handler(h), lim(std::move(l)), ch(std::make_shared<Waker::Channel>()) {
    if (lim.body_budget_bytes == 0) lim.body_budget_bytes = lim.max_body_bytes;
    lim.body_budget_bytes = std::max(lim.body_budget_bytes, lim.max_body_bytes);
  }

  HttpHandler& handler;
  HttpLimits lim;
  std::shared_ptr<Waker::Channel> ch;
  int listen_fd = -1;
  int ep = -1;
  int bound_port = -1;
  bool accepting = true;
  std::unordered_map<uint64_t, std::unique_ptr<Conn>> conns;
  std::unordered_map<std::string, int> per_ip;
  uint64_t next_id = 2;
  int n_refusing = 0;
  size_t budget_used = 0;
  std::atomic<int> n_conns{0};
  std::atomic<size_t> n_body_bytes{0};

  std::atomic<bool> stopping{false};
  std::atomic<double> grace_s{5.0};
  double stop_deadline = -1;

  mutable std::mutex qmu;
  std::condition_variable qcv;
  std::deque<Job> queue;
  bool workers_stop = false;
  std::vector<std::thread> workers;

  // --- epoll interest --------------------------------------------------------

  void update_events(Conn& c) {
    epoll_event ev{};
    // A closed peer is reported on every wait while registered: drop it then.
    ev.events = (c.peer_closed ? 0u : EPOLLRDHUP | (c.reading ? EPOLLIN : 0u)) | (c.writing ? EPOLLOUT : 0u);
    ev.data.u64 = c.id;
    epoll_ctl(ep, EPOLL_CTL_MOD, c.fd, &ev);
  }
  void set_reading(Conn& c, bool on) {
    if (c.reading == on) return;
    c.reading = on;
    update_events(c);
  }

  // --- connections -------------------------------------------------------------

  void close_conn(Conn& c) {
    if (c.async) {
      c.async->cancel();
      c.async.reset();
    }
    release_budget(c.reserved);
    c.reserved = 0;
    epoll_ctl(ep, EPOLL_CTL_DEL, c.fd, nullptr);
    ::close(c.fd);
    if (c.refused) --n_refusing;
    else if (auto it = per_ip.find(c.ip); it != per_ip.end() && --it->second == 0) per_ip.erase(it);
    const uint64_t id = c.id;
    conns.erase(id);  // destroys c
    n_conns = static_cast<int>(conns.size());
  }

  void release_budget(size_t n) {
    budget_used -= std::min(budget_used, n);
    n_body_bytes = budget_used;
  }

  // A connection that has not sent a whole request can give way to a new one:
  // an idle one, a head in progress or a lingering one first (the oldest),
  // else one waiting for its body (the one that sent nothing for longest), so
  // heads that never send their bodies cannot lock anyone out.
  Conn* evictable(const std::string* ip) {
    Conn* best = nullptr;
    double best_t = 0;
    Conn* body = nullptr;
    double body_t = 0;
    for (auto& [id, cp] : conns) {
      Conn& c = *cp;
      if (ip && (c.ip != *ip || c.refused)) continue;
      if (c.st == St::kBody) {
        if (!body || c.t_in < body_t) {
          body = &c;
          body_t = c.t_in;
        }
        continue;
      }
      if (c.st != St::kHead && c.st != St::kLinger) continue;
      if (c.st == St::kHead && c.out_off < c.out.size()) continue;  // still writing a response
      const double t = c.st == St::kHead && c.t_head >= 0 ? c.t_head : c.t_idle;
      if (!best || t < best_t) {
        best = &c;
        best_t = t;
      }
    }
    return best ? best : body;
  }

  void accept_all(double now) {
    while (accepting) {
      sockaddr_storage addr{};
      socklen_t len = sizeof addr;
      const int fd = ::accept4(listen_fd, reinterpret_cast<sockaddr*>(&addr), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        if (errno == EMFILE || errno == ENFILE) {
          // Out of descriptors: make room, else stop accepting until the next tick.
          if (Conn* victim = evictable(nullptr)) {
            close_conn(*victim);
            continue;
          }
          pause_accepting();
        }
        return;
      }
      const std::string ip = peer_ip(addr);
      if (static_cast<int>(conns.size()) >= lim.max_connections) {
        if (Conn* victim = evictable(nullptr)) close_conn(*victim);
      }
      if (per_ip[ip] >= lim.max_connections_per_ip) {
        if (Conn* victim = evictable(&ip)) close_conn(*victim);
      }
      const bool full = static_cast<int>(conns.size()) >= lim.max_connections;
      if (full || per_ip[ip] >= lim.max_connections_per_ip) {
        if (per_ip[ip] == 0) per_ip.erase(ip);
        // Every slot holds a request in progress: say so while that is cheap.
        if (n_refusing < kMaxRefusing) refuse_connection(fd, ip, full, now);
        else ::close(fd);
        continue;
      }
      if (Conn* c = add_conn(fd, ip, now)) ++per_ip[c->ip];
    }
  }

  Conn* add_conn(int fd, const std::string& ip, double now) {
    const int yes = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &yes, sizeof yes);
    auto c = std::make_unique<Conn>();
    c->id = next_id++;
    c->fd = fd;
    c->ip = ip;
    c->t_idle = now;
    c->t_progress = now;
    c->t_in = now;
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLRDHUP;
    ev.data.u64 = c->id;
    if (epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) != 0) {
      ::close(fd);
      return nullptr;
    }
    Conn* raw = c.get();
    conns.emplace(c->id, std::move(c));
    n_conns = static_cast<int>(conns.size());
    return raw;
  }

  // A connection over a cap: 503 with Retry-After, then the usual linger
  // (reading what the client sent, so the answer is not lost to a reset).
  void refuse_connection(int fd, const std::string& ip, bool all, double now) {
    Conn* c = add_conn(fd, ip, now);
    if (!c) return;
    c->refused = true;
    ++n_refusing;
    c->keep_alive = false;
    HttpResponse r = handler.error(
        503, all ? fmt::format("the server holds {} connections, each answering a request; --max-conns allows no "
                               "more",
                               lim.max_connections)
                 : fmt::format("this address holds {} connections, each answering a request; --max-conns-per-ip "
                               "allows no more",
                               lim.max_connections_per_ip));
    r.headers.push_back({"Retry-After", "1"});
    refuse(*c, std::move(r), now);
  }

  void pause_accepting() {
    accepting = false;
    epoll_ctl(ep, EPOLL_CTL_DEL, listen_fd, nullptr);
  }
  void resume_accepting() {
    if (accepting || listen_fd < 0 || stopping) return;
    accepting = true;
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = kListenId;
    epoll_ctl(ep, EPOLL_CTL_ADD, listen_fd, &ev);
  }

  static std::string peer_ip(const sockaddr_storage& a) {
    char buf[INET6_ADDRSTRLEN] = {0};
    if (a.ss_family == AF_INET) {
      inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in&>(a).sin_addr, buf, sizeof buf);
    } else if (a.ss_family == AF_INET6) {
      const in6_addr& v6 = reinterpret_cast<const sockaddr_in6&>(a).sin6_addr;
      if (IN6_IS_ADDR_V4MAPPED(&v6)) inet_ntop(AF_INET, &v6.s6_addr[12], buf, sizeof buf);
      else inet_ntop(AF_INET6, &v6, buf, sizeof buf);
    }
    return buf;
  }

  // --- reading -----------------------------------------------------------------

  // Reads what the socket has; false when the connection was closed here.
  bool on_readable(Conn& c, double now) {
    char buf[kReadChunk];
    size_t total = 0;
    bool eof = false;
    while (total < kReadPerEvent) {
      const ssize_t n = ::recv(c.fd, buf, sizeof buf, 0);
      if (n > 0) {
        total += static_cast<size_t>(n);
        c.t_in = now;
        if (c.st == St::kLinger) {
          c.lingered += static_cast<size_t>(n);
          if (c.lingered > kLingerBytes) {
            close_conn(c);
            return false;
          }
          continue;
        }
        c.in.append(buf, static_cast<size_t>(n));
        if (c.st == St::kHead && c.t_head < 0) c.t_head = now;
        // Read ahead only so far while a request is being answered.
        if (c.st != St::kHead && c.st != St::kBody && c.in.size() > lim.max_pipelined_bytes) {
          set_reading(c, false);
          break;
        }
        if (c.st == St::kBody && c.waiting_budget) break;
        continue;
      }
      if (n == 0) {
        eof = true;
        break;
      }
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) break;
      close_conn(c);  // reset by the peer
      return false;
    }
    if (c.st == St::kHead || c.st == St::kBody) {
      if (!process(c, now)) return false;
    }
    if (eof) return on_hangup(c);
    return true;
  }

  // The client closed its side. A request in progress is abandoned (its
  // engine work cancelled: a worker's late reply finds no connection and is
  // cancelled then); a response already queued is still written.
  //
  // A whole request followed by the end of the client's sending may also be a
  // half-close (shutdown(SHUT_WR)) by a client still reading. An HTTP/1.1
  // client must take an interim 100 response: once it is sent, a client that
  // is gone answers with a reset (EPOLLERR, which cancels the request, one
  // round trip later), one that still reads gets its response.
  bool on_hangup(Conn& c) {
    if ((c.st == St::kRunning || c.st == St::kAsync) && c.minor >= 1 && !c.probed && !c.streaming &&
        !c.response_done && c.out_off >= c.out.size()) {
      c.probed = true;
      c.peer_closed = true;
      c.keep_alive = false;
      c.close_after = true;
      c.reading = false;
      c.in.clear();
      update_events(c);
      queue_out(c, "HTTP/1.1 100 Continue\r\n\r\n");
      return flush(c, now_s());
    }
    const bool idle = (c.st == St::kHead && c.in.empty()) || c.st == St::kClosing;
    if (!idle || c.out_off >= c.out.size()) {
      close_conn(c);
      return false;
    }
    c.peer_closed = true;
    c.close_after = true;
    c.st = St::kClosing;
    c.reading = false;
    update_events(c);
    return true;
  }

  // Parses and dispatches what `in` holds. False when the connection was closed.
  bool process(Conn& c, double now) {
    while (true) {
      if (c.st == St::kHead) {
        if (c.in.empty()) return true;
        if (c.t_head < 0) c.t_head = now;
        size_t used = 0;
        http::ParseError err;
        const http::Parse p = http::parse_head(c.in, lim.head, c.head, used, err);
        if (p == http::Parse::kIncomplete) return true;
        if (p == http::Parse::kError) return refuse(c, handler.error(err.status, err.message), now);
        c.in.erase(0, used);
        if (!start_request(c, now)) return false;
        continue;  // the next pipelined request, or the body
      }
      if (c.st == St::kBody) {
        if (!read_body(c, now)) return false;
        if (c.st == St::kBody) return true;
        continue;
      }
      return true;  // a request is being answered: the rest waits
    }
  }

  // A head has arrived: screen it, then read its body or dispatch it.
  bool start_request(Conn& c, double now) {
    http::RequestHead& h = c.head;
    c.is_head_method = h.method == "HEAD";
    c.keep_alive = h.keep_alive;
    c.minor = h.minor_version;
    const bool has_body = h.chunked || h.content_length > 0;
    if (const std::string* enc = h.find("content-encoding"); enc && !identity_coding(*enc))
      return refuse(c, handler.error(415, fmt::format("Content-Encoding '{}' is not accepted: send the body "
                                                      "uncompressed", enc->substr(0, 64))),
                    now);
    if (h.content_length > 0 && static_cast<uint64_t>(h.content_length) > lim.max_body_bytes)
      return refuse(c, body_too_large(), now);
    HttpRequest screen_req{h, {}, c.ip};
    if (std::optional<HttpResponse> r = handler.screen(screen_req)) {
      if (has_body) r->close = true;  // its body is never read: nothing after it can be trusted
      write_response(c, std::move(*r));
      return finish_response(c, now);
    }
    if (!has_body) return dispatch(c, now);
    c.st = St::kBody;
    c.t_body = now;
    c.body.clear();
    if (h.chunked) c.chunked = std::make_unique<http::ChunkedDecoder>(lim.max_body_bytes);
    begin_body(c);
    return true;
  }

  HttpResponse body_too_large() const {
    const size_t n = lim.max_body_bytes;
    const std::string size = n % (1 << 20) == 0 ? fmt::format("{} MiB", n >> 20)
                             : n % 1024 == 0    ? fmt::format("{} KiB", n >> 10)
                                                : fmt::format("{} bytes", n);
    return handler.error(413, "the request body is larger than " + size);
  }

  // Takes the body's share of the budget as its bytes arrive, never for what a
  // head merely declares (a head declaring 64 MiB and sending nothing holds
  // nothing). A declared length is taken whole once it is small or 1 MiB of
  // it has arrived: a body waiting for the budget holds 1 MiB at most, and
  // one holding all of its share can always finish.
  bool reserve(Conn& c) {
    size_t want = c.body.size() + c.in.size();
    if (c.chunked) {
      want = std::min(want, lim.max_body_bytes);
    } else {
      const size_t length = static_cast<size_t>(c.head.content_length);
      want = std::min(want, length);
      if (want > 0 && (length <= kBodyStep || want >= kBodyStep)) want = length;
    }
    if (want <= c.reserved) return true;
    const size_t more = want - c.reserved;
    if (budget_used + more > lim.body_budget_bytes) {
      c.waiting_budget = true;
      set_reading(c, false);
      return false;
    }
    budget_used += more;
    n_body_bytes = budget_used;
    c.reserved = want;
    if (c.waiting_budget) {
      c.waiting_budget = false;
      set_reading(c, true);
    }
    return true;
  }

  void begin_body(Conn& c) {
    if (c.head.expect_continue && c.in.empty()) queue_out(c, "HTTP/1.1 100 Continue\r\n\r\n");
  }

  bool read_body(Conn& c, double now) {
    if (!reserve(c)) return true;  // waits, unread, until the budget has room
    if (!c.chunked) {
      const size_t length = static_cast<size_t>(c.head.content_length);
      const size_t need = length - c.body.size();
      const size_t take = std::min(need, c.in.size());
      // Room for the whole body once it is small or has begun in earnest:
      // filled as it arrives, never copied to a larger buffer.
      if (take > 0 && c.body.capacity() < length && (length <= kBodyStep || c.body.size() + take >= kBodyStep))
        c.body.reserve(length);
      c.body.append(c.in, 0, take);
      c.in.erase(0, take);
      if (c.body.size() == static_cast<size_t>(c.head.content_length)) return dispatch(c, now);
      return true;
    }
    // A chunked body that grows past 1 MiB gets room for the largest allowed
    // at once: address space only, filled as it arrives, and never copied to
    // a larger buffer (which would briefly hold it twice).
    if (c.body.size() + c.in.size() > (size_t{1} << 20) && c.body.capacity() < lim.max_body_bytes)
      c.body.reserve(lim.max_body_bytes);
    size_t used = 0;
    http::ParseError err;
    const http::Parse p = c.chunked->feed(c.in, used, c.body, err);
    c.in.erase(0, used);
    if (p == http::Parse::kError)
      return refuse(c, err.status == 413 ? body_too_large() : handler.error(err.status, err.message), now);
    if (p == http::Parse::kDone) {
      c.chunked.reset();
      return dispatch(c, now);
    }
    return true;
  }

  // An error the HTTP layer answers itself; the connection closes after it
  // (what follows the bad request cannot be framed).
  bool refuse(Conn& c, HttpResponse r, double now) {
    r.close = true;
    c.in.clear();
    c.chunked.reset();
    c.body.clear();
    c.body.shrink_to_fit();
    write_response(c, std::move(r));
    return finish_response(c, now);
  }

  // --- handling ----------------------------------------------------------------

  // Hands a whole request to its handler. False when the connection closed.
  bool dispatch(Conn& c, double now) {
    c.st = St::kRunning;
    HttpRequest req{std::move(c.head), std::move(c.body), c.ip};
    c.body = std::string();
    const size_t reserved = c.reserved;
    c.reserved = 0;
    if (handler.runs_inline(req.head)) {
      Reply r = run_handler(req, Waker(ch, c.id));
      { HttpRequest gone = std::move(req); }  // the body's memory is free before the budget says so
      release_budget(reserved);
      return install(c, std::move(r), now);  // process() goes on with the next request
    }
    std::unique_lock<std::mutex> lock(qmu);
    if (queue.size() >= lim.max_queued) {
      lock.unlock();
      release_budget(reserved);
      HttpResponse busy = handler.error(503, "the server is busy: too many requests are waiting to be read");
      busy.headers.push_back({"Retry-After", "1"});
      return install(c, Reply{std::move(busy), nullptr}, now);
    }
    queue.push_back(Job{c.id, std::move(req), reserved});
    lock.unlock();
    qcv.notify_one();
    return true;
  }

  Reply run_handler(HttpRequest& req, const Waker& w) {
    try {
      return handler.handle(req, w);
    } catch (const std::exception& e) {
      return Reply{handler.error(500, e.what()), nullptr};
    } catch (...) {
      return Reply{handler.error(500, "internal error"), nullptr};
    }
  }

  void worker_loop() {
    while (true) {
      std::unique_lock<std::mutex> lock(qmu);
      qcv.wait(lock, [&] { return workers_stop || !queue.empty(); });
      if (workers_stop) return;
      Job job = std::move(queue.front());
      queue.pop_front();
      lock.unlock();
      Reply r = run_handler(job.req, Waker(ch, job.conn));
      job.req = HttpRequest{};  // free the body before reporting it freed
      std::lock_guard<std::mutex> g(ch->mu);
      const bool first = ch->woken.empty() && ch->done.empty();
      ch->done.push_back({job.conn, std::move(r), job.reserved});
      if (first) ch->signal();
    }
  }

  // Starts answering with a handler's reply. False when the connection closed.
  bool install(Conn& c, Reply r, double now) {
    if (!r.response && !r.async) r.response = handler.error(500, "the handler gave no response");
    if (r.response) {
      write_response(c, std::move(*r.response));
      return finish_response(c, now);
    }
    c.async = std::move(r.async);
    c.st = St::kAsync;
    if (stopping) {
      c.async->cancel();
      c.stop_cancelled = true;
    }
    return pump(c, now);
  }

  // Runs the connection's AsyncResponse; false when the connection closed.
  bool pump(Conn& c, double now) {
    if (!c.async) return true;
    Writer w(*this, c);
    bool done = false;
    try {
      done = c.async->pump(w, now) || c.response_done;
    } catch (const std::exception& e) {
      if (!c.response_done && c.out.size() == c.out_off && !c.stream_chunked)
        write_response(c, handler.error(500, e.what()));
      c.close_after = true;
      done = true;
    }
    if (!done) return flush(c, now);
    c.async.reset();
    return finish_response(c, now);
  }

  // --- writing -------------------------------------------------------------------

  void queue_out(Conn& c, std::string_view bytes) {
    if (c.out_off == c.out.size()) {
      c.out.clear();
      c.out_off = 0;
    }
    c.out.append(bytes);
  }

  std::string status_line(int status, const std::string& content_type) const {
    return fmt::format("HTTP/1.1 {} {}\r\nContent-Type: {}\r\n", status, http::reason_phrase(status), content_type);
  }

  void write_response(Conn& c, HttpResponse r) {
    if (r.close || !c.keep_alive || stopping) c.close_after = true;
    std::string h = status_line(r.status, r.content_type);
    h += fmt::format("Content-Length: {}\r\n", r.body.size());
    for (const http::Header& x : r.headers) h += x.name + ": " + x.value + "\r\n";
    h += c.close_after ? "Connection: close\r\n\r\n" : (c.minor == 0 ? "Connection: keep-alive\r\n\r\n" : "\r\n");
    queue_out(c, h);
    if (!c.is_head_method) queue_out(c, r.body);
    c.response_done = true;
  }

  void start_stream(Conn& c, int status, const std::string& content_type, const std::vector<http::Header>& headers) {
    c.streaming = true;
    std::string h = status_line(status, content_type);
    for (const http::Header& x : headers) h += x.name + ": " + x.value + "\r\n";
    if (c.minor == 1 && !c.is_head_method) {
      c.stream_chunked = true;
      h += "Transfer-Encoding: chunked\r\n";
      if (!c.keep_alive || stopping) c.close_after = true;
    } else {
      c.close_after = true;  // HTTP/1.0: the body ends with the connection
    }
    h += c.close_after ? "Connection: close\r\n\r\n" : "\r\n";
    queue_out(c, h);
  }

  void stream_write(Conn& c, std::string_view bytes) {
    if (bytes.empty() || c.is_head_method) return;
    if (c.stream_chunked) queue_out(c, fmt::format("{:x}\r\n", bytes.size()));
    queue_out(c, bytes);
    if (c.stream_chunked) queue_out(c, "\r\n");
  }

  void stream_end(Conn& c) {
    if (c.stream_chunked) queue_out(c, "0\r\n\r\n");
    c.stream_chunked = false;
    c.response_done = true;
  }

  // Writes what `out` holds; false when the connection closed.
  bool flush(Conn& c, double now) {
    while (c.out_off < c.out.size()) {
      const ssize_t n = ::send(c.fd, c.out.data() + c.out_off, c.out.size() - c.out_off, MSG_NOSIGNAL);
      if (n > 0) {
        c.out_off += static_cast<size_t>(n);
        c.t_progress = now;
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
      close_conn(c);  // the peer is gone
      return false;
    }
    if (c.out_off == c.out.size()) {
      c.out.clear();
      c.out_off = 0;
    } else if (c.out_off > (64 << 10) && c.out_off > c.out.size() / 2) {
      c.out.erase(0, c.out_off);  // a slow reader: drop what it has read
      c.out_off = 0;
    }
    const bool pending = c.out_off < c.out.size();
    if (pending && c.streaming && c.out.size() - c.out_off > lim.max_unread_output) {
      close_conn(c);  // a client that reads too little of its stream
      return false;
    }
    if (pending != c.writing) {
      c.writing = pending;
      update_events(c);
    }
    if (!pending && c.st == St::kClosing) {
      const bool gone = c.peer_closed;
      start_linger(c, now);
      if (gone) return false;
    }
    return true;
  }

  // After the last response: shut down writing and read (and drop) what the
  // client still sends for a moment, so our response is not lost to a reset
  // caused by unread data.
  void start_linger(Conn& c, double now) {
    if (c.peer_closed) {
      close_conn(c);
      return;
    }
    ::shutdown(c.fd, SHUT_WR);
    c.st = St::kLinger;
    c.linger_until = now + kLingerS;
    c.in.clear();
    c.in.shrink_to_fit();
    set_reading(c, true);
  }

  // The current response is complete: flush it and make ready for the
  // next request (which process() then parses). False when the connection closed.
  bool finish_response(Conn& c, double now) {
    c.response_done = false;
    c.streaming = false;
    c.stream_chunked = false;
    c.head = http::RequestHead{};
    c.is_head_method = false;
    c.t_head = -1;
    c.t_idle = now;
    if (c.close_after) {
      c.st = St::kClosing;
      c.in.clear();
      return flush(c, now);
    }
    c.st = St::kHead;
    if (!c.peer_closed) set_reading(c, true);
    return flush(c, now);
  }

  // --- timers ------------------------------------------------------------------

  void tick(double now) {
    if (!accepting && !stopping) resume_accepting();
    std::vector<uint64_t> ids;
    ids.reserve(conns.size());
    for (const auto& [id, c] : conns) ids.push_back(id);
    for (uint64_t id : ids) {
      auto it = conns.find(id);
      if (it == conns.end()) continue;
      Conn& c = *it->second;
      const bool unread_out = c.out_off < c.out.size();
      if (unread_out && now - c.t_progress > lim.write_timeout_s) {
        close_conn(c);
        continue;
      }
      switch (c.st) {
        case St::kHead:
          if (c.t_head >= 0 && now - c.t_head > lim.head_timeout_s) {
            refuse(c, handler.error(408, fmt::format("the request head did not arrive within {} s",
                                                     lim.head_timeout_s)),
                   now);
          } else if (c.t_head < 0 && !unread_out && now - c.t_idle > lim.idle_timeout_s) {
            close_conn(c);
          }
          break;
        case St::kBody:
          if (now - c.t_body > lim.body_timeout_s) {
            refuse(c, handler.error(408, fmt::format("the request body did not arrive within {} s",
                                                     lim.body_timeout_s)),
                   now);
          } else if (c.waiting_budget && read_body(c, now) && c.st != St::kBody) {
            process(c, now);
          }
          break;
        case St::kAsync:
          if (pump(c, now) && c.st == St::kHead) process(c, now);
          break;
        case St::kLinger:
          if (now > c.linger_until) close_conn(c);
          break;
        case St::kRunning:
        case St::kClosing:
          break;
      }
    }
  }

  // Waked connections and finished handlers.
  void drain_wakes(double now) {
    uint64_t counter = 0;
    [[maybe_unused]] ssize_t n = ::read(ch->fd, &counter, sizeof counter);
    std::vector<uint64_t> woken;
    std::vector<Waker::Channel::Done> done;
    {
      std::lock_guard<std::mutex> lock(ch->mu);
      woken.swap(ch->woken);
      done.swap(ch->done);
    }
    for (Waker::Channel::Done& d : done) {
      release_budget(d.reserved);
      auto it = conns.find(d.conn);
      if (it == conns.end() || it->second->st != St::kRunning) {
        if (d.reply.async) d.reply.async->cancel();  // the client left while it was being handled
        continue;
      }
      Conn& c = *it->second;
      if (install(c, std::move(d.reply), now) && c.st == St::kHead) process(c, now);
    }
    std::sort(woken.begin(), woken.end());
    woken.erase(std::unique(woken.begin(), woken.end()), woken.end());
    for (uint64_t id : woken) {
      auto it = conns.find(id);
      if (it == conns.end() || it->second->st != St::kAsync) continue;
      Conn& c = *it->second;
      if (pump(c, now) && c.st == St::kHead) process(c, now);
    }
  }

  void begin_stop(double now) {
    stop_deadline = now + grace_s.load();
    if (listen_fd >= 0) {
      if (accepting) epoll_ctl(ep, EPOLL_CTL_DEL, listen_fd, nullptr);
      ::close(listen_fd);
      listen_fd = -1;
      accepting = false;
    }
    std::vector<uint64_t> ids;
    for (const auto& [id, c] : conns) ids.push_back(id);
    for (uint64_t id : ids) {
      Conn& c = *conns.at(id);
      if (c.st == St::kAsync) {
        c.async->cancel();
        c.stop_cancelled = true;
        c.close_after = true;
      } else if (c.st != St::kRunning && c.st != St::kClosing) {
        close_conn(c);
      }
    }
  }

  bool busy_after_stop() const {
    for (const auto& [id, c] : conns)
      if (c->st == St::kAsync || c->st == St::kRunning || c->st == St::kClosing) return true;
    std::lock_guard<std::mutex> lock(qmu);
    return !queue.empty();
  }

  void run() {
    std::vector<epoll_event> events(256);
    double last_tick = now_s();
    bool stop_seen = false;
    while (true) {
      const int n = epoll_wait(ep, events.data(), static_cast<int>(events.size()), static_cast<int>(kTickS * 1000));
      if (n < 0 && errno != EINTR) fail(ErrorKind::kIo, "epoll_wait failed: {}", std::strerror(errno));
      const double now = now_s();
      bool woken = false;
      for (int i = 0; i < n; ++i) {
        const uint64_t id = events[i].data.u64;
        const uint32_t e = events[i].events;
        if (id == kListenId) {
          if (!stopping) accept_all(now);
          continue;
        }
        if (id == kWakeId) {
          woken = true;
          continue;
        }
        auto it = conns.find(id);
        if (it == conns.end()) continue;
        Conn& c = *it->second;
        if (e & (EPOLLERR | EPOLLHUP)) {
          if (c.st != St::kLinger && (e & EPOLLIN) && c.reading) {
            if (!on_readable(c, now)) continue;
          }
          close_conn(c);
          continue;
        }
        if (e & EPOLLOUT) {
          if (!flush(c, now)) continue;
        }
        if (e & (EPOLLIN | EPOLLRDHUP)) {
          if (c.reading || (e & EPOLLIN)) {
            if (!on_readable(c, now)) continue;
          } else if (e & EPOLLRDHUP) {
            on_hangup(c);
          }
        }
      }
      if (woken) drain_wakes(now);
      if (now - last_tick >= kTickS) {
        last_tick = now;
        tick(now);
      }
      if (stopping && !stop_seen) {
        stop_seen = true;
        begin_stop(now);
      }
      if (stop_seen && (!busy_after_stop() || now > stop_deadline)) break;
    }
  }
};

HttpServer::HttpServer(HttpHandler& handler, HttpLimits limits)
    : impl_(std::make_unique<Impl>(handler, std::move(limits))) {}

HttpServer::~HttpServer() {
  Impl& s = *impl_;
  {
    std::lock_guard<std::mutex> lock(s.qmu);
    s.workers_stop = true;
  }
  s.qcv.notify_all();
  for (std::thread& t : s.workers)
    if (t.joinable()) t.join();
  // Replies finished but never installed: cancel what they started.
  {
    std::lock_guard<std::mutex> lock(s.ch->mu);
    for (auto& d : s.ch->done)
      if (d.reply.async) d.reply.async->cancel();
    s.ch->done.clear();
    if (s.ch->fd >= 0) ::close(s.ch->fd);
    s.ch->fd = -1;
  }
  std::vector<uint64_t> ids;
  for (const auto& [id, c] : s.conns) ids.push_back(id);
  for (uint64_t id : ids) s.close_conn(*s.conns.at(id));
  if (s.listen_fd >= 0) ::close(s.listen_fd);
  if (s.ep >= 0) ::close(s.ep);
}

void HttpServer::bind(const std::string& host, int port) {
  Impl& s = *impl_;
  // As many connections as descriptors allow: raise the soft limit to the hard one.
  rlimit rl{};
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0) {
    if (rl.rlim_cur < rl.rlim_max) {
      rl.rlim_cur = rl.rlim_max;
      setrlimit(RLIMIT_NOFILE, &rl);
      getrlimit(RLIMIT_NOFILE, &rl);
    }
    const rlim_t room = rl.rlim_cur > 64 ? rl.rlim_cur - 64 : 1;  // model file, eventfd, epoll, logs
    s.lim.max_connections = static_cast<int>(std::min<rlim_t>(static_cast<rlim_t>(s.lim.max_connections), room));
  }

  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* res = nullptr;
  const std::string port_s = std::to_string(port);
  if (const int rc = getaddrinfo(host.c_str(), port_s.c_str(), &hints, &res); rc != 0)
    fail(ErrorKind::kIo, "cannot listen on {}:{}: {}", host, port, gai_strerror(rc));
  std::string why = "no address";
  for (addrinfo* a = res; a; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    // SO_REUSEADDR allows a quick restart over connections in TIME_WAIT; no
    // SO_REUSEPORT, which would let a second server share the port silently.
    const int yes = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
    if (::bind(fd, a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd, 1024) == 0) {
      s.listen_fd = fd;
      break;
    }
    why = std::strerror(errno);
    ::close(fd);
  }
  freeaddrinfo(res);
  if (s.listen_fd < 0) fail(ErrorKind::kIo, "cannot listen on {}:{} ({})", host, port, why);
  sockaddr_storage addr{};
  socklen_t len = sizeof addr;
  getsockname(s.listen_fd, reinterpret_cast<sockaddr*>(&addr), &len);
  s.bound_port = ntohs(addr.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6&>(addr).sin6_port
                                                  : reinterpret_cast<sockaddr_in&>(addr).sin_port);

  s.ep = epoll_create1(EPOLL_CLOEXEC);
  const int efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (s.ep < 0 || efd < 0) fail(ErrorKind::kIo, "cannot create the event loop: {}", std::strerror(errno));
  s.ch->fd = efd;
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = kListenId;
  epoll_ctl(s.ep, EPOLL_CTL_ADD, s.listen_fd, &ev);
  ev.data.u64 = kWakeId;
  epoll_ctl(s.ep, EPOLL_CTL_ADD, efd, &ev);
}

int HttpServer::port() const { return impl_->bound_port; }

void HttpServer::run() {
  Impl& s = *impl_;
  if (s.ep < 0) fail(ErrorKind::kIo, "HttpServer::run before bind");
  for (int i = 0; i < std::max(1, s.lim.workers); ++i) s.workers.emplace_back([&s] { s.worker_loop(); });
  s.run();
}

void HttpServer::stop(double grace_s) {
  Impl& s = *impl_;
  s.grace_s = grace_s;
  s.stopping = true;
  std::lock_guard<std::mutex> lock(s.ch->mu);
  s.ch->signal();
}

HttpServer::Stats HttpServer::stats() const { return {impl_->n_conns.load(), impl_->n_body_bytes.load()}; }

}  // namespace tandem::server

#include "server/kv_transport.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <list>
#include <mutex>
#include <thread>
#include <vector>

#include "core/error.h"

namespace tandem::server {
namespace {

constexpr char kMagic[4] = {'T', 'K', 'V', 'F'};
constexpr uint32_t kVersion = 1;
constexpr uint32_t kMaxIds = 65536;       // as kv_transfer_params allows
constexpr int kMaxConnections = 16;       // fetches answered at once; more are closed
constexpr double kServeIoTimeout = 10.0;  // a reader that stalls this long is dropped

using Clock = std::chrono::steady_clock;

double seconds_left(Clock::time_point deadline) {
  return std::chrono::duration<double>(deadline - Clock::now()).count();
}

// Waits for fd to be readable (or writable) before the deadline; false on timeout.
bool wait_fd(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    const double left = seconds_left(deadline);
    if (left <= 0) return false;
    pollfd p{fd, events, 0};
    const int rc = ::poll(&p, 1, static_cast<int>(std::min(left * 1000.0, 1000.0)) + 1);
    if (rc > 0) return true;
    if (rc < 0 && errno != EINTR) return true;  // let the read or write report it
  }
}

// Reads exactly n bytes; "" on success, else what went wrong.
std::string read_all(int fd, void* buf, size_t n, Clock::time_point deadline) {
  auto* p = static_cast<char*>(buf);
  while (n > 0) {
    if (!wait_fd(fd, POLLIN, deadline)) return "timed out";
    const ssize_t r = ::recv(fd, p, n, 0);
    if (r == 0) return "the connection was closed";
    if (r < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return std::strerror(errno);
    }
    p += r;
    n -= size_t(r);
  }
  return "";
}

std::string write_all(int fd, const void* buf, size_t n, Clock::time_point deadline) {
  const auto* p = static_cast<const char*>(buf);
  while (n > 0) {
    if (!wait_fd(fd, POLLOUT, deadline)) return "timed out";
    const ssize_t r = ::send(fd, p, n, MSG_NOSIGNAL);
    if (r < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return std::strerror(errno);
    }
    p += r;
    n -= size_t(r);
  }
  return "";
}

template <class T>
void put(std::string& out, T v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof v);
}

void set_nonblocking(int fd) { ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL, 0) | O_NONBLOCK); }

addrinfo* resolve(const std::string& host, int port, bool passive) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = passive ? AI_PASSIVE : 0;
  addrinfo* res = nullptr;
  const std::string port_s = std::to_string(port);
  if (const int rc = ::getaddrinfo(host.c_str(), port_s.c_str(), &hints, &res); rc != 0)
    fail(ErrorKind::kIo, "KV transfer: cannot resolve {}: {}", host, gai_strerror(rc));
  return res;
}

class TcpTransport final : public KvTransport {
 public:
  ~TcpTransport() override { stop(); }

  int listen(const std::string& host, int port, BlockSource source, Release release) override {
    source_ = std::move(source);
    release_ = std::move(release);
    addrinfo* res = resolve(host, port, true);
    std::string err = "no address";
    for (addrinfo* a = res; a; a = a->ai_next) {
      const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
      if (fd < 0) continue;
      const int one = 1;
      ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
      if (::bind(fd, a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd, 64) == 0) {
        listen_fd_ = fd;
        break;
      }
      err = std::strerror(errno);
      ::close(fd);
    }
    ::freeaddrinfo(res);
    if (listen_fd_ < 0) fail(ErrorKind::kIo, "KV transfer: cannot listen on {}:{}: {}", host, port, err);
    sockaddr_storage ss{};
    socklen_t len = sizeof ss;
    ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&ss), &len);
    const int bound = ss.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port)
                                               : ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
    accept_thread_ = std::thread([this] { accept_loop(); });
    return bound;
  }

  void stop() override {
    stopping_ = true;
    if (accept_thread_.joinable()) accept_thread_.join();
    std::list<Conn> conns;
    {
      std::lock_guard<std::mutex> lock(mu_);
      conns.swap(conns_);
    }
    for (Conn& c : conns) {
      ::shutdown(c.fd, SHUT_RDWR);
      if (c.thread.joinable()) c.thread.join();
      ::close(c.fd);
    }
    if (listen_fd_ >= 0) ::close(listen_fd_);
    listen_fd_ = -1;
  }

  void fetch(const std::string& host, int port, std::span<const uint64_t> ids, size_t skip, size_t max_block_bytes,
             double timeout_s, const Take& take) override {
    const Clock::time_point deadline =
        Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));
    const std::string peer = host + ":" + std::to_string(port);
    if (ids.size() > kMaxIds || skip > ids.size())
      fail(ErrorKind::kInvalidArgument, "KV transfer: {} block ids (skipping {}); at most {}", ids.size(), skip,
           kMaxIds);
    const int fd = connect_to(host, port, deadline, peer);
    struct Closer {
      int fd;
      ~Closer() { ::close(fd); }
    } closer{fd};
    std::string req(kMagic, 4);
    put(req, kVersion);
    put(req, static_cast<uint32_t>(ids.size()));
    put(req, static_cast<uint32_t>(skip));
    for (uint64_t id : ids) put(req, id);
    if (std::string e = write_all(fd, req.data(), req.size(), deadline); !e.empty())
      fail(ErrorKind::kIo, "KV transfer to {}: sending the request: {}", peer, e);
    std::unique_ptr<std::byte[]> buffer;
    uint64_t capacity = 0;
    for (size_t i = skip; i < ids.size(); ++i) {
      uint8_t status = 0;
      uint64_t len = 0;
      if (std::string e = read_all(fd, &status, 1, deadline); e.empty()) e = read_all(fd, &len, 8, deadline);
      else fail(ErrorKind::kIo, "KV transfer from {}: block {} of {}: {}", peer, i + 1, ids.size(), e);
      if (status != 0)
        fail(ErrorKind::kIo, "KV transfer from {}: block id {} is not held there (expired, or already fetched)", peer,
             ids[i]);
      if (len > max_block_bytes)
        fail(ErrorKind::kIo, "KV transfer from {}: block id {} is {} bytes; a block of this instance's is at most {}",
             peer, ids[i], len, max_block_bytes);
      // One buffer for the run, grown to the largest block and never
      // cleared: a fresh zeroed buffer per block costs the receiving core
      // page faults and a memset on top of the copy.
      if (len > capacity) {
        buffer = std::make_unique_for_overwrite<std::byte[]>(size_t(len));
        capacity = len;
      }
      if (std::string e = read_all(fd, buffer.get(), size_t(len), deadline); !e.empty())
        fail(ErrorKind::kIo, "KV transfer from {}: block {} of {}: {}", peer, i + 1, ids.size(), e);
      take(i, std::span<const std::byte>(buffer.get(), size_t(len)));
    }
  }

 private:
  struct Conn {
    int fd = -1;
    std::thread thread;
    std::atomic<bool> done{false};
  };

  static int connect_to(const std::string& host, int port, Clock::time_point deadline, const std::string& peer) {
    addrinfo* res = resolve(host, port, false);
    std::string err = "no address";
    int fd = -1;
    for (addrinfo* a = res; a && fd < 0; a = a->ai_next) {
      fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
      if (fd < 0) continue;
      set_nonblocking(fd);
      int rc = ::connect(fd, a->ai_addr, a->ai_addrlen);
      if (rc < 0 && errno == EINPROGRESS) {
        if (wait_fd(fd, POLLOUT, deadline)) {
          int so = 0;
          socklen_t sl = sizeof so;
          ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &so, &sl);
          rc = so == 0 ? 0 : -1;
          errno = so;
        } else {
          errno = ETIMEDOUT;
        }
      }
      if (rc == 0) break;
      err = std::strerror(errno);
      ::close(fd);
      fd = -1;
    }
    ::freeaddrinfo(res);
    if (fd < 0) fail(ErrorKind::kIo, "KV transfer: cannot connect to {}: {}", peer, err);
    const int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return fd;
  }

  void accept_loop() {
    while (!stopping_) {
      reap();
      pollfd p{listen_fd_, POLLIN, 0};
      if (::poll(&p, 1, 200) <= 0) continue;
      const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) continue;
      std::lock_guard<std::mutex> lock(mu_);
      if (static_cast<int>(conns_.size()) >= kMaxConnections) {
        ::close(fd);
        continue;
      }
      set_nonblocking(fd);
      Conn& c = conns_.emplace_back();
      c.fd = fd;
      c.thread = std::thread([this, &c] {
        serve(c.fd);
        c.done = true;
      });
    }
  }

  // Joins the connections that are done.
  void reap() {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = conns_.begin(); it != conns_.end();) {
      if (!it->done) {
        ++it;
        continue;
      }
      it->thread.join();
      ::close(it->fd);
      it = conns_.erase(it);
    }
  }

  void serve(int fd) {
    const Clock::time_point deadline =
        Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(kServeIoTimeout));
    char head[16];
    if (!read_all(fd, head, sizeof head, deadline).empty() || std::memcmp(head, kMagic, 4) != 0) return;
    uint32_t version = 0, n = 0, skip = 0;
    std::memcpy(&version, head + 4, 4);
    std::memcpy(&n, head + 8, 4);
    std::memcpy(&skip, head + 12, 4);
    if (version != kVersion || n > kMaxIds || skip > n) return;
    std::vector<uint64_t> ids(n);
    if (!read_all(fd, ids.data(), size_t(n) * 8, deadline).empty()) return;
    bool sent = true;
    for (uint32_t i = skip; i < n && sent && !stopping_; ++i) {
      const std::optional<std::string> block = source_(ids[i]);
      std::string frame;
      put(frame, static_cast<uint8_t>(block ? 0 : 1));
      put(frame, static_cast<uint64_t>(block ? block->size() : 0));
      // Each block gets the full timeout: a long run is slow, not stalled.
      const Clock::time_point d =
          Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(kServeIoTimeout));
      sent = write_all(fd, frame.data(), frame.size(), d).empty() &&
             (!block || write_all(fd, block->data(), block->size(), d).empty()) && block.has_value();
    }
    release_(ids, sent);
  }

  BlockSource source_;
  Release release_;
  int listen_fd_ = -1;
  std::atomic<bool> stopping_{false};
  std::thread accept_thread_;
  std::mutex mu_;
  std::list<Conn> conns_;
};

}  // namespace

std::unique_ptr<KvTransport> make_tcp_transport() { return std::make_unique<TcpTransport>(); }

}  // namespace tandem::server

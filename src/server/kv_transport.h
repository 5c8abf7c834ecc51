// How KV blocks travel between instances (prefill -> decode): one interface,
// so that an RDMA or shared-memory transport can stand beside TCP. A
// transport moves opaque encoded blocks by id; what they hold and whether
// they fit is server/kv_transfer's business.
//
// TCP (make_tcp_transport): the decode side connects to the prefill side's
// listener (`--kv-port`) and asks for a list of block ids, skipping the
// first `skip` (blocks its prefix cache already holds); the prefill side
// sends each of the rest as (status, length, bytes) and afterwards lets go
// of every id of the list, sent or skipped. Integers are little-endian.
// Nothing read from the wire is trusted: counts and lengths are bounded
// before anything is allocated, and every read and write has a deadline, so
// a peer that stops halfway fails the fetch instead of hanging it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>

namespace tandem::server {

class KvTransport {
 public:
  // An encoded block by id, or none (expired, never pinned).
  using BlockSource = std::function<std::optional<std::string>(uint64_t id)>;
  // After a fetch was answered (sent: every block went out) or broke off.
  using Release = std::function<void(std::span<const uint64_t> ids, bool sent)>;
  // One block as it arrives: its index in the id list and its bytes, valid
  // for the call only (one buffer serves every block of a fetch). It may
  // throw (a block that fails its checks): the fetch stops there.
  using Take = std::function<void(size_t index, std::span<const std::byte> block)>;

  virtual ~KvTransport() = default;
  // Starts answering fetches on host:port (0: any free port); returns the
  // bound port. Throws tandem::Error(kIo) when it cannot bind.
  virtual int listen(const std::string& host, int port, BlockSource source, Release release) = 0;
  // Stops listening and ends the connections being answered.
  virtual void stop() = 0;
  // Fetches ids[skip..] from host:port within timeout_s, each block at most
  // max_block_bytes; the far side releases all of `ids`. Throws
  // tandem::Error(kIo) naming the peer and what went wrong.
  virtual void fetch(const std::string& host, int port, std::span<const uint64_t> ids, size_t skip,
                     size_t max_block_bytes, double timeout_s, const Take& take) = 0;
};

std::unique_ptr<KvTransport> make_tcp_transport();

}  // namespace tandem::server

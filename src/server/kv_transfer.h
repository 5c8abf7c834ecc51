// Prefill and decode instances (`tandem serve --role`): the server's side of
// moving a prompt's KV blocks from the instance that computed them to the one
// that decodes (engine/kv_transfer.h has the engine's side, and
// server/kv_transport.h the wire).
//
// The prefill side pins each exported block under an id until it is fetched,
// its fetch fails, or `pin_s` passes, and names the ids in its response's
// kv_transfer_params. The decode side asks its prefix cache how many of the
// prompt's leading blocks it holds, fetches only the rest, and checks each
// block before use: its header names the model, the KV format, the block size
// and bytes and the block's place in the prompt, its tokens must be the
// prompt's, and a checksum covers it all. A block that fails any check fails
// the request with an error naming the difference; nothing unchecked reaches
// the cache.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <functional>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/kv_transfer.h"
#include "kv/block_format.h"
#include "server/kv_transport.h"
#include "server/openai_schema.h"

namespace tandem::server {

enum class Role { kBoth, kPrefill, kDecode };
const char* role_name(Role r);  // "both", "prefill", "decode"
Role parse_role(const std::string& name);  // throws kInvalidArgument naming the value

struct KvTransferConfig {
  Role role = Role::kBoth;
  std::string host = "127.0.0.1";  // the prefill side's listener, and what its responses name
  int port = 0;                    // --kv-port; 0: any free port
  double pin_s = 30;               // an exported block waits this long for its fetch
  double fetch_timeout_s = 30;     // a whole fetch, connect to last byte
  // While the instance decodes, a fetch spends at most this share of the
  // time on its core receiving blocks (--kv-fetch-share; 1: unpaced).
  double fetch_share = 0.1;
};

// Counters and gauges for /metrics (tandem_kv_transfer_*).
struct KvTransferStats {
  std::atomic<uint64_t> sent_blocks{0}, sent_bytes{0};
  std::atomic<uint64_t> received_blocks{0}, received_bytes{0};
  std::atomic<uint64_t> fetches{0}, failures{0}, expired_blocks{0};
  std::atomic<uint64_t> skipped_blocks{0};  // not fetched: the decode side's prefix cache held them
  std::atomic<uint64_t> fetch_us{0};        // time in fetches, connect to last block checked
  std::atomic<uint64_t> paced_us{0};        // of which waiting, so as not to slow decoding
  std::atomic<uint64_t> imported_blocks{0}, import_us{0};  // written into this instance's pool
  std::atomic<int64_t> pinned_blocks{0}, pinned_bytes{0};
};

// Block i of a run in the shared block format (kv/block_format.h), named by
// its content hash: `hashes` are prompt_block_hashes (kv/block_hash.h) of the
// run's tokens, which start at the prompt's first block.
std::string encode_block(const KvBlockLayout& layout, const KvBlockRun& run, std::span<const uint64_t> hashes,
                         int32_t i);
// Checks `bytes` against `layout` and the prompt (block `index` must hold the
// prompt's tokens there, under `hash`, its prompt_block_hashes entry), and
// appends the block to `run`. Throws kInvalidArgument with the format's message naming the first
// difference (model, KV type, block size, counts, checksum).
void decode_block(const KvBlockLayout& layout, std::span<const std::byte> bytes, int32_t index,
                  std::span<const int32_t> prompt, uint64_t hash, KvBlockRun& run);

class KvTransfer {
 public:
  KvTransfer(KvTransferConfig cfg, KvBlockLayout layout, std::unique_ptr<KvTransport> transport);
  ~KvTransfer();

  Role role() const { return cfg_.role; }
  // Prefill role: starts the listener; returns its port.
  int listen();
  int port() const { return port_; }
  const std::string& engine_id() const { return engine_id_; }
  const std::string& host() const { return cfg_.host; }

  // Prefill side (engine thread): pins a run's blocks; their ids, in order.
  std::vector<uint64_t> pin(KvBlockRun run);
  // Forgets the blocks pinned longer than pin_s.
  void expire();

  // Decode side: blocks [skip, ids.size()) of the prompt from where `t`
  // says, checked. Throws tandem::Error naming the peer and the problem.
  KvBlockRun fetch(const KvTransferParams& t, std::span<const int32_t> prompt, int32_t skip);
  // What the engine made of a fetched run (engine thread).
  void imported(const KvImportResult& r) {
    stats_.imported_blocks += static_cast<uint64_t>(r.loaded);
    stats_.import_us += static_cast<uint64_t>(r.seconds * 1e6);
  }
  // Whether the instance has sequences decoding (fetches are paced then).
  void set_decoding(std::function<bool()> decoding) { decoding_ = std::move(decoding); }

  const KvTransferStats& stats() const { return stats_; }
  // The tandem_kv_transfer_* families in Prometheus text format.
  std::string prometheus() const;

 private:
  struct PinnedRun {
    KvBlockRun run;
    std::vector<uint64_t> hashes;  // of its blocks, computed once when pinned
  };
  struct Pinned {
    std::shared_ptr<const PinnedRun> run;
    int32_t index = 0;  // in the run
    double since = 0;
  };
  std::optional<std::string> take_block(uint64_t id);
  void release(std::span<const uint64_t> ids);

  KvTransferConfig cfg_;
  KvBlockLayout layout_;
  std::unique_ptr<KvTransport> transport_;
  std::function<bool()> decoding_;
  std::string engine_id_;
  int port_ = 0;
  std::mutex mu_;
  uint64_t next_id_ = 1;
  std::unordered_map<uint64_t, Pinned> pinned_;
  KvTransferStats stats_;
};

}  // namespace tandem::server

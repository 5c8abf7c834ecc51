// KV events over ZeroMQ, as vLLM publishes them, for routers that send each
// request to the replica already caching its prefix (llm-d's precise prefix
// scorer, Dynamo's KV router, vllm-router's kv_aware policy).
//
// Wire format (vLLM's ZmqEventPublisher): each engine step that changed the
// prefix cache is one multipart message [topic, sequence number as 8 bytes
// big-endian, payload] on a PUB socket. The payload is MessagePack, laid out
// as one of vLLM's versions did (consumers read one of them):
//   array: the batch [ts, events, data_parallel_rank], each event an array
//     led by its type: ["BlockStored", block_hashes, parent_block_hash,
//     token_ids, block_size, lora_id, medium], ["BlockRemoved", block_hashes,
//     medium], ["AllBlocksCleared"] (llm-d's KV-cache indexer reads this);
//   array-map: the batch an array, each event a map of those fields by name
//     with its type under "type", BlockStored with lora_name too (vllm-router);
//   map: the batch a map too, {ts, events, data_parallel_rank} (vLLM's latest).
// With a replay endpoint, a ROUTER socket answers [identity, "", start
// sequence] with every buffered batch from there on as [identity, "", topic,
// sequence, payload], then one with sequence -1 and no payload.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "kv/block_manager.h"

namespace tandem::server {

struct KvEventsConfig {
  // "tcp://*:5557" binds; "tcp://host:5557" connects (vLLM's rule: bind
  // when the address holds '*' or '::', or is ipc:// or inproc://).
  std::string endpoint;
  std::string replay_endpoint;  // "": no replay socket
  std::string topic;            // first frame of every message
  std::string hash_seed;        // names the root of every prefix (kv/block_hash.h)
  std::string medium = "GPU";   // where the blocks live, as vLLM names its main KV pool
  enum class Layout { kArray, kArrayMap, kMap };
  Layout layout = Layout::kArrayMap;
  int32_t block_size = 16;
  int32_t buffer_batches = 10000;  // kept for replay
};

// One step's events as the payload vLLM sends; consecutive blocks of one
// prefix share a BlockStored, consecutive removals a BlockRemoved.
std::string encode_kv_event_batch(const std::vector<KvCacheEvent>& events, double ts, const KvEventsConfig& cfg);

class KvEventPublisher {
 public:
  // Opens the sockets; throws tandem::Error(kIo) naming an endpoint it cannot use.
  explicit KvEventPublisher(KvEventsConfig cfg);
  ~KvEventPublisher();  // sends what is queued (a second at most), then closes
  KvEventPublisher(const KvEventPublisher&) = delete;
  KvEventPublisher& operator=(const KvEventPublisher&) = delete;

  // Engine thread: encodes the batch and queues it for the sending thread.
  void publish(const std::vector<KvCacheEvent>& events);
  uint64_t published() const;  // batches queued so far (the next sequence number)
  // The addresses as bound or connected ("tcp://127.0.0.1:*" becomes the port chosen).
  const std::string& endpoint() const { return endpoint_; }
  const std::string& replay_endpoint() const { return replay_endpoint_; }

 private:
  void run();
  void serve_replay();

  KvEventsConfig cfg_;
  std::string endpoint_, replay_endpoint_;
  void* ctx_ = nullptr;
  void* pub_ = nullptr;
  void* replay_ = nullptr;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<uint64_t, std::string>> queue_;  // (sequence, payload) to send
  std::deque<std::pair<uint64_t, std::string>> sent_;   // for replay
  uint64_t next_seq_ = 0;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace tandem::server

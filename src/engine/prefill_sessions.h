// Progressive prefill sessions (RequestParams::session): what each session's
// last request left, so that the next request of the session resumes to the
// token. Its whole blocks stay ordinary cached blocks (the LRU may take them;
// a reference here does not pin them); its last, partly filled block is a
// private copy. A prefill also keeps the logits of its last position (a
// vocabulary of floats), so a request for the same tokens samples its first
// token from them at admission instead of recomputing that position in a step.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "kv/block_manager.h"

namespace tandem {

class Executor;
class StepLog;
struct Sequence;

class PrefillSessions {
 public:
  // At most max_sessions, each forgotten after ttl_s unused; `clock` tells the time.
  PrefillSessions(BlockManager& blocks, Executor& exec, const StepLog& clock, int32_t max_sessions, double ttl_s);

  // At admission, after the prefix cache's hits: copies the session's next,
  // partly shared block and commits what it shares with the prompt. A prompt
  // it holds whole, with the session's logits for it, is set aside for take_ready.
  void resume(Sequence& s);
  // The sequences resume() found whole since the last call: their first token
  // comes from Sequence::start_logits, without a step.
  std::vector<Sequence*> take_ready();
  // When a session's request ends: keeps its tokens' blocks, and `logits`
  // (after every token, when the request computed them) for the next one.
  void save(Sequence& s, std::shared_ptr<const std::vector<float>> logits);
  // Forgets the sessions unused for longer than the TTL (checked once a second).
  void expire();
  size_t size() const { return sessions_.size(); }
  // The pinned tail blocks, for BlockManager::check_invariants.
  void add_live(std::vector<BlockManager::LiveSeq>& live) const;

 private:
  struct Session {
    std::vector<int32_t> tokens;  // whose K/V was computed
    std::vector<BlockRef> whole;  // the published blocks of its whole blocks
    std::vector<std::vector<BlockRef>> whole_windowed;  // the same per windowed group
    SeqBlocks tail;               // one pinned block: the copy of the partly filled one
    std::shared_ptr<const std::vector<float>> logits;  // after `tokens`, when its request computed them
    double last_used = 0;
  };
  using Map = std::unordered_map<std::string, Session>;
  void drop(Map::iterator it);
  // The session's version of block h in every group (group 0, then the
  // windowed groups), or fewer when it no longer has one.
  std::vector<int32_t> block_copy(const Session& ss, int32_t h) const;

  BlockManager& blocks_;
  Executor& exec_;
  const StepLog& clock_;
  int32_t max_sessions_;
  double ttl_s_;
  Map sessions_;
  double checked_ = 0;
  std::vector<Sequence*> ready_;
};

}  // namespace tandem

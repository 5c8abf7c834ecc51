#include "engine/request_inbox.h"

#include <utility>

namespace tandem {

void RequestInbox::cancel(uint64_t request_id) {
  std::lock_guard<std::mutex> lock(mu_);
  cancels_.push_back(request_id);
  cv_.notify_all();
}

void RequestInbox::post(std::function<void()> task) {
  std::lock_guard<std::mutex> lock(mu_);
  tasks_.push_back(std::move(task));
  cv_.notify_all();
}

std::vector<std::function<void()>> RequestInbox::take_tasks() {
  std::lock_guard<std::mutex> lock(mu_);
  return std::exchange(tasks_, {});
}

void RequestInbox::take(std::vector<std::unique_ptr<Sequence>>& seqs, std::vector<uint64_t>& cancels) {
  std::lock_guard<std::mutex> lock(mu_);
  seqs.swap(seqs_);
  cancels.swap(cancels_);
}

void RequestInbox::wait(std::chrono::milliseconds timeout, const std::function<bool()>& wake) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, timeout, [&] { return !seqs_.empty() || !cancels_.empty() || !tasks_.empty() || wake(); });
}

}  // namespace tandem

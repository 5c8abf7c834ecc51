#include "model/executor.h"

#include <algorithm>
#include <vector>

#include "core/error.h"
#include "model/key_smoothing.h"

namespace tandem {
namespace {

class CpuExecutor final : public Executor {
 public:
  CpuExecutor(Model& m, const KvPlan& p, ThreadPool& pool)
      : m_(m), kv_(p.shape, p.n_blocks, p.block_size, p.format, p.paging), pool_(pool) {
    if (p.format.smooth_k) {
      // The offsets follow the context: greedy output with smoothed keys
      // may differ between two --ctx-size values, as between two roundings.
      const int32_t positions = p.max_positions > 0 ? p.max_positions : m.config().n_ctx_train;
      kv_.set_key_smoothing(key_smoothing(m, pool, positions > 0 ? positions : 4096));
    }
    if (!p.key_bounds.empty()) kv_.keep_key_bounds(p.key_bounds);
  }
  void forward(const Batch& batch, std::span<SeqKv* const> seqs, std::span<float> logits) override {
    m_.forward(batch, seqs, kv_, pool_, logits);
  }
  void copy_block(int32_t src, int32_t dst) override { kv_.copy_block(src, dst); }
  size_t block_bytes() const override { return kv_.block_bytes(); }
  void save_block(int32_t block, std::byte* out) override { kv_.save_block(block, out); }
  void load_block(int32_t block, const std::byte* in) override { kv_.load_block(block, in); }
  void copy_slots(int32_t src, int32_t dst, int32_t from, int32_t to) override { kv_.copy_slots(src, dst, from, to); }
  void read_keys(const SeqKv& seq, int32_t from, int32_t n, float* out) override {
    const int32_t w = kv_.shape().k_width, bs = kv_.block_size(), nl = kv_.shape().n_layer;
    for (int32_t p = from; p < from + n; ++p)
      for (int32_t l = 0; l < nl; ++l)
        kv_.read_key(l, seq.table(kv_.group(l))[p / bs], p % bs, out + (size_t(p - from) * nl + l) * w);
  }
  void write_keys(const SeqKv& seq, int32_t from, int32_t n, const float* keys, const int32_t* delta) override {
    const int32_t w = kv_.shape().k_width, bs = kv_.block_size(), nl = kv_.shape().n_layer;
    std::vector<float> k(size_t(n) * w);
    for (int32_t l = 0; l < nl; ++l) {
      for (int32_t i = 0; i < n; ++i) std::copy_n(keys + (size_t(i) * nl + l) * w, w, k.data() + size_t(i) * w);
      // Runs of one delta share their angles (the keys read together).
      for (int32_t i = 0, j; i < n; i = j) {
        for (j = i + 1; j < n && delta[j] == delta[i];) ++j;
        m_.rope_shift_keys(l, k.data() + size_t(i) * w, w, j - i, delta[i]);
      }
      for (int32_t p = from; p < from + n; ++p)
        kv_.write_key(l, seq.table(kv_.group(l))[p / bs], p % bs, k.data() + size_t(p - from) * w);
    }
  }
  size_t kv_bytes() const override { return kv_.bytes(); }
  std::string device() const override { return "cpu"; }

 private:
  Model& m_;
  KvCache kv_;
  ThreadPool& pool_;
};

}  // namespace

std::unique_ptr<Executor> make_cpu_executor(Model& model, const KvPlan& plan, ThreadPool& pool) {
  return std::make_unique<CpuExecutor>(model, plan, pool);
}

}  // namespace tandem

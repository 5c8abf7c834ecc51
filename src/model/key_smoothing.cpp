#include "model/key_smoothing.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <numbers>
#include <string_view>

#include "core/error.h"
#include "model/executor.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

namespace tandem {
namespace {

// Ordinary prose: the statistics it gives are the layers', not the text's
// (on Gemma 3 a mean taken on one license text centers another as well as
// that text's own mean does).
constexpr std::string_view kText =
    "The harbour town woke slowly. Fishing boats came in before dawn, their engines loud across the water, and by "
    "seven the market had filled with crates of mackerel, crab and cod. A baker on the corner sold bread to the dock "
    "workers; a schoolteacher walked her dog along the sea wall. In the library, a clerk sorted letters from 1921 "
    "into boxes numbered 1 to 40, writing each date in a ledger. \"We close at noon on Fridays,\" said the sign, "
    "though nobody remembered why. Later that afternoon the wind turned west, rain fell on the slate roofs, and the "
    "ferry to the island was cancelled until Tuesday.";

constexpr double kMostTurn = std::numbers::pi / 3;
// Energies are floored at this share of their head's mean, so that an
// element the model never uses gets a bounded scale.
constexpr double kEnergyFloor = 1e-3;

// Sums the model's squared queries while it lives (Model::set_query_energy).
class QueryEnergy {
 public:
  QueryEnergy(Model& model, std::vector<double>& sums) : model_(model) { model_.set_query_energy(&sums); }
  ~QueryEnergy() { model_.set_query_energy(nullptr); }
  QueryEnergy(const QueryEnergy&) = delete;
  QueryEnergy& operator=(const QueryEnergy&) = delete;

 private:
  Model& model_;
};

// One head's mean key (measured around position mean_pos) as an offset:
// the pairs RoPE turns by at most kMostTurn over max_positions, turned to
// the middle of the context; zero for the others.
void keep_slow_pairs(const RopeParams& rope, int32_t max_positions, double mean_pos, float* mu) {
  for (int32_t i = 0; i < rope.dims / 2; ++i) {
    const RopePair pair = rope_pair(rope, i);
    const float x = mu[pair.a], y = mu[pair.b];
    if (pair.radians_per_position * max_positions > kMostTurn) {
      mu[pair.a] = mu[pair.b] = 0.0f;
      continue;
    }
    const double t = pair.radians_per_position * (max_positions / 2.0 - mean_pos);
    mu[pair.a] = static_cast<float>(x * std::cos(t) - y * std::sin(t));
    mu[pair.b] = static_cast<float>(x * std::sin(t) + y * std::cos(t));
  }
}

// One head's scales from its mean squared queries and centered keys per
// element (both averaged over each RoPE pair here), to a geometric mean of
// 1: the quantizer does not care, the floats stay in their usual range.
void element_scales(const RopeParams& rope, int32_t head_dim, double* q, double* k, float* s) {
  for (int32_t i = 0; i < rope.dims / 2; ++i) {
    const RopePair pair = rope_pair(rope, i);
    q[pair.a] = q[pair.b] = (q[pair.a] + q[pair.b]) / 2;
    k[pair.a] = k[pair.b] = (k[pair.a] + k[pair.b]) / 2;
  }
  double q_avg = 0, k_avg = 0;
  for (int32_t i = 0; i < head_dim; ++i) q_avg += q[i] / head_dim, k_avg += k[i] / head_dim;
  double log_sum = 0;
  for (int32_t i = 0; i < head_dim; ++i) {
    const double ratio = (q[i] + kEnergyFloor * q_avg + 1e-30) / (k[i] + kEnergyFloor * k_avg + 1e-30);
    s[i] = static_cast<float>(std::pow(ratio, 0.25));
    log_sum += std::log(double(s[i]));
  }
  const double norm = std::exp(-log_sum / head_dim);
  for (int32_t i = 0; i < head_dim; ++i) s[i] = static_cast<float>(s[i] * norm);
}

}  // namespace

KeySmoothing key_smoothing(Model& model, ThreadPool& pool, int32_t max_positions) {
  const ModelConfig& c = model.config();
  const KvShape shape = model.kv_shape();
  const std::vector<int32_t> tokens = model.tokenizer().encode(kText, true, false);
  const int32_t n = static_cast<int32_t>(tokens.size());
  if (n < 2) fail(ErrorKind::kUnsupported, "key smoothing: the built-in text is {} token(s) for this tokenizer", n);
  // The paragraph through a runner of its own over a plain f32 cache.
  constexpr int32_t kBlock = 16;
  KvPlan plan;
  plan.shape = shape;
  plan.n_blocks = (n + kBlock - 1) / kBlock;
  plan.block_size = kBlock;
  plan.format = KvFormat{KvType::kF32, KvType::kF32};
  const std::unique_ptr<Executor> runner = make_cpu_executor(model, plan, pool);
  SeqKv seq;
  for (int32_t b = 0; b < plan.n_blocks; ++b) seq.blocks.push_back(b);
  const int32_t qw = c.n_head * c.head_dim;
  std::vector<double> q_energy(size_t(shape.n_layer) * qw, 0.0);
  {
    QueryEnergy measuring(model, q_energy);
    Batch batch(tokens.size());
    for (int32_t i = 0; i < n; ++i) batch[size_t(i)] = {tokens[size_t(i)], i, 0, i + 1 == n};
    Logits logits(size_t(c.n_vocab));
    SeqKv* one[] = {&seq};
    runner->forward(batch, one, std::span<float>(logits));
  }
  // Every key but position 0's, every layer, in the model's space.
  std::vector<float> all_keys(size_t(n - 1) * shape.n_layer * shape.k_width);
  runner->read_keys(seq, 1, n - 1, all_keys.data());

  const int32_t w = shape.k_width, head_dim = w / shape.n_head_kv, group = c.n_head / shape.n_head_kv;
  const size_t wn = static_cast<size_t>(w);
  KeySmoothing out{std::vector<float>(size_t(shape.n_layer) * wn), std::vector<float>(size_t(shape.n_layer) * wn)};
  // Position 0 is left out of the keys: its key is the attention sink's, far from the rest.
  std::vector<std::vector<float>> keys(static_cast<size_t>(n - 1), std::vector<float>(wn));
  std::vector<double> mean(wn), k_energy(wn), q_mean(wn);
  const double mean_pos = n / 2.0;
  for (int32_t l = 0; l < shape.n_layer; ++l) {
    for (int32_t p = 1; p < n; ++p)
      std::copy_n(all_keys.data() + (size_t(p - 1) * shape.n_layer + l) * wn, wn, keys[size_t(p - 1)].data());
    std::fill(mean.begin(), mean.end(), 0.0);
    for (const std::vector<float>& k : keys)
      for (size_t i = 0; i < wn; ++i) mean[i] += k[i];
    for (double& m : mean) m /= n - 1;
    const RopeParams rope = model.rope_params(l);
    float* mu = out.offset.data() + size_t(l) * wn;
    for (size_t i = 0; i < wn; ++i) mu[i] = static_cast<float>(mean[i]);
    for (int32_t h = 0; h < shape.n_head_kv; ++h)
      keep_slow_pairs(rope, max_positions, mean_pos, mu + size_t(h) * head_dim);
    // What is left of each key once the offset is taken off, and the
    // queries of each KV head's group, per element.
    std::fill(k_energy.begin(), k_energy.end(), 0.0);
    for (const std::vector<float>& k : keys)
      for (size_t i = 0; i < wn; ++i) k_energy[i] += (k[i] - mu[i]) * double(k[i] - mu[i]) / (n - 1);
    for (int32_t i = 0; i < w; ++i) {
      double e = 0;
      for (int32_t g = 0; g < group; ++g)
        e += q_energy[size_t(l) * qw + size_t((i / head_dim) * group + g) * head_dim + i % head_dim];
      q_mean[size_t(i)] = e / (double(group) * n);
    }
    for (int32_t h = 0; h < shape.n_head_kv; ++h) {
      const size_t at = size_t(h) * head_dim;
      element_scales(rope, head_dim, q_mean.data() + at, k_energy.data() + at, out.scale.data() + size_t(l) * wn + at);
    }
  }
  return out;
}

}  // namespace tandem

#include "model/key_smoothing.h"

#include <cmath>
#include <numbers>
#include <string_view>

#include "core/error.h"
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

}  // namespace

KeySmoothing key_smoothing(Model& model, ThreadPool& pool, int32_t max_positions) {
  const ModelConfig& c = model.config();
  const KvShape shape = model.kv_shape();
  const std::vector<int32_t> tokens = model.tokenizer().encode(kText, true, false);
  const int32_t n = static_cast<int32_t>(tokens.size());
  if (n < 2) fail(ErrorKind::kUnsupported, "key smoothing: the built-in text is {} token(s) for this tokenizer", n);
  constexpr int32_t kBlock = 16;
  KvCache kv(shape, (n + kBlock - 1) / kBlock, kBlock, KvFormat{KvType::kF32, KvType::kF32});
  SeqKv seq;
  if (!seq.reserve(kv, n)) fail(ErrorKind::kResource, "key smoothing: a cache for {} tokens", n);
  const int32_t qw = c.n_head * c.head_dim;
  std::vector<double> q_energy(size_t(shape.n_layer) * qw, 0.0);
  Logits logits;
  model.set_query_energy(&q_energy);
  try {
    model.prefill(seq, tokens, kv, pool, logits);
  } catch (...) {
    model.set_query_energy(nullptr);
    throw;
  }
  model.set_query_energy(nullptr);

  const int32_t w = shape.k_width, head_dim = w / shape.n_head_kv, group = c.n_head / shape.n_head_kv;
  KeySmoothing out{std::vector<float>(size_t(shape.n_layer) * w), std::vector<float>(size_t(shape.n_layer) * w)};
  std::vector<std::vector<float>> keys(static_cast<size_t>(n), std::vector<float>(static_cast<size_t>(w)));
  const size_t wn = static_cast<size_t>(w);
  std::vector<double> mean(wn), k_energy(wn), q_mean(wn);
  // Position 0 is left out of the keys: its key is the attention sink's, far from the rest.
  const double mean_pos = n / 2.0;
  for (int32_t l = 0; l < shape.n_layer; ++l) {
    for (int32_t p = 1; p < n; ++p) kv.read_key(l, seq.blocks[size_t(p / kBlock)], p % kBlock, keys[size_t(p)].data());
    std::fill(mean.begin(), mean.end(), 0.0);
    for (int32_t p = 1; p < n; ++p)
      for (int32_t i = 0; i < w; ++i) mean[size_t(i)] += keys[size_t(p)][size_t(i)];
    for (double& m : mean) m /= n - 1;
    // The queries of each KV head's group, per element.
    for (int32_t i = 0; i < w; ++i) {
      double e = 0;
      for (int32_t g = 0; g < group; ++g)
        e += q_energy[size_t(l) * qw + size_t((i / head_dim) * group + g) * head_dim + i % head_dim];
      q_mean[size_t(i)] = e / (double(group) * n);
    }
    const RopeParams rope = model.rope_params(l);
    float* mu = out.offset.data() + size_t(l) * w;
    for (int32_t i = 0; i < w; ++i) mu[i] = static_cast<float>(mean[size_t(i)]);
    for (int32_t h = 0; h < shape.n_head_kv; ++h) {
      float* mh = mu + size_t(h) * head_dim;
      for (int32_t i = 0; i < rope.dims / 2; ++i) {
        const RopePair pair = rope_pair(rope, i);
        const float x = mh[pair.a], y = mh[pair.b];
        if (pair.radians_per_position * max_positions > kMostTurn) {
          mh[pair.a] = mh[pair.b] = 0.0f;
          continue;
        }
        const double t = pair.radians_per_position * (max_positions / 2.0 - mean_pos);
        mh[pair.a] = static_cast<float>(x * std::cos(t) - y * std::sin(t));
        mh[pair.b] = static_cast<float>(x * std::sin(t) + y * std::cos(t));
      }
    }
    // What is left of each key once the offset is taken off.
    std::fill(k_energy.begin(), k_energy.end(), 0.0);
    for (int32_t p = 1; p < n; ++p)
      for (int32_t i = 0; i < w; ++i) {
        const double r = keys[size_t(p)][size_t(i)] - mu[i];
        k_energy[size_t(i)] += r * r / (n - 1);
      }
    float* s = out.scale.data() + size_t(l) * w;
    for (int32_t h = 0; h < shape.n_head_kv; ++h) {
      const size_t at = size_t(h) * head_dim;
      auto pair_average = [&](std::vector<double>& e) {
        for (int32_t i = 0; i < rope.dims / 2; ++i) {
          const RopePair pair = rope_pair(rope, i);
          const double avg = (e[at + pair.a] + e[at + pair.b]) / 2;
          e[at + pair.a] = e[at + pair.b] = avg;
        }
      };
      pair_average(k_energy);
      pair_average(q_mean);
      double k_avg = 0, q_avg = 0;
      for (int32_t i = 0; i < head_dim; ++i) k_avg += k_energy[at + i] / head_dim, q_avg += q_mean[at + i] / head_dim;
      double log_sum = 0;
      for (int32_t i = 0; i < head_dim; ++i) {
        const double ratio = (q_mean[at + i] + kEnergyFloor * q_avg + 1e-30) /
                             (k_energy[at + i] + kEnergyFloor * k_avg + 1e-30);
        s[at + i] = static_cast<float>(std::pow(ratio, 0.25));
        log_sum += std::log(double(s[at + i]));
      }
      // Scaled to a geometric mean of 1: the quantizer does not care, the
      // floats stay in their usual range.
      const double norm = std::exp(-log_sum / head_dim);
      for (int32_t i = 0; i < head_dim; ++i) s[at + i] = static_cast<float>(s[at + i] * norm);
    }
  }
  seq.release(kv);
  return out;
}

}  // namespace tandem

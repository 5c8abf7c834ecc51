#include "model/key_centering.h"

#include <cmath>
#include <numbers>
#include <string_view>

#include "core/error.h"
#include "kv/kv_cache.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

namespace tandem {
namespace {

// Ordinary prose: the mean it gives is a property of the layer, not of the
// text (on Gemma 3 a mean from one license text centers another as well as
// that text's own mean does).
constexpr std::string_view kText =
    "The harbour town woke slowly. Fishing boats came in before dawn, their engines loud across the water, and by "
    "seven the market had filled with crates of mackerel, crab and cod. A baker on the corner sold bread to the dock "
    "workers; a schoolteacher walked her dog along the sea wall. In the library, a clerk sorted letters from 1921 "
    "into boxes numbered 1 to 40, writing each date in a ledger. \"We close at noon on Fridays,\" said the sign, "
    "though nobody remembered why. Later that afternoon the wind turned west, rain fell on the slate roofs, and the "
    "ferry to the island was cancelled until Tuesday.";

constexpr double kMostTurn = std::numbers::pi / 3;

}  // namespace

std::vector<float> key_offsets(Model& model, ThreadPool& pool, int32_t max_positions) {
  const KvShape shape = model.kv_shape();
  const std::vector<int32_t> tokens = model.tokenizer().encode(kText, true, false);
  const int32_t n = static_cast<int32_t>(tokens.size());
  if (n < 2) fail(ErrorKind::kUnsupported, "key centering: the built-in text is {} token(s) for this tokenizer", n);
  constexpr int32_t kBlock = 16;
  KvCache kv(shape, (n + kBlock - 1) / kBlock, kBlock, KvFormat{KvType::kF32, KvType::kF32});
  SeqKv seq;
  if (!seq.reserve(kv, n)) fail(ErrorKind::kResource, "key centering: a cache for {} tokens", n);
  Logits logits;
  model.prefill(seq, tokens, kv, pool, logits);

  const int32_t w = shape.k_width, head_dim = w / shape.n_head_kv;
  std::vector<float> mu(size_t(shape.n_layer) * w, 0.0f);
  std::vector<double> sum(static_cast<size_t>(w));
  std::vector<float> k(static_cast<size_t>(w));
  // Position 0 is left out: its key is the attention sink's, far from the rest.
  const double mean_pos = n / 2.0;
  for (int32_t l = 0; l < shape.n_layer; ++l) {
    std::fill(sum.begin(), sum.end(), 0.0);
    for (int32_t p = 1; p < n; ++p) {
      kv.read_key(l, seq.blocks[size_t(p / kBlock)], p % kBlock, k.data());
      for (int32_t i = 0; i < w; ++i) sum[size_t(i)] += k[size_t(i)];
    }
    float* m = mu.data() + size_t(l) * w;
    for (int32_t i = 0; i < w; ++i) m[i] = static_cast<float>(sum[size_t(i)] / (n - 1));
    const RopeParams rope = model.rope_params(l);
    for (int32_t h = 0; h < shape.n_head_kv; ++h) {
      float* mh = m + size_t(h) * head_dim;
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
  }
  seq.release(kv);
  return mu;
}

}  // namespace tandem

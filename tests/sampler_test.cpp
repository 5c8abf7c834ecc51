#include "engine/sampler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "engine/logprobs.h"

namespace tandem {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// Only the filter a test names is on; everything else off.
SamplingParams plain(float temperature, uint64_t seed = 1234) {
  SamplingParams p;
  p.temperature = temperature;
  p.top_k = 0;
  p.top_p = 1.0f;
  p.min_p = 0.0f;
  p.repeat_penalty = 1.0f;
  p.seed = seed;
  return p;
}

std::vector<float> random_logits(size_t n, uint32_t seed, float scale = 3.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

int32_t greedy_pick(const std::vector<float>& logits, const std::vector<int32_t>& history, SamplingParams p) {
  p.temperature = 0.0f;
  Sampler s(p);
  return s.sample(logits, history);
}

std::vector<int> histogram(Sampler& s, const std::vector<float>& logits, int draws) {
  std::vector<int> counts(logits.size(), 0);
  for (int i = 0; i < draws; ++i) counts[static_cast<size_t>(s.sample(logits, {}))]++;
  return counts;
}

std::vector<double> softmax(const std::vector<float>& logits, double t, const std::vector<bool>& keep) {
  std::vector<double> p(logits.size(), 0.0);
  double m = -1e300;
  for (size_t i = 0; i < logits.size(); ++i)
    if (keep[i]) m = std::max(m, static_cast<double>(logits[i]));
  double sum = 0;
  for (size_t i = 0; i < logits.size(); ++i)
    if (keep[i]) sum += p[i] = std::exp((logits[i] - m) / t);
  for (double& x : p) x /= sum;
  return p;
}

// Empirical frequencies within 5 standard errors of the expected
// probabilities (the seed is fixed, so this is deterministic; 5 sigma keeps
// it from depending on a lucky seed).
void expect_frequencies(const std::vector<int>& counts, const std::vector<double>& expected, int draws) {
  for (size_t i = 0; i < counts.size(); ++i) {
    const double p = expected[i];
    const double freq = static_cast<double>(counts[i]) / draws;
    const double se = std::sqrt(p * (1 - p) / draws);
    EXPECT_NEAR(freq, p, 5 * se + 1e-9) << "token " << i;
  }
}

// Log-probabilities, so that softmax at temperature 1 gives exactly these.
std::vector<float> logits_of(const std::vector<double>& probs) {
  std::vector<float> l;
  for (double p : probs) l.push_back(static_cast<float>(std::log(p)));
  return l;
}

TEST(SamplerTest, GreedyIsArgmaxLowestIdOnTies) {
  const std::vector<float> logits = {1.0f, 5.0f, 3.0f, 5.0f, 2.0f};
  for (float t : {0.0f, -1.0f}) {
    SamplingParams p;  // defaults: top-k, top-p, min-p on; greedy ignores them
    p.temperature = t;
    Sampler s(p);
    for (int i = 0; i < 5; ++i) EXPECT_EQ(s.sample(logits, {}), 1) << "temperature " << t;
  }
}

TEST(SamplerTest, GreedyMatchesMaxElementOnLargeVocab) {
  for (uint32_t seed : {1u, 2u, 3u}) {
    std::vector<float> logits = random_logits(262144, seed);
    logits[777] = logits[100000] = 100.0f;  // a tie: the lower id wins
    const auto expected = std::max_element(logits.begin(), logits.end()) - logits.begin();
    ASSERT_EQ(expected, 777);
    EXPECT_EQ(greedy_pick(logits, {}, plain(0.0f)), expected);
  }
}

// Greedy without penalties has its own scan (block maxima, then one block):
// the same pick as a plain scan of clean() values (NaN never, +inf equal to
// the largest float, lowest id on ties, -0 equal to +0), at sizes around its
// 1024-logit blocks and 16-lane steps, with the specials anywhere.
TEST(SamplerTest, GreedyScanMatchesPlainScan) {
  constexpr float kMax = std::numeric_limits<float>::max();
  auto plain_pick = [](const std::vector<float>& v) {
    int32_t best = -1;
    float bv = -kInf;
    for (size_t i = 0; i < v.size(); ++i) {
      float c = std::isnan(v[i]) ? -kInf : v[i] == kInf ? kMax : v[i];
      if (c > bv) {
        bv = c;
        best = static_cast<int32_t>(i);
      }
    }
    return best;
  };
  std::mt19937 rng(5);
  const float specials[] = {kNaN, kInf, -kInf, kMax, 0.0f, -0.0f, 7.5f};
  int checked = 0;
  for (size_t n : {1, 2, 15, 16, 17, 1023, 1024, 1025, 2049, 5000, 262151}) {
    for (int trial = 0; trial < 12; ++trial) {
      std::vector<float> v = random_logits(n, static_cast<uint32_t>(n * 31 + trial));
      if (trial % 3 == 1) for (float& x : v) x = std::round(x);  // many ties
      if (trial % 4 == 2) for (float& x : v) x = -std::abs(x) - 1.0f;  // all negative, then zeros below
      const int k = static_cast<int>(rng() % 5);
      for (int j = 0; j < k; ++j) v[rng() % n] = specials[rng() % std::size(specials)];
      if (trial == 11) std::fill(v.begin(), v.end(), kNaN);
      const int32_t want = plain_pick(v);
      Sampler s(plain(0.0f));
      if (want < 0) {
        EXPECT_THROW(s.sample(v, {}), Error) << "n=" << n << " trial " << trial;
      } else {
        EXPECT_EQ(s.sample(v, {}), want) << "n=" << n << " trial " << trial;
        ++checked;
      }
    }
  }
  EXPECT_GT(checked, 100);
}

TEST(SamplerTest, TinyTemperatureIsGreedy) {
  const std::vector<float> logits = {1.0f, 3.0f, 2.0f, 2.999f};
  for (float t : {1e-30f, 1e-45f}) {  // 1/T finite; 1/T overflowing
    Sampler s(plain(t));
    for (int i = 0; i < 10; ++i) EXPECT_EQ(s.sample(logits, {}), 1) << "temperature " << t;
  }
  Sampler s(plain(1e-45f));
  EXPECT_EQ(s.sample(std::vector<float>{1.0f, 3.0f, 3.0f}, {}), 1);
}

TEST(SamplerTest, SameSeedSameSequenceDifferentSeedDifferent) {
  const std::vector<float> logits = random_logits(1000, 7, 1.0f);
  auto run = [&](uint64_t seed) {
    Sampler s(plain(1.0f, seed));
    std::vector<int32_t> out;
    for (int i = 0; i < 200; ++i) out.push_back(s.sample(logits, {}));
    return out;
  };
  EXPECT_EQ(run(42), run(42));
  EXPECT_NE(run(42), run(43));
  // All 64 bits of the seed count.
  EXPECT_NE(run(5), run(5 + (uint64_t{1} << 32)));
  // 0xFFFFFFFF asks for a random seed: two samplers draw different sequences.
  EXPECT_NE(run(0xFFFFFFFF), run(0xFFFFFFFF));
}

TEST(SamplerTest, TopK1EqualsGreedyAtAnyTemperature) {
  const std::vector<float> logits = random_logits(5000, 11);
  const int32_t expected = greedy_pick(logits, {}, plain(0.0f));
  for (float t : {0.1f, 1.0f, 2.0f, 50.0f}) {
    SamplingParams p = plain(t);
    p.top_k = 1;
    Sampler s(p);
    for (int i = 0; i < 20; ++i) EXPECT_EQ(s.sample(logits, {}), expected) << "temperature " << t;
  }
}

TEST(SamplerTest, FrequenciesFollowSoftmaxAtTemperature) {
  const std::vector<float> logits = {1.0f, 2.0f, 0.5f, -1.0f, 3.0f};
  const int draws = 20000;
  for (float t : {1.0f, 0.7f, 2.0f}) {
    Sampler s(plain(t, 99));
    const auto counts = histogram(s, logits, draws);
    SCOPED_TRACE("temperature " + std::to_string(t));
    expect_frequencies(counts, softmax(logits, t, std::vector<bool>(logits.size(), true)), draws);
  }
}

TEST(SamplerTest, TopKKeepsTheKBestLowestIdOnTies) {
  const std::vector<float> logits = {1.0f, 3.0f, 3.0f, 3.0f, 0.0f};
  SamplingParams p = plain(1.0f);
  p.top_k = 2;
  Sampler s(p);
  const int draws = 20000;
  const auto counts = histogram(s, logits, draws);
  expect_frequencies(counts, softmax(logits, 1.0, {false, true, true, false, false}), draws);
}

TEST(SamplerTest, TopPKeepsSmallestSetReachingP) {
  // At temperature 1: 0.5, 0.25, 0.15, 0.1. p = 0.7 needs the first two.
  const std::vector<float> logits = logits_of({0.15, 0.5, 0.1, 0.25});
  const std::vector<bool> keep = {false, true, false, true};
  const int draws = 20000;
  // The set is chosen at temperature 1 whatever the temperature; the draw then
  // follows the softmax at that temperature over the kept tokens.
  for (float t : {1.0f, 3.0f}) {
    SamplingParams p = plain(t, 5);
    p.top_p = 0.7f;
    Sampler s(p);
    const auto counts = histogram(s, logits, draws);
    SCOPED_TRACE("temperature " + std::to_string(t));
    expect_frequencies(counts, softmax(logits, t, keep), draws);
    EXPECT_EQ(counts[0] + counts[2], 0);
    EXPECT_GT(counts[1], 0);
    EXPECT_GT(counts[3], 0);
  }
}

TEST(SamplerTest, TopPKeepsAtLeastOneToken) {
  const std::vector<float> logits = logits_of({0.9, 0.05, 0.05});
  SamplingParams p = plain(1.0f);
  p.top_p = 0.01f;
  Sampler s(p);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(s.sample(logits, {}), 0);
}

TEST(SamplerTest, TopPOnLargeVocabWithoutTopK) {
  // Mass spread over many tokens exercises the widening partial sort.
  std::vector<float> logits = random_logits(262144, 21, 0.5f);
  SamplingParams p = plain(1.0f, 8);
  p.top_p = 0.9f;
  Sampler s(p);
  // The kept set: best tokens until 90% of the mass.
  std::vector<int32_t> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  });
  double total = 0;
  const float m = logits[order[0]];
  for (float l : logits) total += std::exp(static_cast<double>(l - m));
  std::vector<bool> kept(logits.size(), false);
  double cum = 0;
  for (int32_t id : order) {
    kept[id] = true;
    cum += std::exp(static_cast<double>(logits[id] - m));
    if (cum >= 0.9 * total) break;
  }
  for (int i = 0; i < 200; ++i) {
    const int32_t id = s.sample(logits, {});
    ASSERT_TRUE(kept[id]) << "token " << id << " is outside the top-p set";
  }
}

TEST(SamplerTest, MinPDropsTokensBelowFractionOfMax) {
  // p_max = 0.5; min_p = 0.25 keeps p >= 0.125: tokens 0, 1, 2.
  const std::vector<float> logits = logits_of({0.5, 0.25, 0.15, 0.1});
  const std::vector<bool> keep = {true, true, true, false};
  const int draws = 20000;
  for (float t : {1.0f, 1.5f}) {
    SamplingParams p = plain(t, 17);
    p.min_p = 0.25f;
    Sampler s(p);
    const auto counts = histogram(s, logits, draws);
    SCOPED_TRACE("temperature " + std::to_string(t));
    EXPECT_EQ(counts[3], 0);
    for (int i = 0; i < 3; ++i) EXPECT_GT(counts[i], 0);
    expect_frequencies(counts, softmax(logits, t, keep), draws);
  }
}

TEST(SamplerTest, FiltersChainInOrder) {
  // top-k 3 keeps {0,1,2}; top-p 0.75 over their renormalized mass
  // (0.5, 0.3, 0.2) keeps {0,1} (over all five it would keep three);
  // min-p 0.7 then drops 1 (0.3 < 0.7 * 0.5).
  const std::vector<float> logits = logits_of({0.4, 0.24, 0.16, 0.12, 0.08});
  SamplingParams p = plain(1.0f);
  p.top_k = 3;
  p.top_p = 0.75f;
  Sampler s(p);
  const auto counts = histogram(s, logits, 5000);
  EXPECT_GT(counts[0], 0);
  EXPECT_GT(counts[1], 0);
  EXPECT_EQ(counts[2] + counts[3] + counts[4], 0);
  p.min_p = 0.7f;
  Sampler s2(p);
  const auto counts2 = histogram(s2, logits, 1000);
  EXPECT_EQ(counts2[0], 1000);
}

TEST(SamplerTest, RepeatPenaltyDividesPositiveMultipliesNegative) {
  SamplingParams p = plain(0.0f);
  p.repeat_penalty = 1.2f;
  // 1.0 / 1.2 = 0.83333: just below and just above it.
  EXPECT_EQ(greedy_pick({1.0f, 0.8334f}, {0}, p), 1);
  EXPECT_EQ(greedy_pick({1.0f, 0.8332f}, {0}, p), 0);
  // -1.0 * 1.2 = -1.2 (dividing would give -0.833 and keep token 0 ahead).
  EXPECT_EQ(greedy_pick({-1.0f, -1.1999f}, {0}, p), 1);
  EXPECT_EQ(greedy_pick({-1.0f, -1.2001f}, {0}, p), 0);
  // A zero logit stays zero.
  EXPECT_EQ(greedy_pick({0.0f, -0.0001f}, {0}, p), 0);
  // The count does not matter for the repeat penalty.
  EXPECT_EQ(greedy_pick({1.0f, 0.8332f}, {0, 0, 0, 0}, p), 0);
}

TEST(SamplerTest, FrequencyPenaltyScalesWithCount) {
  SamplingParams p = plain(0.0f);
  p.frequency_penalty = 0.1f;
  // 1.0 - 3 * 0.1 = 0.7
  EXPECT_EQ(greedy_pick({1.0f, 0.7001f}, {0, 0, 0}, p), 1);
  EXPECT_EQ(greedy_pick({1.0f, 0.6999f}, {0, 0, 0}, p), 0);
  // once: 0.9
  EXPECT_EQ(greedy_pick({1.0f, 0.8999f}, {0}, p), 0);
  EXPECT_EQ(greedy_pick({1.0f, 0.9001f}, {0}, p), 1);
}

TEST(SamplerTest, PresencePenaltyAppliesOnce) {
  SamplingParams p = plain(0.0f);
  p.presence_penalty = 0.3f;
  EXPECT_EQ(greedy_pick({1.0f, 0.7001f}, {0, 0, 0}, p), 1);
  EXPECT_EQ(greedy_pick({1.0f, 0.6999f}, {0, 0, 0}, p), 0);
  EXPECT_EQ(greedy_pick({1.0f, 0.6999f}, {0}, p), 0);
}

TEST(SamplerTest, PenaltiesCombineInLlamaCppOrder) {
  // repeat first, then frequency and presence: 2.0 / 2 - 2 * 0.1 - 0.05 = 0.75
  SamplingParams p = plain(0.0f);
  p.repeat_penalty = 2.0f;
  p.frequency_penalty = 0.1f;
  p.presence_penalty = 0.05f;
  EXPECT_EQ(greedy_pick({2.0f, 0.7501f}, {0, 0}, p), 1);
  EXPECT_EQ(greedy_pick({2.0f, 0.7499f}, {0, 0}, p), 0);
}

TEST(SamplerTest, PenaltyWindowIsLastNTokens) {
  const std::vector<float> logits = {1.0f, 0.9f, 0.6f};
  const std::vector<int32_t> history = {0, 1};
  SamplingParams p = plain(0.0f);
  p.repeat_penalty = 2.0f;
  p.repeat_last_n = 1;  // only token 1 penalized: 0 stays best
  EXPECT_EQ(greedy_pick(logits, history, p), 0);
  p.repeat_last_n = 2;  // both: 0.5, 0.45, 0.6
  EXPECT_EQ(greedy_pick(logits, history, p), 2);
  p.repeat_last_n = -1;  // whole history
  EXPECT_EQ(greedy_pick(logits, history, p), 2);
  p.repeat_last_n = 100;  // longer than the history
  EXPECT_EQ(greedy_pick(logits, history, p), 2);
  p.repeat_last_n = 0;  // off
  EXPECT_EQ(greedy_pick(logits, history, p), 0);
}

TEST(SamplerTest, PenaltiesApplyBeforeTopK) {
  // Token 0 is best until penalized; top-k 1 must then keep token 1.
  SamplingParams p = plain(1.0f);
  p.top_k = 1;
  p.repeat_penalty = 2.0f;
  Sampler s(p);
  EXPECT_EQ(s.sample(std::vector<float>{1.0f, 0.9f, 0.1f}, std::vector<int32_t>{0}), 1);
}

// logit_bias (OpenAI's): added before the penalties, in any order of ids,
// sampled or greedy, on a vocabulary large enough for the heap path.
TEST(SamplerTest, LogitBiasComesFirst) {
  SamplingParams p = plain(0.0f);
  p.logit_bias = {{1, 0.2001f}};
  EXPECT_EQ(greedy_pick({1.0f, 0.8f}, {}, p), 1);
  p.logit_bias = {{1, 0.1999f}};
  EXPECT_EQ(greedy_pick({1.0f, 0.8f}, {}, p), 0);
  // -100 on the best token hands it to the second; ids given out of order.
  p.logit_bias = {{2, 0.5f}, {0, -100.0f}};
  EXPECT_EQ(greedy_pick({1.0f, 0.8f, 0.1f}, {}, p), 1);
  // Then the repeat penalty, on the biased logit: (0.6 + 0.6) / 2 = 0.6 < 0.7.
  p = plain(0.0f);
  p.repeat_penalty = 2.0f;
  p.logit_bias = {{0, 0.6f}};
  EXPECT_EQ(greedy_pick({0.6f, 0.7f}, {0}, p), 1);
  EXPECT_EQ(greedy_pick({0.6f, 0.5f}, {0}, p), 0);
  // Sampled: +100 leaves no other choice; top-k sees the biased logits.
  std::vector<float> big(5001, 0.0f);
  big[17] = 5.0f;
  SamplingParams t = plain(1.0f);
  t.top_k = 3;
  t.seed = 3;
  t.logit_bias = {{4000, 100.0f}};
  Sampler s(t);
  for (int i = 0; i < 20; ++i) EXPECT_EQ(s.sample(big, {}), 4000);
  // Bad entries are refused by name.
  SamplingParams bad = plain(0.0f);
  bad.logit_bias = {{3, 1.0f}, {3, 2.0f}};
  EXPECT_THROW(Sampler{bad}, Error);
  bad.logit_bias = {{-1, 1.0f}};
  EXPECT_THROW(Sampler{bad}, Error);
  bad.logit_bias = {{1, std::numeric_limits<float>::infinity()}};
  EXPECT_THROW(Sampler{bad}, Error);
  SamplingParams far = plain(0.0f);
  far.logit_bias = {{9, 1.0f}};
  Sampler fs(far);
  const std::vector<float> two = {1.0f, 2.0f};
  EXPECT_THROW(fs.sample(two, {}), Error);
}

// A constraint (constrained decoding): refused picks are drawn again from the
// allowed tokens only, greedy or sampled, and the allowed ones keep their odds.
TEST(SamplerTest, ConstraintRedrawsFromTheAllowedTokens) {
  struct Odd : TokenConstraint {
    bool allows(int32_t t) const override { return t % 2 == 1; }
  };
  const Odd odd;
  EXPECT_EQ(Sampler(plain(0.0f)).sample(std::vector<float>{5.0f, 1.0f, 3.0f, 2.0f}, {}, &odd), 3);
  // Sampled: tokens 0..3 with weights 4:1:2:1 (logits log w); odd ones only: 1 and 3, 1:1.
  const std::vector<float> lg = {std::log(4.0f), 0.0f, std::log(2.0f), 0.0f};
  SamplingParams p = plain(1.0f, 77);
  p.top_k = 0;
  p.top_p = 1.0f;
  p.min_p = 0.0f;
  Sampler s(p);
  std::vector<int> counts(4, 0);
  const int draws = 20000;
  for (int i = 0; i < draws; ++i) ++counts[s.sample(lg, {}, &odd)];
  EXPECT_EQ(counts[0] + counts[2], 0);
  expect_frequencies(counts, {0.0, 0.5, 0.0, 0.5}, draws);
  struct None : TokenConstraint {
    bool allows(int32_t) const override { return false; }
  };
  const None none;
  EXPECT_THROW(s.sample(lg, {}, &none), Error);
}

TEST(SamplerTest, NaNAndMinusInfAreNeverPicked) {
  const std::vector<float> logits = {kNaN, -kInf, 0.0f, kNaN, 0.0f, -kInf};
  EXPECT_EQ(greedy_pick(logits, {}, plain(0.0f)), 2);
  Sampler s(plain(1.0f));
  const auto counts = histogram(s, logits, 2000);
  EXPECT_EQ(counts[0] + counts[1] + counts[3] + counts[5], 0);
  EXPECT_GT(counts[2], 0);
  EXPECT_GT(counts[4], 0);
  // +inf is the surest token, not a NaN in the softmax.
  Sampler s2(plain(1.0f));
  EXPECT_EQ(s2.sample(std::vector<float>{0.0f, kInf, 1.0f}, {}), 1);
}

TEST(SamplerTest, BadInputThrows) {
  Sampler s(plain(1.0f));
  EXPECT_THROW(s.sample(std::vector<float>{}, {}), Error);
  EXPECT_THROW(s.sample(std::vector<float>{-kInf, kNaN}, {}), Error);
  SamplingParams p = plain(1.0f);
  p.repeat_penalty = 1.1f;
  Sampler penalized(p);
  try {
    penalized.sample(std::vector<float>{1.0f, 2.0f}, std::vector<int32_t>{5});
    FAIL() << "history token outside the vocabulary was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find('5'), std::string::npos) << e.what();
  }
  EXPECT_THROW(penalized.sample(std::vector<float>{1.0f, 2.0f}, std::vector<int32_t>{-1}), Error);
}

TEST(SamplerTest, InvalidParamsThrowNamingTheParameter) {
  struct Case {
    const char* name;
    void (*set)(SamplingParams&);
  };
  const Case cases[] = {
      {"temperature", [](SamplingParams& p) { p.temperature = kNaN; }},
      {"temperature", [](SamplingParams& p) { p.temperature = kInf; }},
      {"top_k", [](SamplingParams& p) { p.top_k = 1 << 30; }},
      {"top_p", [](SamplingParams& p) { p.top_p = 0.0f; }},
      {"top_p", [](SamplingParams& p) { p.top_p = -0.5f; }},
      {"top_p", [](SamplingParams& p) { p.top_p = 1.01f; }},
      {"top_p", [](SamplingParams& p) { p.top_p = kNaN; }},
      {"min_p", [](SamplingParams& p) { p.min_p = -0.01f; }},
      {"min_p", [](SamplingParams& p) { p.min_p = 1.5f; }},
      {"min_p", [](SamplingParams& p) { p.min_p = kNaN; }},
      {"repeat_penalty", [](SamplingParams& p) { p.repeat_penalty = 0.0f; }},
      {"repeat_penalty", [](SamplingParams& p) { p.repeat_penalty = -1.0f; }},
      {"repeat_penalty", [](SamplingParams& p) { p.repeat_penalty = kNaN; }},
      {"repeat_penalty", [](SamplingParams& p) { p.repeat_penalty = kInf; }},
      {"repeat_last_n", [](SamplingParams& p) { p.repeat_last_n = -2; }},
      {"frequency_penalty", [](SamplingParams& p) { p.frequency_penalty = kNaN; }},
      {"presence_penalty", [](SamplingParams& p) { p.presence_penalty = -kInf; }},
  };
  for (const Case& c : cases) {
    SamplingParams p;
    c.set(p);
    try {
      Sampler s(p);
      ADD_FAILURE() << c.name << ": accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find(c.name), std::string::npos) << e.what();
    }
  }
  // Edges that are valid.
  SamplingParams ok;
  ok.temperature = -1.0f;  // greedy, as in llama.cpp
  ok.top_k = -1;           // off
  ok.top_p = 1.0f;
  ok.min_p = 1.0f;
  EXPECT_NO_THROW(Sampler{ok});
  ok.min_p = 0.0f;
  ok.repeat_last_n = -1;
  EXPECT_NO_THROW(Sampler{ok});
}

}  // namespace
}  // namespace tandem

namespace tandem {
namespace {

// token_logprob (the API's logprobs) against a plain log-softmax and a full
// sort, on odd vocabulary sizes with repeated values (ties go to the lower id).
TEST(LogprobsTest, MatchesPlainLogSoftmaxAndFullSort) {
  std::mt19937 rng(11);
  for (int32_t nv : {1, 7, 1001, 32003}) {
    std::vector<float> lg(nv);
    std::uniform_int_distribution<int> level(-40, 40);
    for (float& x : lg) x = 0.25f * static_cast<float>(level(rng));  // many exact ties
    double sum = 0;
    for (float x : lg) sum += std::exp(static_cast<double>(x));
    std::vector<int32_t> order(nv);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return lg[a] > lg[b]; });
    for (int32_t k : {0, 1, 5, 20}) {
      const int32_t tok = nv / 2;
      std::vector<TokenLogprob> top;
      const TokenLogprob lp = token_logprob(lg, tok, k, &top);
      EXPECT_EQ(lp.token, tok);
      EXPECT_NEAR(lp.logprob, lg[tok] - std::log(sum), 1e-5) << nv;
      ASSERT_EQ(static_cast<int32_t>(top.size()), k == 0 ? 0 : std::min(k, nv)) << nv << " " << k;
      for (size_t i = 0; i < top.size(); ++i) {
        EXPECT_EQ(top[i].token, order[i]) << nv << " rank " << i;
        EXPECT_NEAR(top[i].logprob, lg[order[i]] - std::log(sum), 1e-5);
      }
    }
  }
}

}  // namespace
}  // namespace tandem

// End-to-end checks on stories260K (llama architecture, F32) against the
// outputs of karpathy/llama2.c's run.c (../shared/models/reference).
#include <filesystem>
#include <sstream>

#include <gtest/gtest.h>

#include "convert/llama2c.h"
#include "core/error.h"
#include "runtime/thread_pool.h"
#include "kv/kv_cache.h"
#include "model/model.h"
#include "test_support.h"
#include "tokenizer/tokenizer.h"

namespace tandem {
namespace {

using test::read_file;
using test::shared_path;

std::vector<int32_t> reference_ids() {
  std::istringstream in(read_file(shared_path("models/reference/stories260K.greedy.n64.once_upon_a_time.token_ids.txt")));
  std::string line, last;
  while (std::getline(in, line))
    if (!line.empty() && line[0] != '#') last = line;  // the full sequence is the last data line
  std::istringstream ids(last);
  std::vector<int32_t> v;
  for (int32_t x; ids >> x;) v.push_back(x);
  return v;
}

// Greedy generation of 60 tokens after "Once upon a time" (llama2.c -n 64).
void expect_reference_story(const std::string& gguf) {
  auto model = Model::load(gguf);
  std::vector<int32_t> prompt = model->tokenizer().encode("Once upon a time", true, true);
  const std::vector<int32_t> ref = reference_ids();
  ASSERT_EQ(ref.size(), 65u);
  ASSERT_EQ(prompt, std::vector<int32_t>(ref.begin(), ref.begin() + 5));

  const Completion r = test::greedy(*model, prompt, 60);
  const std::string& text = r.text;
  EXPECT_EQ(r.tokens, std::vector<int32_t>(ref.begin() + 5, ref.end()));
  std::string expected = read_file(shared_path("models/reference/stories260K.greedy.n64.once_upon_a_time.stdout.txt"));
  ASSERT_EQ(expected.back(), '\n');  // run.c ends with a newline of its own
  expected.pop_back();
  EXPECT_EQ("Once upon a time" + text, expected);
}

TEST(StoriesModel, GreedyMatchesLlama2cFromShippedGguf) {
  expect_reference_story(shared_path("models/gguf/stories260K.gguf"));
}

TEST(StoriesModel, GreedyMatchesLlama2cFromConvertedGguf) {
  const auto out = std::filesystem::temp_directory_path() / "tandem_stories_converted.gguf";
  convert_llama2c(shared_path("models/llama2c/stories260K.bin"), shared_path("models/llama2c/tok512.bin"),
                  out.string());
  expect_reference_story(out.string());
  std::filesystem::remove(out);
}

TEST(StoriesModel, NoPromptGreedyMatchesLlama2c) {
  // run.c -n 200 with no prompt: BOS, then 200 greedy tokens, printed as text.
  auto model = Model::load(shared_path("models/gguf/stories260K.gguf"));
  std::string text = test::greedy(*model, {model->tokenizer().bos_id()}, 200, false).text;
  std::string expected = read_file(shared_path("models/reference/stories260K.greedy.n200.noprompt.stdout.txt"));
  ASSERT_EQ(expected.back(), '\n');
  expected.pop_back();
  // run.c drops the leading space of the first piece after BOS, as
  // SentencePiece's decoder does for the start of a text.
  ASSERT_FALSE(text.empty());
  if (text[0] == ' ') text.erase(0, 1);
  EXPECT_EQ(text, expected);
}

// The last position's logits after feeding `toks` one decode step at a time
// into a fresh sequence of `kv`.
Logits logits_token_by_token(Model& model, const std::vector<int32_t>& toks, KvCache& kv, ThreadPool& pool) {
  SeqKv seq;
  EXPECT_TRUE(seq.reserve(kv, static_cast<int32_t>(toks.size())));
  Logits logits;
  for (int32_t t : toks) {
    logits.clear();
    SeqKv* seqs[] = {&seq};
    const int32_t one[] = {t};
    model.decode(seqs, one, kv, pool, logits);
  }
  return logits;
}

// Logits of the last position after one prefill pass must equal those after
// feeding the same tokens one decode step at a time. Both phases compute each
// row with the same reductions in the same order, so we require equality
// within 1e-6 (relative to the logits' scale); in practice it is exact.
TEST(StoriesModel, PrefillAndDecodeAgree) {
  auto model = Model::load(shared_path("models/gguf/stories260K.gguf"));
  ThreadPool pool(2);
  KvCache kv(model->kv_shape(), 8, 16);
  std::vector<int32_t> toks = model->tokenizer().encode("Once upon a time, there was a big dog named Max.", true, true);
  ASSERT_GT(toks.size(), 10u);

  SeqKv a;
  ASSERT_TRUE(a.reserve(kv, static_cast<int32_t>(toks.size())));
  Logits prefill_logits;
  model->prefill(a, toks, kv, pool, prefill_logits);
  EXPECT_EQ(a.n_tokens, static_cast<int32_t>(toks.size()));

  const Logits step_logits = logits_token_by_token(*model, toks, kv, pool);
  ASSERT_EQ(prefill_logits.size(), step_logits.size());
  float scale = 0;
  for (float x : prefill_logits) scale = std::max(scale, std::abs(x));
  for (size_t i = 0; i < step_logits.size(); ++i) EXPECT_NEAR(prefill_logits[i], step_logits[i], 1e-6f * scale) << i;
}

// A prompt longer than the feed-forward chunk (128 rows, model.cpp): the
// chunked pass gives the last position exactly the logits that one decode
// step at a time does, and so every chunk boundary is seamless.
TEST(StoriesModel, LongPromptPrefillMatchesDecodeBitForBit) {
  auto model = Model::load(shared_path("models/gguf/stories260K.gguf"));
  ThreadPool pool(2);
  KvCache kv(model->kv_shape(), 16, 40);  // 16 blocks of 40 tokens: two 300-token sequences
  std::string text;
  while (text.size() < 1200) text += "Lily saw a red ball in the park and ran to get it. ";
  std::vector<int32_t> toks = model->tokenizer().encode(text, true, true);
  ASSERT_GT(toks.size(), 260u);
  toks.resize(std::min<size_t>(toks.size(), 300));

  SeqKv a;
  ASSERT_TRUE(a.reserve(kv, static_cast<int32_t>(toks.size())));
  Logits prefill_logits;
  model->prefill(a, toks, kv, pool, prefill_logits);
  EXPECT_EQ(prefill_logits, logits_token_by_token(*model, toks, kv, pool));
}

// The last layer runs past attention only for the rows that want logits.
// Which rows those are must not change any of their logits, nor the KV the
// other rows leave behind: a batch of two sequences with logits on every row
// against the same batch with logits on a few (first, middle, last rows), and
// with none at all, after which one decode step must see the same cache.
TEST(StoriesModel, LogitsOfSomeRowsEqualThoseOfEveryRow) {
  auto model = Model::load(shared_path("models/gguf/stories260K.gguf"));
  ThreadPool pool(2);
  const ModelConfig& c = model->config();
  KvCache kv(model->kv_shape(), 16, 16);
  const std::vector<int32_t> a = model->tokenizer().encode("Once upon a time, there was a big dog.", true, true);
  const std::vector<int32_t> b = model->tokenizer().encode("Lily liked to play.", true, true);
  ASSERT_GT(a.size(), 8u);
  ASSERT_GT(b.size(), 4u);
  auto run = [&](auto wants) {
    SeqKv sa, sb;
    EXPECT_TRUE(sa.reserve(kv, static_cast<int32_t>(a.size()) + 1));
    EXPECT_TRUE(sb.reserve(kv, static_cast<int32_t>(b.size())));
    Batch batch;
    for (size_t i = 0; i < a.size(); ++i) batch.push_back({a[i], static_cast<int32_t>(i), 0, wants(0, i)});
    for (size_t i = 0; i < b.size(); ++i) batch.push_back({b[i], static_cast<int32_t>(i), 1, wants(1, i)});
    SeqKv* seqs[] = {&sa, &sb};
    Logits logits;
    model->forward(batch, seqs, kv, pool, logits);
    EXPECT_EQ(logits.size(), rows_with_logits(batch) * c.n_vocab);
    // One decode step on the first sequence reads the KV every row wrote.
    Batch next{{a[0], static_cast<int32_t>(a.size()), 0, true}};
    model->forward(next, seqs, kv, pool, logits);
    sa.release(kv);
    sb.release(kv);
    return logits;
  };
  const Logits every = run([](int, size_t) { return true; });
  const size_t V = static_cast<size_t>(c.n_vocab), na = a.size(), nb = b.size();
  ASSERT_EQ(every.size(), (na + nb + 1) * V);
  auto row = [&](const Logits& l, size_t r) { return std::vector<float>(l.begin() + r * V, l.begin() + (r + 1) * V); };

  const size_t mid = na / 2;
  const Logits some = run([&](int seq, size_t i) { return seq == 0 ? i == 0 || i == mid : i + 1 == nb; });
  ASSERT_EQ(some.size(), 4 * V);
  EXPECT_EQ(row(some, 0), row(every, 0));
  EXPECT_EQ(row(some, 1), row(every, mid));
  EXPECT_EQ(row(some, 2), row(every, na + nb - 1));
  EXPECT_EQ(row(some, 3), row(every, na + nb));  // the decode step after

  const Logits none = run([](int, size_t) { return false; });
  ASSERT_EQ(none.size(), V);
  EXPECT_EQ(row(none, 0), row(every, na + nb));
}

TEST(StoriesModel, PromptLongerThanContextIsRejected) {
  auto model = Model::load(shared_path("models/gguf/stories260K.gguf"));
  std::vector<int32_t> prompt(40, 403);
  EXPECT_THROW(test::greedy(*model, prompt, 8, true, 32), Error);
}

}  // namespace
}  // namespace tandem

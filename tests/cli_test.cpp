// The `tandem` program as a user runs it: a real process, stdout and stderr
// captured separately.
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "test_support.h"

namespace tandem {
namespace {

using Result = test::CliResult;
using test::run_cli;

std::string quote(const std::string& s) { return "'" + s + "'"; }

const std::string kStories = test::shared_path("models/gguf/stories260K.gguf");

TEST(Cli, RunPromptStdoutIsExactlyTheContinuation) {
  Result r = run_cli("run -m " + quote(kStories) + " -p 'Once upon a time' -n 60 --temp 0");
  ASSERT_EQ(r.status, 0) << r.err;
  std::string expected =
      test::read_file(test::shared_path("models/reference/stories260K.greedy.n64.once_upon_a_time.stdout.txt"));
  expected.pop_back();  // run.c's own final newline
  EXPECT_EQ("Once upon a time" + r.out, expected);
  // The phase report goes to stderr and names both phases.
  EXPECT_NE(r.err.find("prefill"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("decode"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("time to first token"), std::string::npos) << r.err;
}

TEST(Cli, RunJsonReport) {
  Result r = run_cli("run -m " + quote(kStories) + " -p 'Once upon a time' -n 20 --temp 0 --json");
  ASSERT_EQ(r.status, 0) << r.err;
  auto j = nlohmann::json::parse(r.err);
  EXPECT_EQ(j["prompt_tokens"], 5);
  EXPECT_EQ(j["generated_tokens"], 20);
  for (const char* key : {"prefill_s", "prefill_tok_s", "ttft_s", "decode_s", "decode_tok_s", "ms_per_token"})
    EXPECT_TRUE(j.contains(key)) << key;
  EXPECT_GT(j["decode_tok_s"].get<double>(), 0);
  EXPECT_EQ(j["stop_reason"], "length");
}

// -n 0 generates nothing, as llama.cpp's -n 0 does: the prompt is computed
// and the run ends.
TEST(Cli, RunWithNZeroGeneratesNothing) {
  Result r = run_cli("run -m " + quote(kStories) + " -p 'Once upon a time' -n 0 --temp 0 --json");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, "");
  auto j = nlohmann::json::parse(r.err);
  EXPECT_EQ(j["prompt_tokens"], 5);
  EXPECT_EQ(j["generated_tokens"], 0);
  EXPECT_EQ(j["stop_reason"], "length");
}

TEST(Cli, UnknownCommandIsNamed) {
  Result r = run_cli("foo");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("unknown command 'foo'"), std::string::npos) << r.err;
  for (const char* cmd : {"run", "serve", "bench", "perplexity"}) EXPECT_NE(r.err.find(cmd), std::string::npos) << cmd;
}

// --kernels names the level every kernel runs at (the report says which);
// TANDEM_KERNELS, which it replaced, still sets it; an unknown level warns and
// runs at the best one.
TEST(Cli, KernelLevelFlagAndEnvironment) {
  const std::string run = "run -m " + quote(kStories) + " -p 'Once upon a time' -n 4 --temp 0 --json";
  Result r = run_cli(run + " --kernels scalar");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.err)["kernels"], "scalar");
  ::setenv("TANDEM_KERNELS", "scalar", 1);  // the command line's mapping, inherited by the command run_cli starts
  r = run_cli(run);
  ::unsetenv("TANDEM_KERNELS");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.err)["kernels"], "scalar");
  r = run_cli(run + " --kernels bogus");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("warning: kernel level bogus is not one of scalar, avx2, avx512"), std::string::npos) << r.err;
}

// inspect --plan prints every weight matrix's layout and products, at the
// level --kernels names.
TEST(Cli, InspectPlan) {
  Result r = run_cli("inspect " + quote(kStories) + " --plan --kernels scalar --prepack off");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("kernels scalar, prepack off"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("blk.4.ffn_down.weight"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("rows scalar"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("read per decoded token"), std::string::npos) << r.out;
}

TEST(Cli, SeededSamplingIsReproducible) {
  const std::string args = "run -m " + quote(kStories) + " -p 'Once upon a time' -n 30 --temp 1.0 --seed 42";
  Result a = run_cli(args), b = run_cli(args);
  ASSERT_EQ(a.status, 0) << a.err;
  EXPECT_EQ(a.out, b.out);
  Result c = run_cli("run -m " + quote(kStories) + " -p 'Once upon a time' -n 30 --temp 1.0 --seed 43");
  EXPECT_NE(a.out, c.out);
}

TEST(Cli, StopStringEndsGeneration) {
  Result r = run_cli("run -m " + quote(kStories) + " -p 'Once upon a time' -n 60 --temp 0 --stop 'Lily'");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, ", there was a little girl named ");
}

TEST(Cli, TokenizeVocabOnlyFile) {
  Result r = run_cli("tokenize -m " + quote(test::shared_path("models/vocab/ggml-vocab-llama-spm.gguf")) +
                     " 'Hello world'");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, "1 15043 3186\n");
  r = run_cli("tokenize --no-bos -m " + quote(test::shared_path("models/vocab/ggml-vocab-llama-spm.gguf")) +
              " 'Hello world'");
  EXPECT_EQ(r.out, "15043 3186\n");
}

TEST(Cli, InspectPrintsMetadataAndTensors) {
  Result r = run_cli("inspect " + quote(kStories));
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("general.architecture"), std::string::npos);
  EXPECT_NE(r.out.find("blk.4.ffn_down.weight"), std::string::npos);
}

TEST(Cli, ConvertLlama2cThenRun) {
  const auto out = std::filesystem::temp_directory_path() / "tandem_cli_convert.gguf";
  Result r = run_cli("convert llama2c " + quote(test::shared_path("models/llama2c/stories260K.bin")) + " " +
                     quote(test::shared_path("models/llama2c/tok512.bin")) + " -o " + quote(out.string()));
  ASSERT_EQ(r.status, 0) << r.err;
  Result g = run_cli("run -m " + quote(out.string()) + " -p 'Once upon a time' -n 12 --temp 0");
  EXPECT_EQ(g.status, 0) << g.err;
  EXPECT_EQ(g.out, ", there was a little girl named Lily. She");
  std::filesystem::remove(out);
}

TEST(Cli, PromptFromAFileOrStdinEqualsTheSamePromptInline) {
  const std::string args = " -n 24 --temp 0";
  const Result inline_p = run_cli("run -m " + quote(kStories) + " -p 'Once upon a time'" + args);
  ASSERT_EQ(inline_p.status, 0) << inline_p.err;
  const std::filesystem::path file = std::filesystem::temp_directory_path() / ("tandem_cli_prompt_" + std::to_string(::getpid()));
  {
    std::ofstream(file) << "Once upon a time\n";  // as an editor saves it: the line break is dropped
  }
  const Result from_file = run_cli("run -m " + quote(kStories) + " -f " + quote(file.string()) + args);
  EXPECT_EQ(from_file.status, 0) << from_file.err;
  EXPECT_EQ(from_file.out, inline_p.out);
  const Result from_stdin = run_cli("run -m " + quote(kStories) + " --file -" + args + " < " + quote(file.string()));
  EXPECT_EQ(from_stdin.status, 0) << from_stdin.err;
  EXPECT_EQ(from_stdin.out, inline_p.out);
  std::filesystem::remove(file);
}

// When repacking would take more memory than is available, the weights stay
// in the file's layout: a warning, and the same greedy text.
TEST(Cli, TooLittleMemoryToRepackWarnsAndRunsFromTheFile) {
  const std::string model = (std::filesystem::temp_directory_path() /
                             ("tandem_cli_q8_" + std::to_string(::getpid()) + ".gguf")).string();
  const Result synth = run_cli("synth -o " + quote(model) + " --vocab-from " +
                               quote(test::shared_path("models/vocab/ggml-vocab-llama-spm.gguf")) +
                               " --arch llama --layers 2 --embd 256 --ff 512 --heads 4 --kv-heads 2 --type q8_0");
  ASSERT_EQ(synth.status, 0) << synth.err;
  const std::string run = "run -m " + quote(model) + " -p 'Once upon a time' -n 12 --temp 0 --ignore-eos";
  const Result packed = run_cli(run);
  ASSERT_EQ(packed.status, 0) << packed.err;
  EXPECT_EQ(packed.err.find("warning"), std::string::npos) << packed.err;
  // Room for the one context's KV pool (2 MiB), not for the 9 MiB of repacked weights.
  const Result in_file = run_cli(run + " --memory-available 5000000");
  EXPECT_EQ(in_file.status, 0) << in_file.err;
  EXPECT_NE(in_file.err.find("warning: repacking the weights takes"), std::string::npos) << in_file.err;
  EXPECT_EQ(in_file.out, packed.out);
  std::filesystem::remove(model);
}

TEST(Cli, ErrorsAreClearAndNonZero) {
  Result r = run_cli("run -m /nonexistent/model.gguf -p hi");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("/nonexistent/model.gguf"), std::string::npos) << r.err;

  r = run_cli("run -m " + quote(kStories) + " -p hi --chat hi");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("exactly one of"), std::string::npos) << r.err;
  r = run_cli("run -m " + quote(kStories) + " -p hi -f /dev/null");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("exactly one of"), std::string::npos) << r.err;
  r = run_cli("run -m " + quote(kStories) + " -f /nonexistent/prompt.txt");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("/nonexistent/prompt.txt: cannot open"), std::string::npos) << r.err;
  r = run_cli("run -m " + quote(kStories) + " -f /dev/null");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("empty"), std::string::npos) << r.err;

  r = run_cli("run -m " + quote(kStories) + " -p hi --top-p 7");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("top_p"), std::string::npos) << r.err;

  r = run_cli("inspect " + quote(test::shared_path("models/README.md")));
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("magic"), std::string::npos) << r.err;

  // The prompt does not fit a 16-token context.
  r = run_cli("run -m " + quote(kStories) + " -c 16 -p 'Once upon a time there was a very long story about a dog'");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("context"), std::string::npos) << r.err;
}

TEST(Cli, ChatOnDefaultModel) {
  TANDEM_REQUIRE_GEMMA(path);
  Result r = run_cli("run -m " + quote(path) + " --chat 'What is the capital of France?' -n 8 --temp 0");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_FALSE(r.out.empty());
  EXPECT_EQ(r.out.find("<end_of_turn>"), std::string::npos);  // the turn end is not printed
  EXPECT_NE(r.err.find("decode"), std::string::npos);
}

}  // namespace
}  // namespace tandem

namespace tandem {
namespace {

// llama-perplexity's output: the running value per chunk, then the estimate;
// --json for scripts; a text too short for two chunks is an error that says so.
TEST(Cli, PerplexityPrintsLikeLlamaCpp) {
  const std::string text = quote(test::testdata_path("perplexity/stories.txt"));
  test::CliResult r = test::run_cli("perplexity -m " + quote(kStories) + " -f " + text + " -c 128 --kv-type f32");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out.rfind("[1]", 0), 0u) << r.out;
  EXPECT_NE(r.out.find(",[14]3.56"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("Final estimate: PPL = 3.562"), std::string::npos) << r.out;
  r = test::run_cli("perplexity -m " + quote(kStories) + " -f " + text + " -c 128 --chunks 2 --json");
  ASSERT_EQ(r.status, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["chunks"], 2);
  EXPECT_EQ(j["scored"], 2 * 63);
  r = test::run_cli("perplexity -m " + quote(kStories) + " -f " + text + " -c 1024");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("needs at least 2048"), std::string::npos) << r.err;
  r = test::run_cli("perplexity -m " + quote(kStories) + " -f /nonexistent/text.txt");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("cannot open"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace tandem

namespace tandem {
namespace {

// -j / --json-schema, as llama.cpp's: the output fits the schema and ends with it.
TEST(Cli, RunWithAJsonSchema) {
  const std::string schema = R"({"type":"object","properties":{"pet":{"enum":["cat","dog"]}},"required":["pet"]})";
  test::CliResult r = test::run_cli("run -m " + quote(kStories) + " -p 'Once upon a time' -n 200 --temp 0 -j " +
                                    quote(schema) + " --json");
  ASSERT_EQ(r.status, 0) << r.err;
  const auto out = nlohmann::json::parse(r.out);
  EXPECT_TRUE(out == nlohmann::json::parse(R"({"pet":"cat"})") || out == nlohmann::json::parse(R"({"pet":"dog"})"))
      << r.out;
  EXPECT_EQ(nlohmann::json::parse(r.err.substr(r.err.find('{')))["stop_reason"], "json") << r.err;
  r = test::run_cli("run -m " + quote(kStories) + " -p x -j '{\"type\": \"string\", \"pattern\": \"a\"}'");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("'pattern' is not supported"), std::string::npos) << r.err;
  r = test::run_cli("run -m " + quote(kStories) + " -p x -j '{nope'");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("not valid JSON"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace tandem

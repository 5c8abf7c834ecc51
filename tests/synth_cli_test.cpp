// `tandem synth` as a user runs it: flags map onto the spec (the file equals
// the one the C++ API writes), and bad flags exit 1 with a message naming them.
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <string>

#include <gtest/gtest.h>

#include "gguf/synth.h"
#include "sha256_file.h"
#include "test_support.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;

struct Result {
  int status = -1;
  std::string err;
};

Result synth_cli(const std::string& args) {
  const fs::path err = fs::temp_directory_path() / ("tandem_synth_cli_err_" + std::to_string(::getpid()));
  const std::string cmd = std::string(TANDEM_CLI_PATH) + " synth " + args + " >/dev/null 2>" + err.string();
  Result r;
  const int st = std::system(cmd.c_str());
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  r.err = test::read_file(err.string());
  fs::remove(err);
  return r;
}

const std::string kVocab = test::shared_path("models/gguf/stories260K.gguf");

TEST(SynthCli, FlagsMatchTheLibrary) {
  const fs::path out = fs::temp_directory_path() / "tandem_synth_cli.gguf";
  Result r = synth_cli("-o " + out.string() + " --vocab-from " + kVocab +
                       " --arch gemma3 --layers 3 --embd 64 --ff 96 --heads 2 --kv-heads 1 --head-dim 48"
                       " --ctx 512 --window 16 --rope-base 20000 --eps 1e-5 --untied --type q8_0 --seed 7 -t 2");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("wrote"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("q8_0 x"), std::string::npos) << r.err;

  SynthSpec s;
  s.arch = "gemma3", s.n_layer = 3, s.n_embd = 64, s.n_ff = 96, s.n_head = 2, s.n_head_kv = 1, s.head_dim = 48;
  s.n_ctx = 512, s.sliding_window = 16, s.rope_base = 20000.0f, s.rms_eps = 1e-5f, s.tied = false;
  s.type = "q8_0", s.seed = 7, s.vocab_from = kVocab;
  const fs::path api = fs::temp_directory_path() / "tandem_synth_api.gguf";
  synth_model(s, api.string(), 1);
  EXPECT_EQ(test::sha256_file(out.string()), test::sha256_file(api.string()));
  fs::remove(out);
  fs::remove(api);
}

TEST(SynthCli, PresetFlagsOverride) {
  // The 1.1B preset cut down to one layer and a narrow FFN, so the test stays quick.
  const fs::path out = fs::temp_directory_path() / "tandem_synth_preset.gguf";
  Result r = synth_cli("-o " + out.string() + " --preset tinyllama-1.1b --layers 1 --ff 256 --vocab-from " + kVocab +
                       " --type q4_0");
  ASSERT_EQ(r.status, 0) << r.err;
  SynthSpec s = synth_preset("tinyllama-1.1b");
  s.n_layer = 1, s.n_ff = 256, s.type = "q4_0", s.vocab_from = kVocab;
  const fs::path api = fs::temp_directory_path() / "tandem_synth_preset_api.gguf";
  synth_model(s, api.string(), 2);
  EXPECT_EQ(test::sha256_file(out.string()), test::sha256_file(api.string()));
  fs::remove(out);
  fs::remove(api);
}

TEST(SynthCli, BadFlagsExitOneWithAReason) {
  const std::string out = " -o " + (fs::temp_directory_path() / "tandem_synth_bad.gguf").string();
  const std::string v = " --vocab-from " + kVocab;
  const std::pair<std::string, std::string> cases[] = {
      {out, "--vocab-from"},                                  // required
      {out + v + " --type q7_0", "unknown weight type 'q7_0'"},
      {out + v + " --preset llama-70b", "unknown preset 'llama-70b'"},
      {out + v + " --arch mamba", "unknown architecture 'mamba'"},
      {out + v + " --heads 5", "embd = 64 is not a multiple of heads = 5"},
      {out + v + " --tied --untied", "--tied and --untied"},
      {out + v + " --window 8", "sliding window is only supported for gemma3"},
      {out + v + " --layers x", "--layers"},
      {v, "--output"},
  };
  for (const auto& [args, want] : cases) {
    Result r = synth_cli(args);
    EXPECT_NE(r.status, 0) << args;
    EXPECT_NE(r.err.find(want), std::string::npos) << args << "\n" << r.err;
  }
  EXPECT_FALSE(fs::exists(fs::temp_directory_path() / "tandem_synth_bad.gguf"));
}

}  // namespace
}  // namespace tandem

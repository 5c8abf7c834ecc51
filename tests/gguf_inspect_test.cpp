#include <gtest/gtest.h>

#include "gguf/gguf.h"
#include "gguf/inspect.h"

using namespace tandem;

TEST(GgufInspect, Stories260KDump) {
  auto f = GgufFile::open(TANDEM_SHARED_DIR "/models/gguf/stories260K.gguf");
  const std::string s = describe_gguf(*f);
  for (const char* want :
       {"GGUF v3", "alignment:   32", "data offset: 14176", "metadata (19 keys)",
        "tokenizer.ggml.tokens", "arr[str; 512]", "(512 elements)]", "\"<unk>\", \"<s>\"",
        "llama.attention.layer_norm_rms_epsilon", "1e-05", "general.architecture",
        "\"llama\"", "tensors (48, 1171200 bytes of data)"})
    EXPECT_NE(s.find(want), std::string::npos) << "missing " << want << " in\n" << s;
  // One tensor row: name, type, dims, offset, bytes.
  EXPECT_NE(s.find("blk.0.ffn_down.weight"), std::string::npos);
  const size_t row = s.find("blk.4.ffn_norm.weight");
  ASSERT_NE(row, std::string::npos);
  const std::string line = s.substr(row, s.find('\n', row) - row);
  EXPECT_NE(line.find("f32"), std::string::npos) << line;
  EXPECT_NE(line.find("[64]"), std::string::npos) << line;
  EXPECT_NE(line.find("1170944"), std::string::npos) << line;
  EXPECT_NE(line.find(" 256"), std::string::npos) << line;

  const std::string full = describe_gguf(*f, true);
  EXPECT_EQ(full.find("(512 elements)"), std::string::npos);
  EXPECT_NE(full.find("-252]"), std::string::npos);  // last score, not abbreviated
}

TEST(GgufInspect, LongStringsAreCut) {
  GgufWriter w;
  w.add_string("tokenizer.chat_template", std::string(1000, 'x'));
  const auto img = w.to_bytes();
  auto f = GgufFile::from_memory(img.data(), img.size());
  const std::string s = describe_gguf(*f);
  EXPECT_NE(s.find("... (1000 bytes)"), std::string::npos) << s;
  EXPECT_EQ(s.find(std::string(200, 'x')), std::string::npos);
  EXPECT_NE(describe_gguf(*f, true).find(std::string(1000, 'x')), std::string::npos);
  EXPECT_NE(s.find("tensors (0, 0 bytes of data)"), std::string::npos);
}

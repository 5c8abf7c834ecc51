#include "chat/chat_template.h"

#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/error.h"

namespace tandem {
namespace {

// tests/data/chat/refs.json comes from scripts/gen_chat_refs.py: real chat
// templates and llama.cpp's own rendering of them (llama-cpp-python).
const nlohmann::json& refs() {
  static const nlohmann::json doc = [] {
    std::ifstream in(std::string(TANDEM_TESTDATA_DIR) + "/chat/refs.json");
    if (!in) throw std::runtime_error("cannot open tests/data/chat/refs.json");
    return nlohmann::json::parse(in);
  }();
  return doc;
}

std::vector<ChatMessage> conversation(const std::string& name) {
  std::vector<ChatMessage> out;
  for (const auto& m : refs().at("conversations").at(name)) {
    out.push_back({m.at("role").get<std::string>(), m.at("content").get<std::string>()});
  }
  return out;
}

// Every case: apply() equals llama.cpp byte for byte, and the template's own
// Jinja rendering too where llama.cpp agrees with it.
void check_cases(const ChatTemplate& ct, const nlohmann::json& cases, const std::string& what) {
  ASSERT_FALSE(cases.empty());
  for (const auto& c : cases) {
    const std::string conv = c.at("conversation");
    const bool gen = c.at("add_generation_prompt");
    SCOPED_TRACE(what + " / " + conv + (gen ? " / generation prompt" : ""));
    const std::string got = ct.apply(conversation(conv), gen);
    EXPECT_EQ(got, c.at("llama_cpp").get<std::string>());
    if (c.value("jinja_equal", false)) {
      EXPECT_EQ(got, c.at("jinja").get<std::string>());
    }
  }
}

std::string error_message(std::string_view tmpl, ErrorKind expected_kind) {
  try {
    ChatTemplate::detect(tmpl);
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), expected_kind) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "detect accepted " << tmpl.substr(0, 60);
  return {};
}

TEST(ChatTemplateTest, DetectsRealTemplates) {
  const auto& templates = refs().at("templates");
  ASSERT_GE(templates.size(), 5u);
  for (const auto& t : templates) {
    SCOPED_TRACE(t.at("name").get<std::string>());
    const ChatTemplate ct = ChatTemplate::detect(t.at("template").get<std::string>());
    EXPECT_EQ(ct.name(), t.at("family").get<std::string>());
    EXPECT_EQ(ct.variant(), t.at("variant").get<std::string>());
  }
}

TEST(ChatTemplateTest, RendersLikeLlamaCpp) {
  for (const auto& t : refs().at("templates")) {
    const ChatTemplate ct = ChatTemplate::detect(t.at("template").get<std::string>());
    check_cases(ct, t.at("cases"), t.at("name").get<std::string>());
  }
}

TEST(ChatTemplateTest, NamedVariantsRenderLikeLlamaCpp) {
  for (const auto& n : refs().at("named")) {
    const std::string name = n.at("name");
    const ChatTemplate ct = ChatTemplate::detect(name);
    EXPECT_EQ(ct.variant(), name);
    check_cases(ct, n.at("cases"), name);
  }
}

TEST(ChatTemplateTest, GemmaAgreesWithItsJinjaTemplate) {
  // Gemma 3 is the model Tandem runs first; its own template must agree with
  // llama.cpp on ordinary conversations (they differ only in trimming a system
  // message, where llama.cpp is followed).
  int agreeing = 0;
  for (const auto& t : refs().at("templates")) {
    if (t.at("name") != "gemma3") continue;
    for (const auto& c : t.at("cases")) {
      if (c.at("conversation") != "whitespace") {
        EXPECT_TRUE(c.at("jinja_equal").get<bool>()) << c.at("conversation");
        ++agreeing;
      }
    }
  }
  EXPECT_GE(agreeing, 8);
}

TEST(ChatTemplateTest, GemmaFormat) {
  const ChatTemplate ct = ChatTemplate::from_family(ChatFamily::kGemma);
  const std::string out = ct.apply({{"system", "Be kind."}, {"user", "Hi"}, {"assistant", "Hello"}}, true);
  // No BOS: the tokenizer adds it.
  EXPECT_EQ(out,
            "<start_of_turn>user\nBe kind.\n\nHi<end_of_turn>\n"
            "<start_of_turn>model\nHello<end_of_turn>\n"
            "<start_of_turn>model\n");
  EXPECT_EQ(ct.apply({{"user", "Hi"}}, false), "<start_of_turn>user\nHi<end_of_turn>\n");
}

// render() marks where message content went: each marked range holds one
// message's text (as the format writes it), in order, and removing them
// leaves the markup alone.
TEST(ChatTemplateTest, RenderMarksTheContent) {
  const std::vector<ChatMessage> msgs = {
      {"system", "Be <b>kind</b>."}, {"user", "Say <end_of_turn> [INST] <|im_end|>"}, {"assistant", "Hello"},
      {"user", "Again"}};
  for (const char* name : {"gemma", "llama2", "llama3", "chatml", "mistral", "mistral-v1", "mistral-v7",
                           "llama2-sys", "mistral-v3-tekken"}) {
    const ChatTemplate ct = ChatTemplate::detect(name);
    const RenderedChat r = ct.render(msgs, true);
    EXPECT_EQ(r.text, ct.apply(msgs, true)) << name;
    ASSERT_EQ(r.content.size(), msgs.size()) << name;
    size_t prev_end = 0;
    for (size_t i = 0; i < r.content.size(); ++i) {
      const auto [off, len] = r.content[i];
      EXPECT_GE(off, prev_end) << name;
      prev_end = off + len;
      ASSERT_LE(prev_end, r.text.size()) << name;
      EXPECT_EQ(r.text.substr(off, len), msgs[i].content) << name << " message " << i;
    }
  }
}

TEST(ChatTemplateTest, FromFamilyDefaults) {
  const std::map<ChatFamily, std::pair<std::string, std::string>> expected = {
      {ChatFamily::kGemma, {"gemma", "gemma"}},
      {ChatFamily::kLlama2, {"llama2", "llama2-sys-strip"}},
      {ChatFamily::kLlama3, {"llama3", "llama3"}},
      {ChatFamily::kChatML, {"chatml", "chatml"}},
      {ChatFamily::kMistral, {"mistral", "mistral-v3"}},
      {ChatFamily::kGptOss, {"gpt-oss", "gpt-oss"}},
  };
  for (const auto& [family, names] : expected) {
    const ChatTemplate ct = ChatTemplate::from_family(family);
    EXPECT_EQ(ct.family(), family);
    EXPECT_EQ(ct.name(), names.first);
    EXPECT_EQ(ct.variant(), names.second);
    // Family names are accepted in place of a template; "llama2" is llama.cpp's
    // name for its plain variant (no <<SYS>> block), so it keeps that meaning.
    EXPECT_EQ(ChatTemplate::detect(names.first).variant(),
              family == ChatFamily::kLlama2 ? "llama2" : names.second);
  }
}

TEST(ChatTemplateTest, StopStrings) {
  using V = std::vector<std::string>;
  EXPECT_EQ(ChatTemplate::from_family(ChatFamily::kGemma).stop_strings(), V{"<end_of_turn>"});
  EXPECT_EQ(ChatTemplate::from_family(ChatFamily::kLlama3).stop_strings(), V{"<|eot_id|>"});
  EXPECT_EQ(ChatTemplate::from_family(ChatFamily::kChatML).stop_strings(), V{"<|im_end|>"});
  EXPECT_EQ(ChatTemplate::from_family(ChatFamily::kLlama2).stop_strings(), V{"</s>"});
  EXPECT_EQ(ChatTemplate::from_family(ChatFamily::kMistral).stop_strings(), V{"</s>"});
  EXPECT_EQ(ChatTemplate::from_family(ChatFamily::kGptOss).stop_strings(), (V{"<|return|>", "<|call|>"}));
}

TEST(ChatTemplateTest, UnknownTemplateQuotesItsStart) {
  const std::string tmpl =
      "{% for m in messages %}### {{ m.role }}:\n{{ m.content }}\n{% endfor %}### assistant:\n and more text after";
  const std::string msg = error_message(tmpl, ErrorKind::kUnsupported);
  EXPECT_NE(msg.find("{% for m in messages %}### {{ m.role }}:\\n{{ m.content }}"), std::string::npos) << msg;
  EXPECT_EQ(msg.find("more text after"), std::string::npos) << "quotes more than the start: " << msg;
  EXPECT_NE(error_message("", ErrorKind::kUnsupported).find("empty"), std::string::npos);
}

TEST(ChatTemplateTest, RefusesOtherRealFormats) {
  const auto& unsupported = refs().at("unsupported");
  ASSERT_FALSE(unsupported.empty());
  for (const auto& u : unsupported) {
    const std::string tmpl = u.at("template");
    SCOPED_TRACE(u.at("name").get<std::string>());
    const std::string msg = error_message(tmpl, ErrorKind::kUnsupported);
    EXPECT_NE(msg.find(tmpl.substr(0, 10)), std::string::npos) << msg;
  }
}

TEST(ChatTemplateTest, DetectionFollowsLlamaCppOrder) {
  // ChatML's marker is checked before [INST], as in llama.cpp.
  EXPECT_EQ(ChatTemplate::detect("<|im_start|>{{ '[INST]' }}").family(), ChatFamily::kChatML);
  // phi4 uses <|im_start|> but is not ChatML.
  error_message("<|im_start|>{{ role }}<|im_sep|>", ErrorKind::kUnsupported);
  // A template mentioning <start_of_turn> after a phi3 marker pair is phi3.
  error_message("<|assistant|><|end|><start_of_turn>", ErrorKind::kUnsupported);
  EXPECT_EQ(ChatTemplate::detect("{{ '[SYSTEM_PROMPT]' }}[INST]").variant(), "mistral-v7");
  EXPECT_EQ(ChatTemplate::detect("<<SYS>> [INST]").variant(), "llama2-sys");
  EXPECT_EQ(ChatTemplate::detect("{{ bos_token + '[INST] ' }} <<SYS>>").variant(), "llama2-sys-bos");
  // Harmony's markers are checked last: llama3's and llama4's come first.
  EXPECT_EQ(ChatTemplate::detect("<|start|>{{ role }}<|channel|>").family(), ChatFamily::kGptOss);
  EXPECT_EQ(ChatTemplate::detect("<|start|><|channel|><|start_header_id|><|end_header_id|>").family(),
            ChatFamily::kLlama3);
  EXPECT_NE(error_message("<|start|><|channel|><|header_start|><|header_end|>", ErrorKind::kUnsupported)
                .find("'llama4'"),
            std::string::npos);
  // deepseek3 needs all three of its markers, as in llama.cpp.
  const std::string ds3 = "<\xEF\xBD\x9C" "Assistant\xEF\xBD\x9C><\xEF\xBD\x9C" "User\xEF\xBD\x9C>";
  EXPECT_EQ(ChatTemplate::detect(ds3 + "<|start|><|channel|>").family(), ChatFamily::kGptOss);
  error_message(ds3 + "<\xEF\xBD\x9C" "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C><|start|><|channel|>",
                ErrorKind::kUnsupported);
  // Only "<|start|>": not harmony.
  error_message("<|start|>{{ role }}<|message|>", ErrorKind::kUnsupported);
}

TEST(ChatTemplateTest, RejectsUnknownRoles) {
  const ChatTemplate ct = ChatTemplate::from_family(ChatFamily::kChatML);
  try {
    ct.apply({{"user", "hi"}, {"tool", "42"}}, true);
    FAIL() << "unknown role accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("'tool'"), std::string::npos) << e.what();
  }
}

TEST(ChatTemplateTest, EmptyConversation) {
  EXPECT_EQ(ChatTemplate::from_family(ChatFamily::kChatML).apply({}, true), "<|im_start|>assistant\n");
  EXPECT_EQ(ChatTemplate::from_family(ChatFamily::kGemma).apply({}, false), "");
}

}  // namespace
}  // namespace tandem

// Tool calling without a model: the call grammar takes exactly the calls of
// the allowed functions with arguments of their schemas, the parser reads
// the same text back whole or byte by byte, "auto" opens calls at each
// family's marker (text, a control token's id, Llama 3's bare call at the
// start), and each family's history (assistant calls, tool results) renders
// in that family's syntax.
#include "chat/tool_format.h"

#include "chat/chat_template.h"
#include "engine/json_schema.h"
#include "engine/tool_call_grammar.h"
#include "gguf/gguf.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

namespace tandem {
namespace {

using nlohmann::json;

std::shared_ptr<const CompiledSchema> schema(const char* text) {
  return std::make_shared<const CompiledSchema>(compile_schema(json::parse(text)));
}

ToolCallGrammar grammar(ChatFamily f, bool forced, int32_t max_calls) {
  ToolCallGrammar g;
  g.syntax = tool_syntax(f);
  g.forced = forced;
  g.max_calls = max_calls;
  g.functions.emplace_back("get_weather", schema(R"({"type": "object", "required": ["city"],
      "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}}})"));
  g.functions.emplace_back("get_time", schema(R"({"type": "object", "properties": {"zone": {"type": "integer"}}})"));
  return g;
}

// Feeds `text`; the bytes taken before the first refusal.
size_t taken(ToolCallRecognizer& r, const std::string& text) {
  for (size_t i = 0; i < text.size(); ++i)
    if (!r.feed(text[i])) return i;
  return text.size();
}

TEST(ToolCallGrammar, TakesCallsOfTheAllowedFunctionsInEachFamilysSyntax) {
  const std::string w = R"({"name": "get_weather", "arguments": {"city": "Oslo", "unit": "c"})";
  const std::string t = R"({"name": "get_time", "arguments": {"zone": 2})";
  struct Case {
    ChatFamily f;
    std::string two_calls;
  };
  const std::vector<Case> cases = {
      {ChatFamily::kChatML, "<tool_call>\n" + w + "}\n</tool_call>\n<tool_call>\n" + t + "}\n</tool_call>"},
      {ChatFamily::kGemma, "```tool_call\n" + w + "}\n```\n```tool_call\n" + t + "}\n```"},
      {ChatFamily::kMistral, "[" + w + "}, " + t + "}]"},
      {ChatFamily::kLlama3, R"({"name": "get_weather", "parameters": {"city": "Oslo", "unit": "c"}})"
                            "\n"
                            R"({"name": "get_time", "parameters": {"zone": 2}})"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(ChatTemplate::from_family(c.f).name()));
    const ToolCallGrammar g = grammar(c.f, true, 2);
    ToolCallRecognizer r(g);
    EXPECT_FALSE(r.may_end());
    ASSERT_EQ(taken(r, c.two_calls), c.two_calls.size());
    EXPECT_TRUE(r.may_end());
    EXPECT_TRUE(r.complete());  // two calls at most: nothing may follow
    // With one call allowed, the first call ends the output.
    const ToolCallGrammar one = grammar(c.f, true, 1);
    ToolCallRecognizer r1(one);
    const size_t first = c.two_calls.find('\n');
    const std::string first_call = c.f == ChatFamily::kMistral ? "[" + w + "}]"
                                   : c.f == ChatFamily::kLlama3 ? c.two_calls.substr(0, first)
                                   : c.f == ChatFamily::kChatML ? "<tool_call>\n" + w + "}\n</tool_call>"
                                                                : "```tool_call\n" + w + "}\n```";
    EXPECT_EQ(taken(r1, first_call), first_call.size());
    EXPECT_TRUE(r1.complete());
  }
}

TEST(ToolCallGrammar, RefusesUnknownNamesAndArgumentsOutsideTheSchema) {
  const ToolCallGrammar g = grammar(ChatFamily::kChatML, true, 1);
  const std::string lead = "<tool_call>\n{\"name\": \"";
  {
    ToolCallRecognizer r(g);
    EXPECT_EQ(taken(r, lead + "get_wind\""), lead.size() + 5);  // no function starts "get_wi"
  }
  {
    ToolCallRecognizer r(g);
    EXPECT_EQ(taken(r, lead + "get\""), lead.size() + 3);  // a prefix is no name
  }
  {
    const std::string s = lead + R"(get_weather", "arguments": {"unit": "k")";
    ToolCallRecognizer r(g);
    EXPECT_EQ(taken(r, s), s.size() - 2);  // "k" is not in the enum
  }
  {
    const std::string s = lead + R"(get_weather", "arguments": {"unit": "c"})";
    ToolCallRecognizer r(g);
    EXPECT_EQ(taken(r, s), s.size() - 1);  // "city" is required
  }
  {
    const std::string s = lead + R"(get_time", "arguments": {"zone": 1.5)";
    ToolCallRecognizer r(g);
    EXPECT_EQ(taken(r, s), s.size() - 2);  // an integer
  }
  {
    const std::string s = "Sure: " + lead;
    ToolCallRecognizer r(g);
    EXPECT_EQ(taken(r, s), 0u);  // forced: the call from the first byte
  }
}

TEST(ToolCallGrammar, ArgumentValuesAreBounded) {
  const ToolCallGrammar g = grammar(ChatFamily::kChatML, true, 1);
  const std::string head = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"";
  const std::string most(ToolCallRecognizer::kMaxStringBytes - 2, 'a');
  {
    // A string at the bound takes only its closing quote; an escape begun there finishes.
    ToolCallRecognizer r(g);
    ASSERT_EQ(taken(r, head + most + "\\u00e9"), head.size() + most.size() + 6);
    ToolCallRecognizer closed = r;
    EXPECT_TRUE(closed.feed("\", \"unit\": \"c\"}}\n</tool_call>"));
    EXPECT_TRUE(closed.complete());
    EXPECT_FALSE(r.feed('a'));
  }
  {
    const std::string t = "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"zone\": ";
    const std::string digits(ToolCallRecognizer::kMaxDigits, '7');
    ToolCallRecognizer r(g);
    EXPECT_EQ(taken(r, t + digits + "7"), t.size() + digits.size());
    ToolCallRecognizer ws(g);
    EXPECT_EQ(taken(ws, head + "x\",     "), head.size() + 3 + ToolCallRecognizer::kMaxWhitespace);
  }
}

TEST(ToolCallGrammar, AutoIsFreeTextUntilTheMarker) {
  const ToolCallGrammar g = grammar(ChatFamily::kGemma, false, 1);
  ToolCallRecognizer r(g);
  EXPECT_TRUE(r.may_end());
  ASSERT_EQ(taken(r, "Let me look ``that`` up.\n"), 25u);
  EXPECT_FALSE(r.active());
  ASSERT_EQ(taken(r, "```tool_call\n"), 13u);
  EXPECT_TRUE(r.active());
  EXPECT_FALSE(r.may_end());
  EXPECT_EQ(taken(r, "{\"name\": \"get_time\", \"arguments\": {}}\n```"), 41u);
  EXPECT_TRUE(r.complete());
}

std::vector<ToolCallParser::Event> parse(const ToolSyntax& s, bool forced, const std::string& text, bool bytewise) {
  ToolCallParser p(s, forced);
  std::vector<ToolCallParser::Event> out;
  if (bytewise)
    for (char c : text) p.feed(std::string_view(&c, 1), out);
  else
    p.feed(text, out);
  p.finish(out);
  return out;
}

// content, then "name(args)" per call, from the events.
std::vector<std::string> summary(const std::vector<ToolCallParser::Event>& evs) {
  std::vector<std::string> out{""};
  for (const auto& e : evs) {
    if (e.kind == ToolCallParser::Event::kContent) out[0] += e.text;
    else if (e.kind == ToolCallParser::Event::kCallStart) out.push_back(e.text + "|");
    else out.back() += e.text;
  }
  return out;
}

TEST(ToolCallParser, ReadsCallsBackWholeOrByteByByte) {
  const ToolSyntax s = tool_syntax(ChatFamily::kChatML);
  const std::string text = "Checking <tool the weather.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
                           "{\"city\": \"a}\\\"b\", \"n\": [1, {\"x\": 2}]}}\n</tool_call>\n<tool_call>\n{\"name\": "
                           "\"get_time\", \"arguments\": {}}\n</tool_call>";
  const std::vector<std::string> want = {"Checking <tool the weather.\n",
                                         "get_weather|{\"city\": \"a}\\\"b\", \"n\": [1, {\"x\": 2}]}",
                                         "get_time|{}"};
  EXPECT_EQ(summary(parse(s, false, text, false)), want);
  EXPECT_EQ(summary(parse(s, false, text, true)), want);
  // Text that only starts like the marker is content in the end.
  EXPECT_EQ(summary(parse(s, false, "a <tool_ca", true)), std::vector<std::string>{"a <tool_ca"});
  // Forced Mistral: the calls from the first byte, in a list.
  const ToolSyntax m = tool_syntax(ChatFamily::kMistral);
  EXPECT_EQ(summary(parse(m, true, R"([{"name": "f", "arguments": {"a": 1}}, {"name": "g", "arguments": {}}])", true)),
            (std::vector<std::string>{"", "f|{\"a\": 1}", "g|{}"}));
}

TEST(ToolCallGrammar, AutoWithAControlTokenMarkerIsFreeTextUntilOpened) {
  // Mistral: "[" and a call's text are content; only the marker's id opens calls.
  const ToolCallGrammar g = grammar(ChatFamily::kMistral, false, 1);
  ToolCallRecognizer r(g);
  const std::string text = R"(See [1]: [{"name": "get_time", "arguments": {}}])";
  ASSERT_EQ(taken(r, text), text.size());
  EXPECT_FALSE(r.active());
  EXPECT_TRUE(r.may_end());
  ASSERT_TRUE(r.open());
  EXPECT_FALSE(r.open());  // once
  EXPECT_FALSE(r.may_end());
  ToolCallRecognizer brace = r;
  EXPECT_EQ(taken(brace, "{"), 0u);  // the list's bracket first
  ToolCallRecognizer spaced = r;  // a few whitespace bytes may come first (a SentencePiece piece's space)
  EXPECT_EQ(taken(spaced, "    \n"), 4u);
  const std::string call = R"([{"name": "get_time", "arguments": {"zone": 1}}])";
  ASSERT_EQ(taken(r, call), call.size());
  EXPECT_TRUE(r.complete());
  ToolCallRecognizer forced(grammar(ChatFamily::kMistral, true, 1));
  EXPECT_FALSE(forced.open());
}

TEST(ToolCallGrammar, Llama3CallsOpenAtTheAnswersStartWithoutAMarker) {
  const ToolCallGrammar g = grammar(ChatFamily::kLlama3, false, 1);
  {
    ToolCallRecognizer r(g);
    ASSERT_EQ(taken(r, "\n {\"name\""), 9u);
    EXPECT_TRUE(r.active());
    EXPECT_EQ(taken(r, ":\""), 1u);  // the grammar's spacing: ": \""
  }
  {
    ToolCallRecognizer r(g);
    const std::string call = R"({"name": "get_time", "parameters": {"zone": -3}})";
    ASSERT_EQ(taken(r, call), call.size());
    EXPECT_TRUE(r.complete());
  }
  for (const std::string text : {R"(Sure: {"name": "x"})", R"({"names": [1]})", R"({ "name": 2})"}) {
    SCOPED_TRACE(text);
    ToolCallRecognizer r(g);
    ASSERT_EQ(taken(r, text), text.size());  // not a call's lead at the start: free text
    EXPECT_FALSE(r.active());
  }
  // <|python_tag|> opens them anywhere.
  ToolCallRecognizer r(g);
  ASSERT_EQ(taken(r, "Let me check. "), 14u);
  ASSERT_TRUE(r.open());
  const std::string call = R"({"name": "get_weather", "parameters": {"city": "Rome"}})";
  EXPECT_EQ(taken(r, call), call.size());
  EXPECT_TRUE(r.complete());
}

// A byte-level vocab (every byte a token) with the markers as given types.
std::unique_ptr<Tokenizer> marker_vocab(int32_t tool_calls_type, int32_t python_tag_type) {
  std::vector<std::string> tokens;
  for (int i = 0; i < 256; ++i) tokens.push_back(tok::byte_to_unicode(static_cast<uint8_t>(i)));
  tokens.push_back("ab");
  tokens.push_back("[TOOL_CALLS]");
  tokens.push_back("<|python_tag|>");
  tokens.push_back("</s>");
  std::vector<int32_t> types(tokens.size(), 1);
  types[257] = tool_calls_type;
  types[258] = python_tag_type;
  types[259] = 3;
  GgufWriter w;
  w.add_string("general.architecture", "llama");
  w.add_string("tokenizer.ggml.model", "gpt2");
  w.add_string("tokenizer.ggml.pre", "gpt-2");
  w.add_string_array("tokenizer.ggml.tokens", tokens);
  w.add_f32_array("tokenizer.ggml.scores", std::vector<float>(tokens.size(), 0.0f));
  w.add_i32_array("tokenizer.ggml.token_type", types);
  w.add_string_array("tokenizer.ggml.merges", {"a b"});
  w.add_u32("tokenizer.ggml.eos_token_id", 259);
  const std::string path = (std::filesystem::temp_directory_path() /
                            fmt::format("tandem_tool_vocab_{}_{}{}.gguf", ::getpid(), tool_calls_type, python_tag_type))
                               .string();
  w.write(path);
  auto file = GgufFile::open(path);
  auto tok = Tokenizer::from_gguf(*file);
  std::filesystem::remove(path);
  return tok;
}

TEST(ToolCallConstraint, TheMarkersTokenIdOpensCallsInAutoMode) {
  const auto tok = marker_vocab(3, 4);  // [TOOL_CALLS] control, <|python_tag|> user-defined (spelled as text)
  ToolSyntax mistral = tool_syntax(ChatFamily::kMistral);
  EXPECT_EQ(tool_marker_token(mistral, *tok), 257);
  EXPECT_EQ(tool_marker_token(tool_syntax(ChatFamily::kLlama3), *tok), -1);
  EXPECT_EQ(tool_marker_token(tool_syntax(ChatFamily::kChatML), *tok), -1);
  EXPECT_EQ(tool_marker_token(tool_syntax(ChatFamily::kLlama3), *marker_vocab(3, 3)), 258);
  EXPECT_FALSE(mistral.model_opens());  // without the vocab's control token, "auto" has nothing to wait for
  mistral.marker_token = 257;
  EXPECT_TRUE(mistral.model_opens());

  const auto pieces = token_pieces(*tok);
  const auto byte = [&](char c) { return tok->find_token(tok::byte_to_unicode(static_cast<uint8_t>(c))); };
  auto g = std::make_shared<ToolCallGrammar>(grammar(ChatFamily::kMistral, false, 1));
  g->syntax = mistral;
  ToolCallConstraint c(pieces, *tok, g);
  for (char ch : std::string("Hi [")) {
    ASSERT_TRUE(c.allows(byte(ch)));
    c.accept(byte(ch));
  }
  EXPECT_TRUE(c.allows(257));
  EXPECT_TRUE(c.allows(259));  // free text may end
  c.accept(257);
  EXPECT_FALSE(c.allows(257));
  EXPECT_FALSE(c.allows(259));
  EXPECT_FALSE(c.allows(byte('{')));
  for (char ch : std::string(R"([{"name": "get_time", "arguments": {}}])")) {
    ASSERT_TRUE(c.allows(byte(ch))) << ch;
    c.accept(byte(ch));
  }
  EXPECT_TRUE(c.complete());

  auto forced = std::make_shared<ToolCallGrammar>(grammar(ChatFamily::kMistral, true, 1));
  forced->syntax = mistral;
  EXPECT_FALSE(ToolCallConstraint(pieces, *tok, forced).allows(257));  // forced calls carry no marker
}

TEST(ToolCallParser, AControlTokenMarkerOpensCallsWhereItWasGenerated) {
  const ToolSyntax m = tool_syntax(ChatFamily::kMistral);
  const std::string before = "Hi [1] {\"name\": \"f\"} ";
  const std::string calls = R"([{"name": "f", "arguments": {"a": 1}}])";
  const std::vector<std::string> want = {before, "f|{\"a\": 1}"};
  for (bool ahead : {false, true}) {
    for (bool bytewise : {false, true}) {
      SCOPED_TRACE(fmt::format("ahead {} bytewise {}", ahead, bytewise));
      ToolCallParser p(m, false);
      std::vector<ToolCallParser::Event> out;
      const auto feed = [&](const std::string& text) {
        if (!bytewise) return p.feed(text, out);
        for (char c : text) p.feed(std::string_view(&c, 1), out);
      };
      // The marker's offset may come before the text before it (held back by a stop string's check).
      if (ahead) p.open_at(before.size(), out);
      feed(before);
      if (!ahead) p.open_at(before.size(), out);
      feed(" " + calls);  // the grammar lets a space come first
      p.finish(out);
      EXPECT_EQ(summary(out), want);
      EXPECT_EQ(p.calls(), 1);
    }
  }
  // Without the marker the same text is content.
  EXPECT_EQ(summary(parse(m, false, before + calls, true)), std::vector<std::string>{before + calls});
}

TEST(ToolCallParser, Llama3ReadsABareCallAtTheStart) {
  const ToolSyntax l = tool_syntax(ChatFamily::kLlama3);
  for (bool bytewise : {false, true}) {
    EXPECT_EQ(summary(parse(l, false, "\n{\"name\": \"f\", \"parameters\": {\"a\": [1]}}", bytewise)),
              (std::vector<std::string>{"", "f|{\"a\": [1]}"}));
    for (const std::string text : {"Sure: {\"name\": \"f\", \"parameters\": {}}", "{\"names\": 1}", " {\"na"})
      EXPECT_EQ(summary(parse(l, false, text, bytewise)), std::vector<std::string>{text});
  }
}

std::vector<ToolChatMessage> history() {
  return {{"user", "Weather in Oslo?", {}, ""},
          {"assistant", "", {{"call_1", "get_weather", R"({"city":"Oslo"})"}}, ""},
          {"tool", "{\"temp\": 3}", {}, "call_1"}};
}

// Renders as the model's chat template writes tools and results.
TEST(ToolFormat, HistoryRendersInEachFamilysSyntax) {
  const std::vector<ToolFunction> tools = {{"get_weather", "Weather now", R"({"type":"object"})"}};
  {
    const auto t = ChatTemplate::from_family(ChatFamily::kChatML);
    const std::string text = t.apply(tool_conversation(ChatFamily::kChatML, history(),
                                                       describe_tools(ChatFamily::kChatML, tools)), true);
    EXPECT_EQ(text,
              "<|im_start|>system\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
              "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
              "{\"function\":{\"description\":\"Weather now\",\"name\":\"get_weather\",\"parameters\":{\"type\":"
              "\"object\"}},\"type\":\"function\"}\n</tools>\n\nFor each function call, return a json object with "
              "function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": "
              "<function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n"
              "<|im_start|>user\nWeather in Oslo?<|im_end|>\n"
              "<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\":\"Oslo\"}}\n"
              "</tool_call><|im_end|>\n"
              "<|im_start|>user\n<tool_response>\n{\"temp\": 3}\n</tool_response><|im_end|>\n"
              "<|im_start|>assistant\n");
  }
  {
    const auto t = ChatTemplate::from_family(ChatFamily::kLlama3);
    const std::string text = t.apply(tool_conversation(ChatFamily::kLlama3, history(), ""), true);
    EXPECT_EQ(text,
              "<|start_header_id|>user<|end_header_id|>\n\nWeather in Oslo?<|eot_id|>"
              "<|start_header_id|>assistant<|end_header_id|>\n\n<|python_tag|>{\"name\": \"get_weather\", "
              "\"parameters\": {\"city\":\"Oslo\"}}<|eot_id|>"
              "<|start_header_id|>ipython<|end_header_id|>\n\n{\"temp\": 3}<|eot_id|>"
              "<|start_header_id|>assistant<|end_header_id|>\n\n");
  }
  {
    const auto t = ChatTemplate::from_family(ChatFamily::kMistral);
    const std::string text = t.apply(tool_conversation(ChatFamily::kMistral, history(), ""), true);
    EXPECT_EQ(text,
              "[INST] Weather in Oslo?[/INST] [TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": "
              "{\"city\":\"Oslo\"}}]</s>[INST] [TOOL_RESULTS]{\"call_id\":\"call_1\",\"content\":\"{\\\"temp\\\": 3}\"}"
              "[/TOOL_RESULTS][/INST]");
  }
  {
    const auto t = ChatTemplate::from_family(ChatFamily::kGemma);
    const std::string text = t.apply(tool_conversation(ChatFamily::kGemma, history(), ""), true);
    EXPECT_EQ(text,
              "<start_of_turn>user\nWeather in Oslo?<end_of_turn>\n"
              "<start_of_turn>model\n```tool_call\n{\"name\": \"get_weather\", \"arguments\": {\"city\":\"Oslo\"}}\n"
              "```<end_of_turn>\n"
              "<start_of_turn>user\n```tool_output\n{\"temp\": 3}\n```<end_of_turn>\n<start_of_turn>model\n");
  }
}

}  // namespace
}  // namespace tandem

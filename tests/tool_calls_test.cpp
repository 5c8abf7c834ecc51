// Tool calling without a model: the call grammar takes exactly the calls of
// the allowed functions with arguments of their schemas, the parser reads
// the same text back whole or byte by byte, and each family's history
// (assistant calls, tool results) renders in that family's syntax.
#include "chat/tool_format.h"

#include "chat/chat_template.h"
#include "engine/json_schema.h"
#include "engine/tool_call_grammar.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

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

// OpenAI request parsing and validation (no network, no model).
#include "server/openai_schema.h"

#include <gtest/gtest.h>

#include <string>

namespace tandem::server {
namespace {

using nlohmann::json;

ApiRequest completion(const std::string& body) { return parse_request(Endpoint::kCompletions, body); }
ApiRequest chat(const std::string& body) { return parse_request(Endpoint::kChat, body); }

// The ApiError a body raises (status 0 when it parses).
ApiError error_of(Endpoint ep, const std::string& body) {
  try {
    parse_request(ep, body);
  } catch (const ApiError& e) {
    return e;
  }
  return ApiError(0, "parsed", "none");
}

TEST(ServerSchema, CompletionDefaultsAreOpenAIs) {
  const ApiRequest r = completion(R"({"model": "m", "prompt": "Once upon"})");
  EXPECT_EQ(r.endpoint, Endpoint::kCompletions);
  EXPECT_EQ(r.model, "m");
  ASSERT_EQ(r.prompts.size(), 1u);
  EXPECT_EQ(r.prompts[0].text, "Once upon");
  EXPECT_FALSE(r.prompts[0].is_tokens);
  EXPECT_EQ(r.params.max_tokens, 16);
  EXPECT_FLOAT_EQ(r.params.sampling.temperature, 1.0f);
  EXPECT_FLOAT_EQ(r.params.sampling.top_p, 1.0f);
  EXPECT_EQ(r.params.sampling.top_k, 0);
  EXPECT_FLOAT_EQ(r.params.sampling.min_p, 0.0f);
  EXPECT_FLOAT_EQ(r.params.sampling.repeat_penalty, 1.0f);
  EXPECT_EQ(r.params.sampling.seed, 0xFFFFFFFFu);
  EXPECT_EQ(r.params.n, 1);
  EXPECT_EQ(r.params.logprobs, -1);
  EXPECT_TRUE(r.params.stop.empty());
  EXPECT_TRUE(r.params.stop_at_eog);
  EXPECT_FALSE(r.stream);
  EXPECT_FALSE(r.include_usage);
}

TEST(ServerSchema, ChatDefaultsRunToTheContext) {
  const ApiRequest r = chat(R"({"messages": [{"role": "user", "content": "hi"}]})");
  EXPECT_EQ(r.endpoint, Endpoint::kChat);
  EXPECT_EQ(r.model, "");
  ASSERT_EQ(r.messages.size(), 1u);
  EXPECT_EQ(r.messages[0].role, "user");
  EXPECT_EQ(r.messages[0].content, "hi");
  EXPECT_EQ(r.params.max_tokens, -1);
}

TEST(ServerSchema, EverySamplingFieldMaps) {
  const ApiRequest r = completion(R"({
    "prompt": "x", "max_tokens": 40, "temperature": 0.5, "top_p": 0.9, "top_k": 7, "min_p": 0.1,
    "frequency_penalty": 0.25, "presence_penalty": -0.5, "repeat_penalty": 1.1, "repeat_last_n": 32,
    "seed": 42, "n": 3, "stop": ["\n\n", "The end"], "logprobs": 2, "stream": true,
    "stream_options": {"include_usage": true}, "ignore_eos": true, "priority": 5, "user": "ignored",
    "some_future_field": {"a": 1}})");
  EXPECT_EQ(r.params.max_tokens, 40);
  EXPECT_FLOAT_EQ(r.params.sampling.temperature, 0.5f);
  EXPECT_FLOAT_EQ(r.params.sampling.top_p, 0.9f);
  EXPECT_EQ(r.params.sampling.top_k, 7);
  EXPECT_FLOAT_EQ(r.params.sampling.min_p, 0.1f);
  EXPECT_FLOAT_EQ(r.params.sampling.frequency_penalty, 0.25f);
  EXPECT_FLOAT_EQ(r.params.sampling.presence_penalty, -0.5f);
  EXPECT_FLOAT_EQ(r.params.sampling.repeat_penalty, 1.1f);
  EXPECT_EQ(r.params.sampling.repeat_last_n, 32);
  EXPECT_EQ(r.params.sampling.seed, 42u);
  EXPECT_EQ(r.params.n, 3);
  EXPECT_EQ(r.params.stop, (std::vector<std::string>{"\n\n", "The end"}));
  EXPECT_EQ(r.params.logprobs, 2);
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
  EXPECT_FALSE(r.params.stop_at_eog);
  EXPECT_EQ(r.params.priority, 5);
}

TEST(ServerSchema, MaxCompletionTokensWinsAndNullMeansDefault) {
  EXPECT_EQ(chat(R"({"messages": [{"role": "user", "content": "a"}], "max_tokens": 5,
                     "max_completion_tokens": 9})").params.max_tokens, 9);
  const ApiRequest r = completion(R"({"prompt": "x", "temperature": null, "max_tokens": null, "stop": null})");
  EXPECT_FLOAT_EQ(r.params.sampling.temperature, 1.0f);
  EXPECT_EQ(r.params.max_tokens, 16);
  EXPECT_TRUE(r.params.stop.empty());
}

TEST(ServerSchema, StopAsStringAndSeedKeepsAllBits) {
  EXPECT_EQ(completion(R"({"prompt": "x", "stop": "END"})").params.stop, std::vector<std::string>{"END"});
  EXPECT_EQ(completion(R"({"prompt": "x", "seed": -1})").params.sampling.seed, ~uint64_t{0});
  EXPECT_EQ(completion(R"({"prompt": "x", "seed": 18446744073709551615})").params.sampling.seed, ~uint64_t{0});
  EXPECT_EQ(completion(R"({"prompt": "x", "seed": 0})").params.sampling.seed, 0u);
}

TEST(ServerSchema, PromptForms) {
  ApiRequest t = completion(R"({"prompt": ["one prompt"]})");
  ASSERT_EQ(t.prompts.size(), 1u);
  EXPECT_EQ(t.prompts[0].text, "one prompt");
  t = completion(R"({"prompt": [1, 15043, 3186]})");
  ASSERT_EQ(t.prompts.size(), 1u);
  EXPECT_TRUE(t.prompts[0].is_tokens);
  EXPECT_EQ(t.prompts[0].tokens, (std::vector<int32_t>{1, 15043, 3186}));
  t = completion(R"({"prompt": [[5, 6]]})");
  ASSERT_EQ(t.prompts.size(), 1u);
  EXPECT_TRUE(t.prompts[0].is_tokens);
  EXPECT_EQ(t.prompts[0].tokens, (std::vector<int32_t>{5, 6}));
  // An empty string is a valid prompt here: the BOS token may still make it non-empty.
  EXPECT_EQ(completion(R"({"prompt": ""})").prompts.at(0).text, "");
  // Several prompts, in order, as strings or as token lists.
  t = completion(R"({"prompt": ["a", "", "c"], "n": 2})");
  ASSERT_EQ(t.prompts.size(), 3u);
  EXPECT_EQ(t.prompts[0].text, "a");
  EXPECT_EQ(t.prompts[2].text, "c");
  EXPECT_EQ(t.params.n, 2);
  t = completion(R"({"prompt": [[5, 6], [7]]})");
  ASSERT_EQ(t.prompts.size(), 2u);
  EXPECT_EQ(t.prompts[1].tokens, (std::vector<int32_t>{7}));
  // 64 prompts x n = 1 is the most.
  std::string many = R"({"prompt": [)";
  for (int i = 0; i < 64; ++i) many += i ? R"(, "x")" : R"("x")";
  EXPECT_EQ(completion(many + "]}").prompts.size(), 64u);
  const ApiError e = error_of(Endpoint::kCompletions, many + R"(, "x"]})");
  EXPECT_EQ(e.status(), 400);
  EXPECT_NE(std::string(e.what()).find("65 prompts; at most 64"), std::string::npos) << e.what();
}

TEST(ServerSchema, ChatMessages) {
  const ApiRequest r = chat(R"({"messages": [
      {"role": "developer", "content": "Be brief."},
      {"role": "user", "content": [{"type": "text", "text": "Hello, "}, {"type": "text", "text": "there"}]},
      {"role": "assistant", "content": null},
      {"role": "user", "content": "again", "name": "bob"}],
    "logprobs": true, "top_logprobs": 3})");
  ASSERT_EQ(r.messages.size(), 4u);
  EXPECT_EQ(r.messages[0].role, "system");
  EXPECT_EQ(r.messages[0].content, "Be brief.");
  EXPECT_EQ(r.messages[1].content, "Hello, there");
  EXPECT_EQ(r.messages[2].role, "assistant");
  EXPECT_EQ(r.messages[2].content, "");
  EXPECT_EQ(r.params.logprobs, 3);
  EXPECT_EQ(chat(R"({"messages": [{"role": "user", "content": "a"}], "logprobs": true})").params.logprobs, 0);
  EXPECT_EQ(chat(R"({"messages": [{"role": "user", "content": "a"}], "logprobs": false})").params.logprobs, -1);
}

struct BadCase {
  Endpoint ep;
  const char* body;
  const char* param;      // expected "param" of the error
  const char* in_message; // a fragment the message must hold
};

TEST(ServerSchema, BadRequestsAre400NamingTheField) {
  const Endpoint C = Endpoint::kCompletions, H = Endpoint::kChat;
  const BadCase cases[] = {
      {C, R"({"prompt": "x",)", "", "not valid JSON"},
      {C, R"([1, 2])", "", "must be a JSON object"},
      {C, R"("text")", "", "must be a JSON object"},
      {C, R"({})", "prompt", "missing required field 'prompt'"},
      {C, R"({"prompt": 5})", "prompt", "'prompt' must be"},
      {C, R"({"prompt": []})", "prompt", "empty"},
      {C, R"({"prompt": ["a", 5]})", "prompt", "'prompt[1]' is an integer"},
      {C, R"({"prompt": [[1], "b"]})", "prompt", "only strings or only arrays"},
      {C, R"({"prompt": [[1], []]})", "prompt", "'prompt[1]' is empty"},
      {C, R"({"prompt": [[1], [2, "x"]]})", "prompt", "must be integers"},
      {C, R"({"prompt": ["a", "b", "c", "d", "e"], "n": 16})", "n", "80 choices; at most 64"},
      {C, R"({"prompt": [1, "a"]})", "prompt", "must be integers"},
      {C, R"({"prompt": [1, -3]})", "prompt", "out of range"},
      {C, R"({"prompt": [4294967296]})", "prompt", "out of range"},
      {C, R"({"prompt": "x", "model": 3})", "model", "must be a string"},
      {C, R"({"prompt": "x", "max_tokens": -1})", "max_tokens", "between 0 and"},
      {C, R"({"prompt": "x", "session": ""})", "session", "1 to 256 characters"},
      {C, R"({"prompt": "x", "echo": 1})", "echo", "must be a boolean"},
      {H, R"({"messages": [{"role": "user", "content": "a"}], "echo": true})", "echo", "not supported"},
      {C, R"({"prompt": "x", "max_tokens": 1.5})", "max_tokens", "must be an integer"},
      {C, R"({"prompt": "x", "max_tokens": "10"})", "max_tokens", "got a string"},
      {C, R"({"prompt": "x", "max_tokens": 99999999999999999999})", "max_tokens", "must be an integer"},
      {C, R"({"prompt": "x", "max_tokens": 9223372036854775808})", "max_tokens", "between 0 and"},
      {C, R"({"prompt": "x", "temperature": 2.5})", "temperature", "[0, 2]"},
      {C, R"({"prompt": "x", "temperature": -0.1})", "temperature", "[0, 2]"},
      {C, R"({"prompt": "x", "temperature": "hot"})", "temperature", "must be a number"},
      {C, R"({"prompt": "x", "top_p": 0})", "top_p", "(0, 1]"},
      {C, R"({"prompt": "x", "top_p": 1.5})", "top_p", "(0, 1]"},
      {C, R"({"prompt": "x", "top_k": -2})", "top_k", "between -1 and"},
      {C, R"({"prompt": "x", "min_p": 1.5})", "min_p", "[0, 1]"},
      {C, R"({"prompt": "x", "frequency_penalty": 3})", "frequency_penalty", "[-2, 2]"},
      {C, R"({"prompt": "x", "presence_penalty": -2.5})", "presence_penalty", "[-2, 2]"},
      {C, R"({"prompt": "x", "repeat_penalty": 0})", "repeat_penalty", "(0, 10]"},
      {C, R"({"prompt": "x", "n": 17})", "n", "between 1 and 16"},
      {C, R"({"prompt": "x", "n": 0})", "n", "between 1 and 16"},
      {C, R"({"prompt": "x", "seed": 1.5})", "seed", "must be an integer"},
      {C, R"({"prompt": "x", "stop": 5})", "stop", "string or an array"},
      {C, R"({"prompt": "x", "stop": ["a", 1]})", "stop", "must hold strings"},
      {C, R"({"prompt": "x", "logprobs": 21})", "logprobs", "between 0 and 20"},
      {C, R"({"prompt": "x", "logprobs": true})", "logprobs", "must be an integer"},
      {C, R"({"prompt": "x", "stream": "yes"})", "stream", "must be a boolean"},
      {C, R"({"prompt": "x", "stream_options": {"include_usage": true}})", "stream_options", "only allowed"},
      {C, R"({"prompt": "x", "stream": true, "stream_options": 1})", "stream_options", "must be an object"},
      {C, R"({"prompt": "x", "suffix": "end"})", "suffix", "not supported"},
      {C, R"({"prompt": "x", "logit_bias": [1, 2]})", "logit_bias", "must be an object"},
      {C, R"({"prompt": "x", "logit_bias": {"abc": 1}})", "logit_bias", "keys must be token ids"},
      {C, R"({"prompt": "x", "logit_bias": {"-3": 1}})", "logit_bias", "keys must be token ids"},
      {C, R"({"prompt": "x", "logit_bias": {"12x": 1}})", "logit_bias", "keys must be token ids"},
      {C, R"({"prompt": "x", "logit_bias": {"5": 101}})", "logit_bias", "in [-100, 100]"},
      {C, R"({"prompt": "x", "logit_bias": {"5": "1"}})", "logit_bias", "in [-100, 100]"},
      {H, R"({"messages": [{"role": "user", "content": "a"}], "logit_bias": {"5": -101}})", "logit_bias",
       "in [-100, 100]"},
      {C, R"({"prompt": "x", "best_of": 3})", "best_of", "not supported"},
      {H, R"({})", "messages", "missing required field 'messages'"},
      {H, R"({"messages": []})", "messages", "empty"},
      {H, R"({"messages": "hi"})", "messages", "must be an array"},
      {H, R"({"messages": [3]})", "messages", "must be an object"},
      {H, R"({"messages": [{"content": "x"}]})", "messages", "string 'role'"},
      {H, R"({"messages": [{"role": "tool", "content": "x"}]})", "messages[0].tool_call_id", "naming a call"},
      {H, R"({"messages": [{"role": "tool", "content": "x", "tool_call_id": "c9"}]})", "messages[0].tool_call_id",
       "no earlier assistant tool call"},
      {H, R"({"messages": [{"role": "assistant", "tool_calls": [{"id": "c1", "function": {"name": "f",
            "arguments": "[1]"}}]}]})", "messages[0].tool_calls[0].function.arguments", "JSON object"},
      {H, R"({"messages": [{"role": "user", "content": "a"}], "tools": [{"type": "function", "function":
            {"name": "f"}}], "tool_choice": {"type": "function", "function": {"name": "g"}}})", "tool_choice",
       "'g', which is not among 'tools'"},
      {H, R"({"messages": [{"role": "user", "content": "a"}], "tools": [{"type": "function", "function":
            {"name": "f"}}], "logprobs": true})", "logprobs", "tool calling"},
      {H, R"({"messages": [{"role": "user", "content": "a"}], "tools": [{"type": "function", "function":
            {"name": "f"}}, {"type": "function", "function": {"name": "f"}}]})", "tools[1].function.name",
       "given twice"},
      {H, R"({"messages": [{"role": "user", "content": "a"}], "functions": [{"name": "f"}]})", "functions",
       "legacy"},
      {C, R"({"prompt": "x", "tools": [{"type": "function", "function": {"name": "f"}}]})", "tools",
       "chat completions field"},
      {H, R"({"messages": [{"role": "user"}]})", "messages", "needs 'content'"},
      {H, R"({"messages": [{"role": "user", "content": 7}]})", "messages[0].content", "must be a string"},
      {H, R"({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]})",
       "messages[0].content", "image_url"},
      {H, R"({"messages": [{"role": "user", "content": "a"}], "top_logprobs": 2})", "top_logprobs",
       "needs 'logprobs'"},
      {H, R"({"messages": [{"role": "user", "content": "a"}], "logprobs": 1})", "logprobs", "must be a boolean"},
      {H, R"({"messages": [{"role": "user", "content": "a"}], "logprobs": true, "top_logprobs": 21})",
       "top_logprobs", "between 0 and 20"},
      {H, R"({"messages": [{"role": "user", "content": "a"}], "tools": [{"type": "function"}]})",
       "tools[0].function", "must be an object"},
      {H, R"({"messages": [{"role": "user", "content": "a"}], "response_format": {"type": "json_schema"}})",
       "response_format", "needs"},
      {H, R"({"messages": [{"role": "user", "content": "a"}], "response_format": {"type": "json_schema",
            "json_schema": {"name": "x", "schema": {"type": "string", "pattern": "a+"}}}})",
       "response_format", "'pattern' is not supported"},
      {H, R"({"messages": [{"role": "user", "content": "a"}], "response_format": {"type": "grammar"}})",
       "response_format", "only 'text', 'json_object' and 'json_schema'"},
      {H, R"({"messages": [{"role": "user", "content": "a"}], "response_format": "json"})", "response_format",
       "must be an object"},
  };
  for (const BadCase& c : cases) {
    const ApiError e = error_of(c.ep, c.body);
    EXPECT_EQ(e.status(), 400) << c.body;
    EXPECT_EQ(e.type(), "invalid_request_error") << c.body;
    EXPECT_EQ(e.param(), c.param) << c.body;
    EXPECT_NE(std::string(e.what()).find(c.in_message), std::string::npos) << c.body << " -> " << e.what();
  }
}

TEST(ServerSchema, ToolsAndTheirHistory) {
  const ApiRequest r = parse_request(Endpoint::kChat, R"({"messages": [
      {"role": "user", "content": "weather?"},
      {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
        "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}}]},
      {"role": "tool", "tool_call_id": "c1", "content": "3 C"}],
    "tools": [{"type": "function", "function": {"name": "get_weather", "description": "now",
               "parameters": {"properties": {"city": {"type": "string"}}}}},
              {"type": "function", "function": {"name": "noop"}}],
    "tool_choice": {"type": "function", "function": {"name": "noop"}}, "parallel_tool_calls": false})");
  ASSERT_EQ(r.tools.size(), 2u);
  EXPECT_EQ(r.tools[0].description, "now");
  EXPECT_EQ(nlohmann::json::parse(r.tools[0].parameters)["type"], "object");  // implied
  EXPECT_EQ(r.tool_choice, ApiRequest::ToolChoice::kNamed);
  EXPECT_EQ(r.tool_choice_name, "noop");
  EXPECT_FALSE(r.parallel_tool_calls);
  ASSERT_EQ(r.messages.size(), 3u);
  ASSERT_EQ(r.messages[1].tool_calls.size(), 1u);
  EXPECT_EQ(r.messages[1].tool_calls[0].name, "get_weather");
  EXPECT_EQ(r.messages[2].tool_call_id, "c1");
  // tools given, no tool_choice: auto; none given: none.
  EXPECT_EQ(parse_request(Endpoint::kChat, R"({"messages": [{"role": "user", "content": "a"}],
      "tools": [{"type": "function", "function": {"name": "f"}}]})").tool_choice, ApiRequest::ToolChoice::kAuto);
  EXPECT_EQ(parse_request(Endpoint::kChat, R"({"messages": [{"role": "user", "content": "a"}]})").tool_choice,
            ApiRequest::ToolChoice::kNone);
}

TEST(ServerSchema, AcceptedEdgeValues) {
  EXPECT_FLOAT_EQ(completion(R"({"prompt": "x", "temperature": 0})").params.sampling.temperature, 0.0f);
  EXPECT_FLOAT_EQ(completion(R"({"prompt": "x", "temperature": 2})").params.sampling.temperature, 2.0f);
  EXPECT_FLOAT_EQ(completion(R"({"prompt": "x", "top_p": 1})").params.sampling.top_p, 1.0f);
  EXPECT_EQ(completion(R"({"prompt": "x", "top_k": -1})").params.sampling.top_k, -1);
  EXPECT_EQ(completion(R"({"prompt": "x", "n": 16, "best_of": 16})").params.n, 16);
  EXPECT_EQ(completion(R"({"prompt": "x", "logprobs": 0})").params.logprobs, 0);
  EXPECT_FALSE(completion(R"({"prompt": "x", "echo": false, "suffix": "", "logit_bias": {}})").stream);
  // echo: the prompt's logprobs are asked for with the generated ones; max_tokens 0 scores the prompt alone.
  const ApiRequest e = completion(R"({"prompt": "x", "echo": true, "max_tokens": 0, "logprobs": 2})");
  EXPECT_TRUE(e.echo);
  EXPECT_EQ(e.params.max_tokens, 0);
  EXPECT_EQ(e.params.prompt_logprobs, 2);
  EXPECT_EQ(completion(R"({"prompt": "x", "echo": true})").params.prompt_logprobs, -1);
  EXPECT_EQ(completion(R"({"prompt": "x", "logprobs": 2})").params.prompt_logprobs, -1);
  const auto bias = chat(R"({"messages": [{"role": "user", "content": "a"}], "logit_bias": {"7": -100, "3": 2.5}})")
                        .params.sampling.logit_bias;
  ASSERT_EQ(bias.size(), 2u);
  EXPECT_EQ(bias[0], (std::pair<int32_t, float>{3, 2.5f}));  // nlohmann orders the keys
  EXPECT_EQ(bias[1], (std::pair<int32_t, float>{7, -100.0f}));
  EXPECT_TRUE(chat(R"({"messages": [{"role": "user", "content": "a"}], "response_format": {"type": "text"}})")
                  .messages.size() == 1);
  EXPECT_FALSE(completion(R"({"prompt": "x"})").params.json_object);
  EXPECT_TRUE(completion(R"({"prompt": "x", "response_format": {"type": "json_object"}})").params.json_object);
  EXPECT_TRUE(chat(R"({"messages": [{"role": "user", "content": "a"}], "response_format": {"type": "json_object"}})")
                  .params.json_object);
  const auto schema = completion(R"({"prompt": "x", "response_format": {"type": "json_schema", "json_schema":
      {"name": "p", "strict": true, "schema": {"type": "object", "properties": {"a": {"type": "integer"}}}}}})")
                          .params.json_schema;
  ASSERT_TRUE(schema);
  EXPECT_EQ(schema->nodes[schema->root].properties.size(), 1u);
}

TEST(ServerSchema, ErrorJsonShape) {
  const json a = error_json(ApiError(400, "bad 'n'", "invalid_request_error", "n"));
  EXPECT_EQ(a["error"]["message"], "bad 'n'");
  EXPECT_EQ(a["error"]["type"], "invalid_request_error");
  EXPECT_EQ(a["error"]["param"], "n");
  EXPECT_TRUE(a["error"]["code"].is_null());
  const json b = error_json(ApiError(404, "no", "invalid_request_error", "", "model_not_found"));
  EXPECT_TRUE(b["error"]["param"].is_null());
  EXPECT_EQ(b["error"]["code"], "model_not_found");
}

TEST(ServerSchema, DumpJsonReplacesInvalidUtf8) {
  const json j = {{"token", std::string("\xE2\x96")}};  // half of a 3-byte character
  std::string s;
  ASSERT_NO_THROW(s = dump_json(j));
  EXPECT_EQ(s, "{\"token\":\"\xEF\xBF\xBD\"}");
}

}  // namespace
}  // namespace tandem::server

namespace tandem::server {
namespace {

TEST(ServerSchema, TokenizeAndDetokenizeForms) {
  TokenizeRequest v = parse_tokenize(R"({"model": "m", "prompt": "hi"})");  // vLLM: special tokens by default
  EXPECT_EQ(v.model, "m");
  EXPECT_EQ(v.text, "hi");
  EXPECT_TRUE(v.add_special);
  EXPECT_FALSE(parse_tokenize(R"({"prompt": "hi", "add_special_tokens": false})").add_special);
  TokenizeRequest l = parse_tokenize(R"({"content": "yo"})");  // llama.cpp: none by default
  EXPECT_EQ(l.text, "yo");
  EXPECT_FALSE(l.add_special);
  EXPECT_TRUE(parse_tokenize(R"({"content": "yo", "add_special": true})").add_special);
  EXPECT_EQ(parse_detokenize(R"({"tokens": [1, 2, 3]})").tokens, (std::vector<int32_t>{1, 2, 3}));
  for (const char* bad : {R"({})", R"({"prompt": 1})", R"({"content": null})", R"([1])", R"({"prompt": "x", "add_special_tokens": 1})"})
    EXPECT_THROW(parse_tokenize(bad), ApiError) << bad;
  for (const char* bad : {R"({})", R"({"tokens": 1})", R"({"tokens": [1.5]})", R"({"tokens": [-2]})", R"({"tokens": [4294967296]})", "nope"})
    EXPECT_THROW(parse_detokenize(bad), ApiError) << bad;
}

// What one request may ask for: stop strings by count and length, messages
// by count (before any templating), logprob entries by their product.
TEST(ServerSchema, RequestSizeBounds) {
  const auto stops = [](int n, size_t len) {
    json j = {{"prompt", "x"}, {"stop", json::array()}};
    for (int i = 0; i < n; ++i) j["stop"].push_back(std::string(len, 'a' + i));
    return j.dump();
  };
  EXPECT_EQ(completion(stops(4, 256)).params.stop.size(), 4u);
  EXPECT_NE(std::string(error_of(Endpoint::kCompletions, stops(5, 1)).what()).find("5 strings; at most 4"),
            std::string::npos);
  const ApiError long_stop = error_of(Endpoint::kCompletions, stops(2, 30000));
  EXPECT_EQ(long_stop.param(), "stop");
  EXPECT_NE(std::string(long_stop.what()).find("30000 bytes; at most 256"), std::string::npos);
  ParseLimits lim;
  lim.max_stop = 8;
  lim.max_stop_bytes = 40000;
  EXPECT_EQ(parse_request(Endpoint::kCompletions, stops(8, 30000), lim).params.stop.size(), 8u);

  json msgs = {{"messages", json::array()}};
  for (int i = 0; i < 2049; ++i) msgs["messages"].push_back({{"role", "user"}, {"content", "a"}});
  const ApiError many = error_of(Endpoint::kChat, msgs.dump());
  EXPECT_EQ(many.param(), "messages");
  EXPECT_NE(std::string(many.what()).find("2049 messages; at most 2048"), std::string::npos);
  msgs["messages"].erase(msgs["messages"].begin());
  EXPECT_EQ(chat(msgs.dump()).messages.size(), 2048u);

  // 4 prompts x n=16 x 2040 tokens x (1 + 20): the 109-byte request of a 68 MB response.
  const ApiRequest big = completion(R"({"prompt": ["a", "b", "c", "d"], "n": 16, "max_tokens": 2040, "logprobs": 20})");
  try {
    check_logprob_budget(big, {1, 1, 1, 1}, 4096, {});
    ADD_FAILURE() << "accepted";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.param(), "logprobs");
    EXPECT_NE(std::string(e.what()).find("64 choices x 2040 tokens x (1 + 20 logprobs) asks for 2741760"),
              std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(check_logprob_budget(completion(R"({"prompt": "a", "max_tokens": 2040, "n": 16})"), {1}, 4096, {}));
  // No max_tokens: the context; echo: the prompt's tokens too.
  const ApiRequest chat_all = chat(R"({"messages": [{"role": "user", "content": "a"}], "logprobs": true, "top_logprobs": 20})");
  EXPECT_NO_THROW(check_logprob_budget(chat_all, {10}, 32768, {}));
  EXPECT_THROW(check_logprob_budget(chat_all, {10}, 65536, {}), ApiError);
  const ApiRequest echo = completion(R"({"prompt": "a", "max_tokens": 0, "echo": true, "logprobs": 4})");
  lim = {};
  lim.max_logprob_entries = 500;
  EXPECT_NO_THROW(check_logprob_budget(echo, {100}, 4096, lim));
  EXPECT_THROW(check_logprob_budget(echo, {101}, 4096, lim), ApiError);

  EXPECT_EQ(completion(R"({"prompt": "x", "cache_salt": "tenant"})").params.cache_salt, "tenant");
  EXPECT_EQ(error_of(Endpoint::kCompletions, R"({"prompt": "x", "cache_salt": ""})").param(), "cache_salt");
  EXPECT_EQ(error_of(Endpoint::kCompletions, json{{"prompt", "x"}, {"cache_salt", std::string(257, 's')}}.dump()).param(),
            "cache_salt");
}

}  // namespace
}  // namespace tandem::server

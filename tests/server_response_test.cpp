// OpenAI response JSON and SSE framing built from engine events (no network).
#include "server/openai_response.h"

#include <gtest/gtest.h>

#include <limits>
#include <string>

namespace tandem::server {
namespace {

using nlohmann::json;

// Token i spells "t<i>"; token 7 is half a UTF-8 character.
std::string piece(int32_t id) {
  if (id == 7) return "\xE2\x96";
  std::string s = "t";
  s += std::to_string(id);
  return s;
}

ResponseMeta meta(Endpoint ep, bool logprobs = false, bool usage = false) {
  ResponseMeta m;
  m.endpoint = ep;
  m.id = ep == Endpoint::kChat ? "chatcmpl-1" : "cmpl-1";
  m.model = "stories";
  m.created = 1700000000;
  m.logprobs = logprobs;
  m.include_usage = usage;
  return m;
}

RequestEvent event(int32_t choice, const std::string& text, std::vector<int32_t> tokens, bool finished = false,
                   const std::string& reason = "") {
  RequestEvent e;
  e.choice = choice;
  e.text = text;
  e.tokens = tokens;
  for (int32_t t : tokens) e.logprobs.push_back({t, -0.5f * static_cast<float>(t)});
  e.finished = finished;
  e.finish_reason = reason;
  return e;
}

TEST(ServerResponse, ChoiceStateAccumulates) {
  ChoiceState c;
  RequestEvent a = event(0, "Once", {1});
  a.completion_tokens = 1;
  RequestEvent b = event(0, " upon", {2, 3}, true, "length");
  b.completion_tokens = 3;
  c.add(a, {0});
  c.add(b, {4, 6});
  EXPECT_EQ(c.text, "Once upon");
  EXPECT_EQ(c.logprobs.size(), 3u);
  EXPECT_EQ(c.offsets, (std::vector<size_t>{0, 4, 6}));
  EXPECT_TRUE(c.finished);
  EXPECT_EQ(c.finish_reason, "length");
  EXPECT_EQ(c.completion_tokens, 3);
}

TEST(ServerResponse, FullCompletion) {
  ChoiceState a, b;
  a.add(event(0, "Hello", {4, 5}, true, "stop"), {0, 2});
  b.add(event(1, "Bye", {6}, true, "length"), {0});
  const json j = full_response(meta(Endpoint::kCompletions, true), {a, b}, {10, 3, 4}, piece);
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["id"], "cmpl-1");
  EXPECT_EQ(j["model"], "stories");
  EXPECT_EQ(j["created"], 1700000000);
  ASSERT_EQ(j["choices"].size(), 2u);
  EXPECT_EQ(j["choices"][0]["index"], 0);
  EXPECT_EQ(j["choices"][0]["text"], "Hello");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(j["choices"][1]["finish_reason"], "length");
  const json& lp = j["choices"][0]["logprobs"];
  EXPECT_EQ(lp["tokens"], json({"t4", "t5"}));
  EXPECT_EQ(lp["token_logprobs"], json({-2.0, -2.5}));
  EXPECT_EQ(lp["text_offset"], json({0, 2}));
  EXPECT_TRUE(lp["top_logprobs"].is_null());
  EXPECT_EQ(j["usage"]["prompt_tokens"], 10);
  EXPECT_EQ(j["usage"]["completion_tokens"], 3);
  EXPECT_EQ(j["usage"]["total_tokens"], 13);
  EXPECT_EQ(j["usage"]["prompt_tokens_details"]["cached_tokens"], 4);
}

// An echoed prompt's first token has nothing before it to predict it: null
// logprob and null alternatives; the offsets are the caller's.
TEST(ServerResponse, EchoedFirstTokenHasNullLogprob) {
  const json lp = completion_logprobs_json({{1, std::numeric_limits<float>::quiet_NaN()}, {2, -0.25f}},
                                           {{}, {{2, -0.25f}, {3, -1.5f}}}, piece, {0, 2});
  EXPECT_EQ(lp["tokens"], json({"t1", "t2"}));
  EXPECT_TRUE(lp["token_logprobs"][0].is_null());
  EXPECT_EQ(lp["token_logprobs"][1], -0.25);
  EXPECT_TRUE(lp["top_logprobs"][0].is_null());
  EXPECT_EQ(lp["top_logprobs"][1], json({{"t2", -0.25}, {"t3", -1.5}}));
  EXPECT_EQ(lp["text_offset"], json({0, 2}));
}

TEST(ServerResponse, FullChatWithLogprobs) {
  ChoiceState a;
  RequestEvent e = event(0, "Hi", {7, 2}, true, "stop");
  e.top_logprobs = {{{7, -0.1f}, {3, -2.0f}}, {{2, -0.3f}}};
  a.add(e, {0, 1});
  const json j = full_response(meta(Endpoint::kChat, true), {a}, {5, 2, 0}, piece);
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_EQ(j["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(j["choices"][0]["message"]["content"], "Hi");
  const json& content = j["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(content.size(), 2u);
  EXPECT_EQ(content[0]["bytes"], json({0xE2, 0x96}));  // raw bytes survive where the string cannot
  EXPECT_FLOAT_EQ(content[0]["logprob"].get<float>(), -3.5f);
  ASSERT_EQ(content[0]["top_logprobs"].size(), 2u);
  EXPECT_EQ(content[0]["top_logprobs"][1]["token"], "t3");
  EXPECT_EQ(content[1]["token"], "t2");
  // Whole response serializes despite the half character.
  EXPECT_NO_THROW(dump_json(j));
}

TEST(ServerResponse, NoLogprobsUnlessAsked) {
  ChoiceState a;
  a.add(event(0, "x", {1}, true, "stop"), {0});
  EXPECT_TRUE(full_response(meta(Endpoint::kChat), {a}, {}, piece)["choices"][0]["logprobs"].is_null());
  EXPECT_TRUE(full_response(meta(Endpoint::kCompletions), {a}, {}, piece)["choices"][0]["logprobs"].is_null());
}

TEST(ServerResponse, StreamChunks) {
  const ResponseMeta chat = meta(Endpoint::kChat, false, true);
  const json role = role_chunk(chat, 2);
  EXPECT_EQ(role["object"], "chat.completion.chunk");
  EXPECT_EQ(role["choices"][0]["index"], 2);
  EXPECT_EQ(role["choices"][0]["delta"]["role"], "assistant");
  EXPECT_TRUE(role.contains("usage") && role["usage"].is_null());

  const json mid = event_chunk(chat, event(1, " there", {5}), piece, {0});
  EXPECT_EQ(mid["choices"][0]["delta"]["content"], " there");
  EXPECT_TRUE(mid["choices"][0]["finish_reason"].is_null());
  EXPECT_EQ(mid["choices"][0]["index"], 1);

  const json last = event_chunk(chat, event(1, "", {}, true, "stop"), piece, {});
  EXPECT_TRUE(last["choices"][0]["delta"].empty());
  EXPECT_EQ(last["choices"][0]["finish_reason"], "stop");

  const json usage = usage_chunk(chat, {3, 4, 1});
  EXPECT_TRUE(usage["choices"].empty());
  EXPECT_EQ(usage["usage"]["total_tokens"], 7);

  const json comp = event_chunk(meta(Endpoint::kCompletions, true), event(0, "ab", {3, 4}), piece, {10, 12});
  EXPECT_EQ(comp["object"], "text_completion");
  EXPECT_EQ(comp["choices"][0]["text"], "ab");
  EXPECT_EQ(comp["choices"][0]["logprobs"]["text_offset"], json({10, 12}));
  EXPECT_FALSE(comp.contains("usage"));
}

TEST(ServerResponse, SseFraming) {
  EXPECT_EQ(sse_event(json{{"a", 1}}), "data: {\"a\":1}\n\n");
  // Newlines in text are escaped by JSON, so an event never spans lines.
  EXPECT_EQ(sse_event(json{{"t", "x\ny"}}), "data: {\"t\":\"x\\ny\"}\n\n");
}

}  // namespace
}  // namespace tandem::server

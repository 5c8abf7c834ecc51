// JSON from outside is parsed with bounds on nesting and size, checked while
// reading: a body deep enough to overflow any recursive code is refused
// before such code runs.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <string_view>

#include "core/error.h"
#include "runtime/json_parse.h"

namespace tandem {
namespace {

std::string nested(int depth) { return std::string(depth, '[') + std::string(depth, ']'); }

std::string error_of(const std::string& text, const JsonLimits& lim = {}) {
  try {
    parse_json(text, lim);
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
    return e.what();
  }
  return "";
}

TEST(JsonParse, DepthIsBoundedWhileParsing) {
  EXPECT_NO_THROW(parse_json(nested(64)));
  EXPECT_NE(error_of(nested(65)).find("nests deeper than 64 levels"), std::string::npos);
  // 130,000 levels (what crashed a recursive printer) and an unclosed 1 MiB of '['.
  EXPECT_NE(error_of(nested(130000)).find("nests deeper"), std::string::npos);
  EXPECT_NE(error_of(std::string(1 << 20, '[')).find("nests deeper"), std::string::npos);
  EXPECT_NE(error_of("{\"a\":" + nested(70) + "}").find("nests deeper"), std::string::npos);
  JsonLimits lim;
  lim.max_depth = 3;
  EXPECT_NO_THROW(parse_json("{\"a\":[{\"b\":1}]}", lim));
  EXPECT_FALSE(error_of("{\"a\":[{\"b\":[]}]}", lim).empty());
}

TEST(JsonParse, ValueCountIsBounded) {
  JsonLimits lim;
  lim.max_values = 10;
  EXPECT_NO_THROW(parse_json("[1,2,3,4,5,6,7,8,9]", lim));  // the array and nine numbers
  EXPECT_NE(error_of("[1,2,3,4,5,6,7,8,9,10]", lim).find("more than 10 values"), std::string::npos);
}

TEST(JsonParse, SameTreeAsTheLibrary) {
  const std::string text = R"({"prompt":"x","n":2,"f":1.5,"u":18446744073709551615,"a":[true,null,{"k":"v"}],"e":{}})";
  EXPECT_EQ(parse_json(text), nlohmann::json::parse(text));
  EXPECT_EQ(parse_json("\"s\""), nlohmann::json("s"));
  EXPECT_EQ(parse_json("{\"a\":1,\"a\":2}")["a"], 2);
}

TEST(JsonParse, InvalidJsonNamesTheInput) {
  EXPECT_EQ(error_of("{\"a\":"), "the request body is not valid JSON (at byte 5)");
  EXPECT_NE(error_of("[1] x").find("not valid JSON"), std::string::npos);
  EXPECT_NE(error_of("").find("not valid JSON"), std::string::npos);
  try {
    parse_json("nope", {}, "--json-schema");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).rfind("--json-schema", 0), 0u) << e.what();
  }
}

}  // namespace
}  // namespace tandem

namespace tandem {
namespace {

// Differential: on random mutations of JSON texts our parser and nlohmann's
// accept the same documents and build the same trees.
TEST(JsonParse, AgreesWithNlohmannOnMutatedInputs) {
  const std::string seeds[] = {
      R"({"prompt":"Once upon a time","max_tokens":16,"temperature":0.7,"stop":["\n","END"],"logit_bias":{"15":-100}})",
      R"([1,-2,3.5e2,-0,0.25,1e-400,18446744073709551615,18446744073709551616,-9223372036854775809,true,false,null])",
      R"({"s":"caf\u00e9 \ud83d\ude00 \"q\" \\ \/ \b\f\n\r\t","u":"héllo ✓ 𝄞","e":{},"a":[[],[{}]]})",
  };
  std::mt19937 rng(7);
  int both_ok = 0, both_bad = 0;
  for (int iter = 0; iter < 30000; ++iter) {
    std::string s = seeds[iter % 3];
    const int edits = static_cast<int>(rng() % 3);
    for (int e = 0; e < edits && !s.empty(); ++e) {
      const size_t at = rng() % s.size();
      static constexpr std::string_view kReplace = "{}[]\",:0123456789.eE+-\\u tfn\x80\xff\x01";
      static constexpr std::string_view kInsert = "{}[]\",:-.eE\\ ";
      switch (rng() % 4) {
        case 0: s[at] = kReplace[rng() % kReplace.size()]; break;
        case 1: s.insert(at, 1, kInsert[rng() % kInsert.size()]); break;
        case 2: s.erase(at, 1 + rng() % 3); break;
        case 3: s.resize(at); break;
      }
    }
    nlohmann::json theirs;
    bool their_ok = true;
    try {
      theirs = nlohmann::json::parse(s);
    } catch (const nlohmann::json::exception&) {
      their_ok = false;
    }
    nlohmann::json ours;
    bool our_ok = true;
    try {
      ours = parse_json(s);
    } catch (const Error&) {
      our_ok = false;
    }
    ASSERT_EQ(our_ok, their_ok) << s;
    if (our_ok) {
      ASSERT_EQ(ours, theirs) << s;
      // Same kinds of numbers too (integer, unsigned, float).
      ASSERT_EQ(ours.dump(), theirs.dump()) << s;
      ++both_ok;
    } else {
      ++both_bad;
    }
  }
  EXPECT_GT(both_ok, 1000);
  EXPECT_GT(both_bad, 1000);
}

// A large string costs its own size once: decoded into a buffer of its length.
TEST(JsonParse, StringsAreDecodedIntoTheirOwnSize) {
  const std::string big(1 << 20, 'a');
  const nlohmann::json j = parse_json("{\"p\":\"" + big + "\"}");
  EXPECT_EQ(j["p"].get_ref<const std::string&>().capacity(), big.size());
}

}  // namespace
}  // namespace tandem

// The JSON recognizer behind response_format json_object: documents fed byte
// by byte are accepted exactly when they are valid JSON, and refused at the
// first byte that no valid document could have there.
#include "engine/json_grammar.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <random>
#include <string>
#include <vector>

namespace tandem {
namespace {

// Where feeding `doc` fails (its length when every byte is taken).
size_t refused_at(const std::string& doc, JsonRecognizer r = JsonRecognizer()) {
  for (size_t i = 0; i < doc.size(); ++i)
    if (!r.feed(doc[i])) return i;
  return doc.size();
}

std::string cat(std::initializer_list<std::string> parts) {
  std::string out;
  for (const std::string& p : parts) out += p;
  return out;
}

bool accepts_whole(const std::string& doc, JsonRecognizer r = JsonRecognizer()) {
  return r.feed(doc) && r.complete();
}

TEST(JsonGrammar, ValidObjectsAreTakenAndCompleteOnlyAtTheEnd) {
  const std::vector<std::string> docs = {
      "{}",
      "{\"a\":1}",
      " {\n  \"name\": \"Ada\",\n  \"age\": 36, \"tags\": [\"x\", \"y\"], \"ok\": true, \"no\": false, \"nil\": null\n}",
      "{\"n\":[0,-0,12,-3.25,1e5,1E+5,2.5e-3,-0.0e0]}",
      "{\"s\":\"quote \\\" backslash \\\\ slash \\/ \\b\\f\\n\\r\\t \\u00e9\\uD83D\\uDE00 caf\xc3\xa9\"}",
      "{\"deep\":{\"a\":[[[{}]],[]],\"b\":{\"c\":{}}}}",
      "{\"\":\"\"}",
  };
  for (const std::string& d : docs) {
    ASSERT_TRUE(nlohmann::json::accept(d)) << d;  // the test's own premise
    JsonRecognizer r;
    for (size_t i = 0; i < d.size(); ++i) {
      ASSERT_FALSE(r.complete()) << d << " at " << i;
      ASSERT_TRUE(r.feed(d[i])) << d << " refused at " << i;
    }
    EXPECT_TRUE(r.complete()) << d;
    EXPECT_TRUE(r.feed(" \n")) << "whitespace may follow";
    EXPECT_FALSE(r.feed('x')) << "nothing else may";
  }
}

TEST(JsonGrammar, RefusesAtTheFirstImpossibleByte) {
  const std::vector<std::pair<std::string, size_t>> cases = {
      {"[1]", 0},              // json_object: the document must be an object
      {"x", 0},
      {"{,}", 1},
      {"{\"a\" 1}", 5},        // the colon is missing
      {"{\"a\":}", 5},
      {"{\"a\":1,}", 7},       // no trailing comma
      {"{\"a\":01}", 6},       // no leading zero
      {"{\"a\":-}", 6},
      {"{\"a\":1.}", 7},
      {"{\"a\":1e}", 7},
      {"{\"a\":+1}", 5},
      {"{\"a\":tru}", 8},
      {"{\"a\":nul1}", 8},
      {"{\"a\":\"\\x\"}", 7},    // not an escape
      {"{\"a\":\"\\u12g4\"}", 10},
      {"{\"a\":\"line\nbreak\"}", 10},  // raw control character in a string
      {"{\"a\":[1 2]}", 8},
      {"{\"a\":[1}", 7},       // closes the wrong container
      {"{\"a\":1}}", 7},
      {"{\"a\":1} {", 8},
      {"{1:2}", 1},            // keys are strings
  };
  for (const auto& [doc, at] : cases) {
    EXPECT_FALSE(nlohmann::json::accept(doc) && nlohmann::json::parse(doc).is_object()) << doc;
    EXPECT_EQ(refused_at(doc), at) << doc;
  }
}

TEST(JsonGrammar, AnyValueModeAndLimits) {
  JsonRecognizer::Limits any;
  any.object_only = false;
  EXPECT_TRUE(accepts_whole("[1,2]", JsonRecognizer(any)));
  EXPECT_TRUE(accepts_whole("\"s\"", JsonRecognizer(any)));
  EXPECT_TRUE(accepts_whole("-12.5e3", JsonRecognizer(any)));  // a top-level number ends where it may
  EXPECT_FALSE(accepts_whole("-12.5e", JsonRecognizer(any)));
  EXPECT_TRUE(accepts_whole("null", JsonRecognizer(any)));
  // Whitespace runs are bounded outside strings, not inside them.
  // (Joined with cat(): GCC 12 warns falsely on chains of string + string.)
  EXPECT_EQ(refused_at(cat({"{", std::string(21, ' '), "}"})), 21u);
  const std::string padded = cat({"{", std::string(20, ' '), "\"a\"", std::string(20, '\n'), ":1}"});
  EXPECT_EQ(refused_at(padded), padded.size());
  EXPECT_TRUE(accepts_whole(cat({"{\"a\":\"", std::string(100, ' '), "\"}"})));
  // Depth: 64 open containers, not 65.
  EXPECT_TRUE(accepts_whole(cat({"{\"a\":", std::string(63, '['), std::string(63, ']'), "}"})));
  EXPECT_EQ(refused_at(cat({"{\"a\":", std::string(64, '[')})), 5u + 63u);
}

// Random documents (nlohmann's serializer) and random byte mutations of them:
// the recognizer agrees with nlohmann's parser on every one.
TEST(JsonGrammar, AgreesWithAParserOnRandomDocuments) {
  std::mt19937 rng(5);
  auto value = [&](auto& self, int depth) -> nlohmann::json {
    switch (depth > 3 ? rng() % 4 : rng() % 6) {
      case 0: return static_cast<int>(rng() % 2000) - 1000;
      case 1: return std::ldexp(static_cast<double>(rng() % 100000) - 50000, static_cast<int>(rng() % 40) - 20);
      case 2: return std::string(1 + rng() % 5, static_cast<char>('a' + rng() % 26)) + (rng() % 3 ? "" : "\"\n\\");
      case 3: return rng() % 3 == 0 ? nlohmann::json(nullptr) : nlohmann::json(rng() % 2 == 0);
      case 4: {
        nlohmann::json a = nlohmann::json::array();
        for (int i = rng() % 4; i > 0; --i) a.push_back(self(self, depth + 1));
        return a;
      }
      default: {
        nlohmann::json o = nlohmann::json::object();
        for (int i = rng() % 4; i > 0; --i) o[std::string(1, static_cast<char>('a' + rng() % 26))] = self(self, depth + 1);
        return o;
      }
    }
  };
  const std::string alphabet = "{}[]\":,.-+0123456789eEtrufalsn \\/x";
  int valid = 0, invalid = 0;
  for (int i = 0; i < 2000; ++i) {
    nlohmann::json doc = nlohmann::json::object();
    doc["k"] = value(value, 0);
    std::string text = doc.dump(rng() % 2 ? -1 : 1);
    if (i % 2) text[rng() % text.size()] = alphabet[rng() % alphabet.size()];
    bool want = false;
    try {
      want = nlohmann::json::parse(text).is_object();
    } catch (const nlohmann::json::parse_error&) {
    } catch (const nlohmann::json::out_of_range&) {
      continue;  // a mutated exponent beyond double's range: valid JSON, refused by the parser
    }
    EXPECT_EQ(accepts_whole(text), want) << text;
    (want ? valid : invalid)++;
  }
  EXPECT_GT(valid, 1000);
  EXPECT_GT(invalid, 300);
}

}  // namespace
}  // namespace tandem

// The JSON recognizer behind response_format json_object: documents fed byte
// by byte are accepted exactly when they are valid JSON, and refused at the
// first byte that no valid document could have there.
#include "engine/json_grammar.h"

#include "core/error.h"
#include "engine/json_schema.h"

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

// response_format json_schema: the document must also fit the schema; each
// kind of violation is refused at its first byte.
TEST(JsonGrammar, SchemaIsEnforcedByteByByte) {
  const CompiledSchema schema = compile_schema(nlohmann::json::parse(R"({
    "type": "object",
    "title": "Pet",
    "properties": {
      "name": {"type": "string", "description": "any text"},
      "age": {"type": "integer"},
      "score": {"type": "number"},
      "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "minItems": 1, "maxItems": 2},
      "kind": {"$ref": "#/$defs/Kind"},
      "nick": {"type": ["string", "null"]},
      "home": {"type": "object", "properties": {"city": {"const": "Oslo"}}, "required": ["city"],
               "additionalProperties": false}
    },
    "required": ["name", "age", "kind"],
    "$defs": {"Kind": {"enum": ["cat", "dog", 3, true, null]}}
  })"));
  auto rec = [&] { return JsonRecognizer(JsonRecognizer::Limits{}, &schema); };
  for (const std::string doc : {
           R"({"name":"x","age":3,"kind":"cat"})",
           R"({ "age": -2, "name": "y", "kind": 3, "tags": ["a", "b"], "nick": null, "score": 1.5e3 })",
           R"({"kind":null,"name":"","age":0,"nick":"n","home":{"city":"Oslo"}})",
           R"({"kind":true,"name":"q\"r","age":12,"score":-7})",
       }) {
    EXPECT_TRUE(accepts_whole(doc, rec())) << doc;
  }
  const std::vector<std::pair<std::string, size_t>> bad = {
      {R"({"name":"x","age":3})", 19},             // "kind" is required
      {R"({"name":1)", 8},                          // not a string
      {R"({"age":3.5)", 8},                         // not an integer
      {R"({"age":3e2)", 8},
      {R"({"kind":"cow")", 10},                     // no such enum value
      {R"({"kind":"ca")", 11},                      // only part of one
      {R"({"kind":30)", 9},
      {R"({"extra":1)", 2},                         // not a property
      {R"({"name":"a","name")", 14},               // twice
      {R"({"tags":[])", 9},                         // minItems
      {R"({"tags":["a","b",)", 16},                 // maxItems: no comma after the last item
      {R"({"tags":["a","b","a")", 16},
      {R"({"tags":["c")", 10},
      {R"({"home":{"city":"Bergen"})", 17},
      {R"({"home":{}})", 9},
      {R"([1])", 0},                                // the root is an object
  };
  for (const auto& [doc, at] : bad) EXPECT_EQ(refused_at(doc, rec()), at) << doc;
  // additionalProperties false and no properties: only the empty object;
  // without either, any object.
  const CompiledSchema empty = compile_schema(nlohmann::json::parse(R"({"type": "object", "additionalProperties": false})"));
  EXPECT_TRUE(accepts_whole("{ }", JsonRecognizer(JsonRecognizer::Limits{}, &empty)));
  EXPECT_EQ(refused_at(R"({"a":1})", JsonRecognizer(JsonRecognizer::Limits{}, &empty)), 1u);
  const CompiledSchema open = compile_schema(nlohmann::json::parse(R"({"type": "object"})"));
  EXPECT_TRUE(accepts_whole(R"({"a":[1,{"b":null}]})", JsonRecognizer(JsonRecognizer::Limits{}, &open)));
  // Every property given: no comma can follow.
  const std::string full =
      R"({"name":"x","age":3,"score":1,"tags":["a"],"kind":"dog","nick":null,"home":{"city":"Oslo"})";
  EXPECT_EQ(refused_at(full + ",", rec()), full.size());
  EXPECT_TRUE(accepts_whole(full + "}", rec()));
}

TEST(JsonGrammar, SchemaKeywordsOutsideTheSubsetAreRefusedByName) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"type": "string", "pattern": "^a"})", "'pattern' is not supported"},
      {R"({"type": "object", "properties": {"a": {"type": "integer", "minimum": 3}}})", "schema.properties.a"},
      {R"({"$ref": "#/$defs/X"})", "names no definition"},
      {R"({"$ref": "http://x/y"})", "not supported"},
      {R"({"$defs": {"A": {"type": "object", "properties": {"a": {"$ref": "#/$defs/A"}}}}, "$ref": "#/$defs/A"})",
       "recursive"},
      {R"({"type": "object", "properties": {"a": {}}, "required": ["b"]})", "'b' is not among the properties"},
      {R"({"enum": [{"a": 1}]})", "only strings, numbers"},
      {R"({"type": "object", "additionalProperties": {"type": "string"}})", "only true or false"},
      {R"({"type": "text"})", "unknown type 'text'"},
      {R"({"anyOf": [{"type": "string"}]})", "'anyOf' is not supported"},
      {R"({"type": "array", "minItems": 3, "maxItems": 2})", "minItems is above maxItems"},
      {R"({"type": "string", "enum": [1, true]})", "no value of the enum has an allowed type"},
  };
  for (const auto& [schema, msg] : cases) {
    try {
      compile_schema(nlohmann::json::parse(schema));
      ADD_FAILURE() << "accepted: " << schema;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(msg), std::string::npos) << schema << " -> " << e.what();
    }
  }
}

// Levels of 64 properties that each refer to the next level's definition:
// expanded, 4 levels are 64^4 nodes; compiled once per definition, 4 * 64 + 1.
// The shared nodes still enforce the schema at every level.
TEST(JsonGrammar, SchemaRefsCompileOncePerDefinition) {
  const int levels = 4, width = 64;
  nlohmann::json defs = nlohmann::json::object();
  for (int l = 0; l < levels; ++l) {
    nlohmann::json props = nlohmann::json::object();
    for (int p = 0; p < width; ++p)
      props["p" + std::to_string(p)] =
          l + 1 < levels ? nlohmann::json{{"$ref", "#/$defs/L" + std::to_string(l + 1)}} : nlohmann::json{{"type", "integer"}};
    defs["L" + std::to_string(l)] = {{"type", "object"}, {"properties", props}};
  }
  const nlohmann::json schema = {{"$defs", defs}, {"$ref", "#/$defs/L0"}};
  const CompiledSchema c = compile_schema(schema);
  EXPECT_EQ(c.nodes.size(), size_t(1 + levels + width));  // any, one object per level, the last level's leaves
  auto rec = [&] { return JsonRecognizer(JsonRecognizer::Limits{}, &c); };
  EXPECT_TRUE(accepts_whole(R"({"p3":{"p0":{"p63":{"p1":7}},"p1":{}}})", rec()));
  EXPECT_EQ(refused_at(R"({"p3":{"p0":{"p63":{"p1":"x"}}}})", rec()), 25u);  // a leaf is an integer
  EXPECT_EQ(refused_at(R"({"p3":{"q":1}})", rec()), 8u);                     // not a property of L1
  // A reference back to a definition being compiled is recursion, refused at once.
  const nlohmann::json mutual = nlohmann::json::parse(
      R"({"$defs": {"A": {"type": "object", "properties": {"b": {"$ref": "#/$defs/B"}}},
                    "B": {"type": "object", "properties": {"a": {"$ref": "#/$defs/A"}}}}, "$ref": "#/$defs/A"})");
  try {
    compile_schema(mutual);
    ADD_FAILURE() << "a recursive schema was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("recursive"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tandem

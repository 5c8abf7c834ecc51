#include "engine/json_schema.h"

#include <algorithm>
#include <set>
#include <unordered_map>

#include "core/error.h"

namespace tandem {
namespace {

using nlohmann::json;

constexpr size_t kMaxProperties = 64, kMaxLiterals = 64;
constexpr int kMaxRefDepth = 32;
// Each definition compiles once, so the table grows with the schema's text;
// this bounds it whatever the text (a node is a few hundred bytes at most).
constexpr size_t kMaxNodes = 65536;

const std::set<std::string>& ignored_keywords() {
  static const std::set<std::string> k = {"title", "description", "default", "examples", "format", "$schema",
                                          "$id", "$comment", "$defs", "definitions", "strict", "deprecated",
                                          "readOnly", "writeOnly"};
  return k;
}

uint8_t type_bit(const std::string& t, const std::string& where) {
  if (t == "object") return SchemaNode::kObject;
  if (t == "array") return SchemaNode::kArray;
  if (t == "string") return SchemaNode::kString;
  if (t == "number") return SchemaNode::kNumber | SchemaNode::kInteger;
  if (t == "integer") return SchemaNode::kInteger;
  if (t == "boolean") return SchemaNode::kBoolean;
  if (t == "null") return SchemaNode::kNull;
  fail(ErrorKind::kInvalidArgument, "{}: unknown type '{}'", where, t);
}

uint8_t literal_type(const json& v) {
  if (v.is_string()) return SchemaNode::kString;
  if (v.is_boolean()) return SchemaNode::kBoolean;
  if (v.is_null()) return SchemaNode::kNull;
  return v.is_number_integer() ? SchemaNode::kInteger : SchemaNode::kNumber;
}

class Compiler {
 public:
  explicit Compiler(const json& root) : root_(root) { out_.nodes.emplace_back(); }  // node 0: any value

  CompiledSchema run() {
    out_.root = node(root_, "schema", 0);
    return std::move(out_);
  }

 private:
  const json& resolve(const std::string& ref, const std::string& where) const {
    for (const char* prefix : {"#/$defs/", "#/definitions/"}) {
      const std::string p = prefix;
      if (ref.rfind(p, 0) != 0) continue;
      const json* defs = root_.contains(p.substr(2, p.size() - 3)) ? &root_[p.substr(2, p.size() - 3)] : nullptr;
      const std::string name = ref.substr(p.size());
      if (defs && defs->is_object() && defs->contains(name)) return (*defs)[name];
      fail(ErrorKind::kInvalidArgument, "{}: '$ref' {} names no definition", where, ref);
    }
    fail(ErrorKind::kInvalidArgument, "{}: '$ref' {} is not supported (only #/$defs/NAME and #/definitions/NAME)",
         where, ref);
  }

  int32_t node(const json& s, const std::string& where, int depth) {
    if (depth > kMaxRefDepth)
      fail(ErrorKind::kInvalidArgument, "{}: the schema nests too deeply (a recursive '$ref'?)", where);
    if (s.is_boolean()) {
      if (!s.get<bool>()) fail(ErrorKind::kInvalidArgument, "{}: the schema 'false' allows nothing", where);
      return 0;
    }
    if (!s.is_object()) fail(ErrorKind::kInvalidArgument, "{}: a schema must be an object", where);
    if (s.contains("$ref")) {
      if (s.size() > 1 && !std::all_of(s.items().begin(), s.items().end(), [](const auto& kv) {
            return kv.key() == "$ref" || ignored_keywords().count(kv.key());
          }))
        fail(ErrorKind::kInvalidArgument, "{}: keywords beside '$ref' are not supported", where);
      if (!s["$ref"].is_string()) fail(ErrorKind::kInvalidArgument, "{}: '$ref' must be a string", where);
      // A definition is one node however often it is referred to: levels of
      // properties that all refer to the next level would otherwise expand
      // exponentially. Nodes are immutable once compiled, so sharing is safe.
      const json& def = resolve(s["$ref"].get<std::string>(), where);
      if (auto it = compiled_.find(&def); it != compiled_.end()) {
        if (it->second < 0)
          fail(ErrorKind::kInvalidArgument, "{}: '$ref' {} refers to itself (recursive schemas are not supported)",
               where, s["$ref"].get<std::string>());
        return it->second;
      }
      compiled_[&def] = -1;  // in progress: a reference back to it is recursion
      const int32_t id = node(def, where, depth + 1);
      compiled_[&def] = id;
      return id;
    }
    SchemaNode n;
    for (const auto& [key, v] : s.items()) {
      if (ignored_keywords().count(key)) continue;
      const std::string at = where + "." + key;
      if (key == "type") {
        n.types = 0;
        if (v.is_string()) {
          n.types = type_bit(v.get<std::string>(), at);
        } else if (v.is_array() && !v.empty()) {
          for (const json& t : v) {
            if (!t.is_string()) fail(ErrorKind::kInvalidArgument, "{}: types must be strings", at);
            n.types |= type_bit(t.get<std::string>(), at);
          }
        } else {
          fail(ErrorKind::kInvalidArgument, "{}: must be a type name or a list of them", at);
        }
      } else if (key == "enum" || key == "const") {
        const json values = key == "const" ? json::array({v}) : v;
        if (!values.is_array() || values.empty() || values.size() > kMaxLiterals)
          fail(ErrorKind::kInvalidArgument, "{}: must be a list of 1 to {} values", at, kMaxLiterals);
        for (const json& lit : values) {
          if (lit.is_object() || lit.is_array())
            fail(ErrorKind::kInvalidArgument, "{}: only strings, numbers, booleans and null are supported", at);
          n.literals.push_back(lit.dump());
        }
      } else if (key == "properties") {
        if (!v.is_object() || v.size() > kMaxProperties)
          fail(ErrorKind::kInvalidArgument, "{}: must be an object of at most {} properties", at, kMaxProperties);
        n.closed = true;
        for (const auto& [name, sub] : v.items()) n.properties.emplace_back(name, 0);
      } else if (key == "required") {
        if (!v.is_array()) fail(ErrorKind::kInvalidArgument, "{}: must be a list of property names", at);
      } else if (key == "additionalProperties") {
        if (!v.is_boolean())
          fail(ErrorKind::kInvalidArgument, "{}: only true or false is supported (a schema is not)", at);
      } else if (key == "items") {
        n.items = -1;  // filled below, once n is in place
      } else if (key == "minItems" || key == "maxItems") {
        if (!v.is_number_unsigned() || v.get<uint64_t>() > INT32_MAX)
          fail(ErrorKind::kInvalidArgument, "{}: must be a non-negative integer", at);
        (key == "minItems" ? n.min_items : n.max_items) = static_cast<int32_t>(v.get<uint64_t>());
      } else {
        fail(ErrorKind::kInvalidArgument, "{}: '{}' is not supported", where, key);
      }
    }
    // "additionalProperties": false without properties: the empty object only.
    if (s.contains("additionalProperties") && s["additionalProperties"] == false) n.closed = true;
    if (n.min_items > n.max_items) fail(ErrorKind::kInvalidArgument, "{}: minItems is above maxItems", where);
    if (!n.literals.empty() && n.types != SchemaNode::kAnyType) {
      // Only the values of an allowed type can ever be written.
      std::erase_if(n.literals, [&](const std::string& lit) { return !(n.types & literal_type(json::parse(lit))); });
      if (n.literals.empty())
        fail(ErrorKind::kInvalidArgument, "{}: no value of the enum has an allowed type", where);
    }
    if (s.contains("required")) {
      for (const json& r : s["required"]) {
        if (!r.is_string()) fail(ErrorKind::kInvalidArgument, "{}.required: names must be strings", where);
        auto it = std::find_if(n.properties.begin(), n.properties.end(),
                               [&](const auto& p) { return p.first == r.get<std::string>(); });
        if (it == n.properties.end())
          fail(ErrorKind::kInvalidArgument, "{}.required: '{}' is not among the properties", where,
               r.get<std::string>());
        n.required |= uint64_t{1} << (it - n.properties.begin());
      }
    }
    if (out_.nodes.size() >= kMaxNodes)
      fail(ErrorKind::kInvalidArgument, "{}: the schema compiles to more than {} nodes", where, kMaxNodes);
    const int32_t id = static_cast<int32_t>(out_.nodes.size());
    out_.nodes.push_back(n);
    // Children after the parent is in place (the vector may grow).
    for (size_t i = 0; i < n.properties.size(); ++i) {
      const std::string& name = n.properties[i].first;
      const int32_t child = node(s["properties"][name], where + ".properties." + name, depth + 1);
      out_.nodes[id].properties[i].second = child;
    }
    if (n.items < 0) out_.nodes[id].items = node(s["items"], where + ".items", depth + 1);
    return id;
  }

  const json& root_;
  CompiledSchema out_;
  std::unordered_map<const json*, int32_t> compiled_;  // definition -> its node; -1 while compiling
};

}  // namespace

CompiledSchema compile_schema(const json& schema) { return Compiler(schema).run(); }

}  // namespace tandem

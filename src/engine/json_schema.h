// The part of JSON Schema that constrained decoding enforces
// (response_format json_schema), compiled into a table of nodes that
// JsonRecognizer walks alongside the document. Supported: "type" (one or a
// list), "properties" + "required" (an object with properties takes only
// those, each at most once, in any order; "additionalProperties" may be
// false, or absent), "items", "minItems", "maxItems", "enum", "const", and
// "$ref" into "$defs" / "definitions" (not recursive; each definition is
// compiled once and shared by every reference to it). Annotations (title,
// description, default, examples, format, $schema) are ignored. Anything else
// is refused by name rather than silently not enforced.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace tandem {

struct SchemaNode {
  // Allowed value types, bits of JsonType; kAnyType: all.
  enum JsonType : uint8_t { kObject = 1, kArray = 2, kString = 4, kNumber = 8, kInteger = 16, kBoolean = 32, kNull = 64 };
  static constexpr uint8_t kAnyType = 127;
  uint8_t types = kAnyType;
  // Objects: with properties, only these keys (at most 64); node of each value.
  std::vector<std::pair<std::string, int32_t>> properties;
  uint64_t required = 0;  // bit i: properties[i]
  bool closed = false;    // properties were given (or additionalProperties is false)
  // Arrays: the items' node (0: any value) and the count bounds.
  int32_t items = 0;
  int32_t min_items = 0;
  int32_t max_items = INT32_MAX;
  // enum / const: the allowed values as compact JSON text (at most 64).
  std::vector<std::string> literals;
};

struct CompiledSchema {
  std::vector<SchemaNode> nodes;  // nodes[0]: any value
  int32_t root = 0;
};

// Throws tandem::Error (kInvalidArgument) naming the unsupported keyword or
// the malformed part, e.g. "schema.properties.age: 'minimum' is not supported".
CompiledSchema compile_schema(const nlohmann::json& schema);

}  // namespace tandem

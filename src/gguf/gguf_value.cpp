// GgufValue helpers and the typed metadata getters of GgufFile.
#include <cmath>
#include <limits>

#include "core/error.h"
#include "gguf/gguf.h"

namespace tandem {

std::string_view gguf_type_name(GgufType t) {
  switch (t) {
    case GgufType::UINT8: return "u8";
    case GgufType::INT8: return "i8";
    case GgufType::UINT16: return "u16";
    case GgufType::INT16: return "i16";
    case GgufType::UINT32: return "u32";
    case GgufType::INT32: return "i32";
    case GgufType::FLOAT32: return "f32";
    case GgufType::BOOL: return "bool";
    case GgufType::STRING: return "str";
    case GgufType::ARRAY: return "arr";
    case GgufType::UINT64: return "u64";
    case GgufType::INT64: return "i64";
    case GgufType::FLOAT64: return "f64";
  }
  return "?";
}

bool GgufValue::is_integer() const {
  switch (type) {
    case GgufType::UINT8: case GgufType::INT8: case GgufType::UINT16: case GgufType::INT16:
    case GgufType::UINT32: case GgufType::INT32: case GgufType::UINT64: case GgufType::INT64:
      return true;
    default:
      return false;
  }
}

bool GgufValue::is_float() const {
  return type == GgufType::FLOAT32 || type == GgufType::FLOAT64;
}

namespace {

// Quotes a string so control bytes and quotes stay visible on one line.
std::string quote(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20 || c == 0x7f) out += fmt::format("\\x{:02x}", c);
        else out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

std::string type_label(const GgufValue& v) {
  if (v.type != GgufType::ARRAY) return std::string(gguf_type_name(v.type));
  return fmt::format("arr[{}]", gguf_type_name(v.elem_type));
}

// Integer value of an integer-typed GgufValue, or nullopt when it does not fit int64.
std::optional<int64_t> as_int64(const GgufValue& v) {
  if (const auto* u = std::get_if<uint64_t>(&v.v)) {
    if (*u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return std::nullopt;
    return static_cast<int64_t>(*u);
  }
  if (const auto* i = std::get_if<int64_t>(&v.v)) return *i;
  return std::nullopt;
}

}  // namespace

std::string GgufValue::to_display(size_t max_array_elems) const {
  if (const auto* u = std::get_if<uint64_t>(&v)) return fmt::format("{}", *u);
  if (const auto* i = std::get_if<int64_t>(&v)) return fmt::format("{}", *i);
  if (const auto* d = std::get_if<double>(&v)) {
    // f32 values print at f32 precision so 1e-5 stays 1e-05, not 9.99999974e-06.
    if (type == GgufType::FLOAT32) return fmt::format("{}", static_cast<float>(*d));
    return fmt::format("{}", *d);
  }
  if (const auto* b = std::get_if<bool>(&v)) return *b ? "true" : "false";
  if (const auto* s = std::get_if<std::string>(&v)) return quote(*s);
  const std::vector<GgufValue> arr = array_elements(max_array_elems);
  const size_t n = array_size();
  std::string out = "[";
  for (size_t i = 0; i < arr.size(); ++i) {
    if (i) out += ", ";
    out += arr[i].to_display(max_array_elems);
  }
  if (arr.size() < n) out += fmt::format("{}... ({} elements)", arr.empty() ? "" : ", ", n);
  return out + "]";
}

const GgufValue* GgufFile::find(std::string_view key) const {
  for (const auto& kv : kvs_)
    if (kv.key == key) return &kv.value;
  return nullptr;
}

const GgufTensor* GgufFile::find_tensor(std::string_view name) const {
  for (const auto& t : tensors_)
    if (t.name == name) return &t;
  return nullptr;
}

std::optional<int64_t> GgufFile::get_int(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v) return std::nullopt;
  if (!v->is_integer())
    fail(ErrorKind::kInvalidFile, "{}: key '{}' has type {}, expected an integer", path_, key,
         type_label(*v));
  auto r = as_int64(*v);
  if (!r)
    fail(ErrorKind::kInvalidFile, "{}: key '{}' value {} does not fit in int64", path_, key,
         v->to_display());
  return r;
}

std::optional<double> GgufFile::get_float(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v) return std::nullopt;
  if (v->is_float()) return std::get<double>(v->v);
  if (v->is_integer()) {
    if (const auto* u = std::get_if<uint64_t>(&v->v)) return static_cast<double>(*u);
    return static_cast<double>(std::get<int64_t>(v->v));
  }
  fail(ErrorKind::kInvalidFile, "{}: key '{}' has type {}, expected a float", path_, key,
       type_label(*v));
}

std::optional<bool> GgufFile::get_bool(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v) return std::nullopt;
  if (v->type != GgufType::BOOL)
    fail(ErrorKind::kInvalidFile, "{}: key '{}' has type {}, expected bool", path_, key,
         type_label(*v));
  return std::get<bool>(v->v);
}

std::optional<std::string> GgufFile::get_string(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v) return std::nullopt;
  if (v->type != GgufType::STRING)
    fail(ErrorKind::kInvalidFile, "{}: key '{}' has type {}, expected str", path_, key,
         type_label(*v));
  return std::get<std::string>(v->v);
}

bool GgufFile::for_each_string(std::string_view key, const std::function<void(std::string_view)>& f) const {
  const GgufValue* v = find(key);
  if (!v) return false;
  if (v->type != GgufType::ARRAY || v->elem_type != GgufType::STRING)
    fail(ErrorKind::kInvalidFile, "{}: key '{}' has type {}, expected arr[str]", path_, key,
         type_label(*v));
  v->for_each_element([&](GgufValue&& e) {
    f(std::get<std::string>(e.v));
    return true;
  });
  return true;
}

std::optional<std::vector<std::string>> GgufFile::get_string_array(std::string_view key) const {
  std::vector<std::string> out;
  if (!for_each_string(key, [&](std::string_view s) { out.emplace_back(s); })) return std::nullopt;
  return out;
}

std::optional<std::vector<float>> GgufFile::get_float_array(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v) return std::nullopt;
  if (v->type != GgufType::ARRAY ||
      (v->elem_type != GgufType::FLOAT32 && v->elem_type != GgufType::FLOAT64))
    fail(ErrorKind::kInvalidFile, "{}: key '{}' has type {}, expected arr[f32]", path_, key,
         type_label(*v));
  std::vector<float> out;
  out.reserve(v->array_size());
  v->for_each_element([&](GgufValue&& e) {
    out.push_back(static_cast<float>(std::get<double>(e.v)));
    return true;
  });
  return out;
}

std::optional<std::vector<int64_t>> GgufFile::get_int_array(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v) return std::nullopt;
  const bool int_elems = v->type == GgufType::ARRAY && [&] {
    GgufValue probe;
    probe.type = v->elem_type;
    return probe.is_integer();
  }();
  if (!int_elems)
    fail(ErrorKind::kInvalidFile, "{}: key '{}' has type {}, expected an integer array", path_,
         key, type_label(*v));
  std::vector<int64_t> out;
  out.reserve(v->array_size());
  v->for_each_element([&](GgufValue&& e) {
    auto r = as_int64(e);
    if (!r)
      fail(ErrorKind::kInvalidFile, "{}: key '{}' element {} does not fit in int64", path_, key, out.size());
    out.push_back(*r);
    return true;
  });
  return out;
}

}  // namespace tandem

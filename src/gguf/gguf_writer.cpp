// GGUF v3 writer. Values are checked against their declared types before
// anything is written, so a writer bug cannot produce a file the reader rejects.
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>

#include "core/error.h"
#include "gguf/gguf.h"

namespace tandem {
namespace {

constexpr uint64_t kDefaultAlignment = 32;

template <typename T>
void put(std::vector<uint8_t>& out, T v) {
  const size_t at = out.size();
  out.resize(at + sizeof(T));
  std::memcpy(out.data() + at, &v, sizeof(T));
}

void put_string(std::vector<uint8_t>& out, const std::string& s) {
  put<uint64_t>(out, s.size());
  out.insert(out.end(), s.begin(), s.end());
}

template <typename T>
T checked_int(const GgufValue& v, std::string_view key) {
  if (const auto* u = std::get_if<uint64_t>(&v.v)) {
    if (*u <= static_cast<uint64_t>(std::numeric_limits<T>::max())) return static_cast<T>(*u);
  } else if (const auto* i = std::get_if<int64_t>(&v.v)) {
    if (*i >= static_cast<int64_t>(std::numeric_limits<T>::min()) &&
        (*i < 0 || static_cast<uint64_t>(*i) <= static_cast<uint64_t>(std::numeric_limits<T>::max())))
      return static_cast<T>(*i);
  } else {
    fail(ErrorKind::kInvalidArgument, "GgufWriter: key '{}': {} value does not hold an integer",
         key, gguf_type_name(v.type));
  }
  fail(ErrorKind::kInvalidArgument, "GgufWriter: key '{}': value {} does not fit in {}", key,
       v.to_display(), gguf_type_name(v.type));
}

double checked_float(const GgufValue& v, std::string_view key) {
  if (const auto* d = std::get_if<double>(&v.v)) return *d;
  fail(ErrorKind::kInvalidArgument, "GgufWriter: key '{}': {} value does not hold a float", key,
       gguf_type_name(v.type));
}

void put_value(std::vector<uint8_t>& out, const GgufValue& v, std::string_view key) {
  switch (v.type) {
    case GgufType::UINT8: put(out, checked_int<uint8_t>(v, key)); return;
    case GgufType::INT8: put(out, checked_int<int8_t>(v, key)); return;
    case GgufType::UINT16: put(out, checked_int<uint16_t>(v, key)); return;
    case GgufType::INT16: put(out, checked_int<int16_t>(v, key)); return;
    case GgufType::UINT32: put(out, checked_int<uint32_t>(v, key)); return;
    case GgufType::INT32: put(out, checked_int<int32_t>(v, key)); return;
    case GgufType::UINT64: put(out, checked_int<uint64_t>(v, key)); return;
    case GgufType::INT64: put(out, checked_int<int64_t>(v, key)); return;
    case GgufType::FLOAT32: put(out, static_cast<float>(checked_float(v, key))); return;
    case GgufType::FLOAT64: put(out, checked_float(v, key)); return;
    case GgufType::BOOL: {
      const auto* b = std::get_if<bool>(&v.v);
      if (!b) fail(ErrorKind::kInvalidArgument, "GgufWriter: key '{}': bool value is not a bool", key);
      put<uint8_t>(out, *b ? 1 : 0);
      return;
    }
    case GgufType::STRING: {
      const auto* s = std::get_if<std::string>(&v.v);
      if (!s)
        fail(ErrorKind::kInvalidArgument, "GgufWriter: key '{}': str value is not a string", key);
      put_string(out, *s);
      return;
    }
    case GgufType::ARRAY: {
      if (const auto* packed = std::get_if<GgufPackedArray>(&v.v)) {
        // Bytes a reader validated, in the file's own encoding.
        put<uint32_t>(out, static_cast<uint32_t>(v.elem_type));
        put<uint64_t>(out, packed->n);
        out.insert(out.end(), packed->bytes.begin(), packed->bytes.end());
        return;
      }
      const auto* arr = std::get_if<std::vector<GgufValue>>(&v.v);
      if (!arr)
        fail(ErrorKind::kInvalidArgument, "GgufWriter: key '{}': array value is not a vector", key);
      put<uint32_t>(out, static_cast<uint32_t>(v.elem_type));
      put<uint64_t>(out, arr->size());
      for (const auto& e : *arr) {
        if (e.type != v.elem_type)
          fail(ErrorKind::kInvalidArgument,
               "GgufWriter: key '{}': array of {} holds a {} element", key,
               gguf_type_name(v.elem_type), gguf_type_name(e.type));
        put_value(out, e, key);
      }
      return;
    }
  }
  fail(ErrorKind::kInvalidArgument, "GgufWriter: key '{}': unknown value type {}", key,
       static_cast<uint32_t>(v.type));
}

uint64_t pad_to(uint64_t n, uint64_t align) { return (n + align - 1) / align * align; }

}  // namespace

namespace {

// Packed arrays that view a file's bytes get copies of them (the writer may
// outlive that file).
void own_packed_bytes(GgufValue& v) {
  if (auto* p = std::get_if<GgufPackedArray>(&v.v)) {
    if (!p->owned) {
      auto copy = std::make_shared<const std::vector<uint8_t>>(p->bytes.begin(), p->bytes.end());
      p->bytes = std::span<const uint8_t>(*copy);
      p->owned = std::move(copy);
    }
  } else if (auto* a = std::get_if<std::vector<GgufValue>>(&v.v)) {
    for (GgufValue& e : *a) own_packed_bytes(e);
  }
}

}  // namespace

void GgufWriter::add(std::string key, GgufValue value) {
  if (key.empty()) fail(ErrorKind::kInvalidArgument, "GgufWriter: empty key");
  for (const auto& kv : kvs_)
    if (kv.key == key) fail(ErrorKind::kInvalidArgument, "GgufWriter: duplicate key '{}'", key);
  own_packed_bytes(value);
  kvs_.push_back({std::move(key), std::move(value)});
}

void GgufWriter::add_string(std::string key, std::string v) {
  add(std::move(key), GgufValue{GgufType::STRING, GgufType::UINT8, std::move(v)});
}
void GgufWriter::add_u32(std::string key, uint32_t v) {
  add(std::move(key), GgufValue{GgufType::UINT32, GgufType::UINT8, uint64_t{v}});
}
void GgufWriter::add_i32(std::string key, int32_t v) {
  add(std::move(key), GgufValue{GgufType::INT32, GgufType::UINT8, int64_t{v}});
}
void GgufWriter::add_f32(std::string key, float v) {
  add(std::move(key), GgufValue{GgufType::FLOAT32, GgufType::UINT8, double{v}});
}
void GgufWriter::add_bool(std::string key, bool v) {
  add(std::move(key), GgufValue{GgufType::BOOL, GgufType::UINT8, v});
}

void GgufWriter::add_string_array(std::string key, const std::vector<std::string>& v) {
  std::vector<GgufValue> elems;
  elems.reserve(v.size());
  for (const auto& s : v) elems.push_back(GgufValue{GgufType::STRING, GgufType::UINT8, s});
  add(std::move(key), GgufValue{GgufType::ARRAY, GgufType::STRING, std::move(elems)});
}
void GgufWriter::add_f32_array(std::string key, const std::vector<float>& v) {
  std::vector<GgufValue> elems;
  elems.reserve(v.size());
  for (float f : v) elems.push_back(GgufValue{GgufType::FLOAT32, GgufType::UINT8, double{f}});
  add(std::move(key), GgufValue{GgufType::ARRAY, GgufType::FLOAT32, std::move(elems)});
}
void GgufWriter::add_i32_array(std::string key, const std::vector<int32_t>& v) {
  std::vector<GgufValue> elems;
  elems.reserve(v.size());
  for (int32_t i : v) elems.push_back(GgufValue{GgufType::INT32, GgufType::UINT8, int64_t{i}});
  add(std::move(key), GgufValue{GgufType::ARRAY, GgufType::INT32, std::move(elems)});
}

uint64_t GgufWriter::check_tensor(const std::string& name, GgmlType type,
                                  const std::vector<int64_t>& dims) const {
  if (name.empty() || name.size() > 63)
    fail(ErrorKind::kInvalidArgument, "GgufWriter: tensor name '{}' must be 1..63 bytes", name);
  for (const auto& t : tensors_)
    if (t.name == name) fail(ErrorKind::kInvalidArgument, "GgufWriter: duplicate tensor '{}'", name);
  if (!type_traits(static_cast<uint32_t>(type)))
    fail(ErrorKind::kInvalidArgument, "GgufWriter: tensor '{}': unknown type id {}", name,
         static_cast<uint32_t>(type));
  if (dims.empty() || dims.size() > 4)
    fail(ErrorKind::kInvalidArgument, "GgufWriter: tensor '{}' has {} dims (must be 1..4)", name,
         dims.size());
  int64_t n = 1;
  for (int64_t d : dims)
    if (d <= 0 || __builtin_mul_overflow(n, d, &n))
      fail(ErrorKind::kInvalidArgument, "GgufWriter: tensor '{}' has a bad dimension {}", name, d);
  const TypeTraits& tt = type_traits(type);
  if (dims[0] % tt.block_elems != 0)
    fail(ErrorKind::kInvalidArgument,
         "GgufWriter: tensor '{}': ne[0] = {} is not a multiple of the {} block size {}", name,
         dims[0], tt.name, tt.block_elems);
  return row_bytes(type, dims[0]) * static_cast<uint64_t>(n / dims[0]);
}

void GgufWriter::add_tensor(std::string name, GgmlType type, std::vector<int64_t> dims,
                            std::vector<uint8_t> data) {
  const uint64_t expect = check_tensor(name, type, dims);
  if (data.size() != expect)
    fail(ErrorKind::kInvalidArgument, "GgufWriter: tensor '{}' has {} bytes of data, expected {}",
         name, data.size(), expect);
  tensors_.push_back({std::move(name), type, std::move(dims), std::move(data), expect, true});
}

void GgufWriter::add_tensor_info(std::string name, GgmlType type, std::vector<int64_t> dims) {
  const uint64_t n_bytes = check_tensor(name, type, dims);
  tensors_.push_back({std::move(name), type, std::move(dims), {}, n_bytes, false});
}

void GgufWriter::require_data() const {
  for (const auto& t : tensors_)
    if (!t.has_data)
      fail(ErrorKind::kInvalidArgument,
           "GgufWriter: tensor '{}' was declared without data; stream it after header()", t.name);
}

// Everything before the data section, including the padding up to it.
static std::vector<uint8_t> header_bytes(uint64_t alignment, const std::vector<GgufKV>& kvs_in,
                                         const std::vector<uint64_t>& offsets,
                                         const std::vector<std::string>& names,
                                         const std::vector<GgmlType>& types,
                                         const std::vector<std::vector<int64_t>>& dims) {
  if (alignment == 0 || (alignment & (alignment - 1)) != 0 ||
      alignment > std::numeric_limits<uint32_t>::max())
    fail(ErrorKind::kInvalidArgument, "GgufWriter: alignment {} is not a u32 power of two",
         alignment);
  std::vector<GgufKV> kvs = kvs_in;
  bool have_align = false;
  for (const auto& kv : kvs) {
    if (kv.key != "general.alignment") continue;
    have_align = true;
    const auto* u = std::get_if<uint64_t>(&kv.value.v);
    if (kv.value.type != GgufType::UINT32 || !u || *u != alignment)
      fail(ErrorKind::kInvalidArgument,
           "GgufWriter: key 'general.alignment' must be a u32 equal to the writer alignment {}",
           alignment);
  }
  if (!have_align && alignment != kDefaultAlignment)
    kvs.push_back({"general.alignment", GgufValue{GgufType::UINT32, GgufType::UINT8, alignment}});

  std::vector<uint8_t> out;
  put<uint32_t>(out, 0x46554747);  // "GGUF"
  put<uint32_t>(out, 3);
  put<uint64_t>(out, names.size());
  put<uint64_t>(out, kvs.size());
  for (const auto& kv : kvs) {
    put_string(out, kv.key);
    put<uint32_t>(out, static_cast<uint32_t>(kv.value.type));
    put_value(out, kv.value, kv.key);
  }
  for (size_t i = 0; i < names.size(); ++i) {
    put_string(out, names[i]);
    put<uint32_t>(out, static_cast<uint32_t>(dims[i].size()));
    for (int64_t d : dims[i]) put<int64_t>(out, d);
    put<uint32_t>(out, static_cast<uint32_t>(types[i]));
    put<uint64_t>(out, offsets[i]);
  }
  out.resize(pad_to(out.size(), alignment), 0);
  return out;
}

std::vector<uint8_t> GgufWriter::header() const {
  std::vector<uint64_t> offsets;
  std::vector<std::string> names;
  std::vector<GgmlType> types;
  std::vector<std::vector<int64_t>> dims;
  uint64_t off = 0;
  for (const auto& t : tensors_) {
    offsets.push_back(off);
    names.push_back(t.name);
    types.push_back(t.type);
    dims.push_back(t.dims);
    off = pad_to(off + t.n_bytes, alignment_);
  }
  return header_bytes(alignment_, kvs_, offsets, names, types, dims);
}

std::vector<uint8_t> GgufWriter::to_bytes() const {
  require_data();
  std::vector<uint64_t> offsets;
  std::vector<std::string> names;
  std::vector<GgmlType> types;
  std::vector<std::vector<int64_t>> dims;
  uint64_t off = 0;
  for (const auto& t : tensors_) {
    offsets.push_back(off);
    names.push_back(t.name);
    types.push_back(t.type);
    dims.push_back(t.dims);
    off = pad_to(off + t.n_bytes, alignment_);
  }
  std::vector<uint8_t> out = header_bytes(alignment_, kvs_, offsets, names, types, dims);
  const size_t data_start = out.size();
  out.resize(data_start + off, 0);
  for (size_t i = 0; i < tensors_.size(); ++i)
    std::memcpy(out.data() + data_start + offsets[i], tensors_[i].data.data(),
                tensors_[i].data.size());
  return out;
}

void GgufWriter::write(const std::string& path) const {
  // Streams the tensor data so a large model is not held twice in memory.
  require_data();
  std::vector<uint64_t> offsets;
  std::vector<std::string> names;
  std::vector<GgmlType> types;
  std::vector<std::vector<int64_t>> dims;
  uint64_t off = 0;
  for (const auto& t : tensors_) {
    offsets.push_back(off);
    names.push_back(t.name);
    types.push_back(t.type);
    dims.push_back(t.dims);
    off = pad_to(off + t.n_bytes, alignment_);
  }
  const std::vector<uint8_t> head = header_bytes(alignment_, kvs_, offsets, names, types, dims);

  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) fail(ErrorKind::kIo, "{}: cannot create: {}", path, std::strerror(errno));
  bool ok = std::fwrite(head.data(), 1, head.size(), f) == head.size();
  static const uint8_t zeros[4096] = {};
  for (size_t i = 0; ok && i < tensors_.size(); ++i) {
    const auto& d = tensors_[i].data;
    ok = std::fwrite(d.data(), 1, d.size(), f) == d.size();
    uint64_t pad = pad_to(d.size(), alignment_) - d.size();
    while (ok && pad > 0) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(pad, sizeof zeros));
      ok = std::fwrite(zeros, 1, n, f) == n;
      pad -= n;
    }
  }
  const int e = errno;
  if (std::fclose(f) != 0) ok = false;
  if (!ok) {
    std::remove(path.c_str());
    fail(ErrorKind::kIo, "{}: write failed: {}", path, std::strerror(e));
  }
}

}  // namespace tandem

#include "gguf/inspect.h"

#include <algorithm>
#include <limits>

#include <fmt/ranges.h>

#include "gguf/gguf.h"

namespace tandem {

namespace {

std::string type_label(const GgufValue& v) {
  if (v.type != GgufType::ARRAY) return std::string(gguf_type_name(v.type));
  return fmt::format("arr[{}; {}]", gguf_type_name(v.elem_type), v.array_size());
}

// Long strings (chat templates) are cut at a UTF-8 boundary in the short form.
std::string display(const GgufValue& v, size_t max_elems, bool full) {
  constexpr size_t kMaxString = 160;
  const auto* s = std::get_if<std::string>(&v.v);
  if (full || !s || s->size() <= kMaxString) return v.to_display(max_elems);
  size_t cut = kMaxString;
  while (cut > 0 && (static_cast<unsigned char>((*s)[cut]) & 0xC0) == 0x80) --cut;
  GgufValue head = v;
  head.v = s->substr(0, cut);
  return fmt::format("{}... ({} bytes)", head.to_display(max_elems), s->size());
}

}  // namespace

std::string describe_gguf(const GgufFile& f, bool full_arrays) {
  const size_t max_elems = full_arrays ? std::numeric_limits<size_t>::max() : 8;
  std::string out;
  fmt::format_to(std::back_inserter(out),
                 "file:        {}\nversion:     GGUF v{}\nfile size:   {} bytes\n"
                 "alignment:   {}\ndata offset: {}\n",
                 f.path(), f.version(), f.file_size(), f.alignment(), f.data_offset());

  fmt::format_to(std::back_inserter(out), "\nmetadata ({} keys):\n", f.metadata().size());
  size_t key_w = 0, type_w = 0;
  for (const auto& kv : f.metadata()) {
    key_w = std::max(key_w, kv.key.size());
    type_w = std::max(type_w, type_label(kv.value).size());
  }
  for (const auto& kv : f.metadata())
    fmt::format_to(std::back_inserter(out), "  {:<{}}  {:<{}}  {}\n", kv.key, key_w,
                   type_label(kv.value), type_w, display(kv.value, max_elems, full_arrays));

  uint64_t total = 0;
  for (const auto& t : f.tensors()) total += t.n_bytes;
  fmt::format_to(std::back_inserter(out), "\ntensors ({}, {} bytes of data):\n",
                 f.tensors().size(), total);
  if (f.tensors().empty()) return out;
  size_t name_w = 4, dims_w = 4;
  std::vector<std::string> dims;
  for (const auto& t : f.tensors()) {
    name_w = std::max(name_w, t.name.size());
    dims.push_back(fmt::format("[{}]", fmt::join(t.dims, ", ")));
    dims_w = std::max(dims_w, dims.back().size());
  }
  fmt::format_to(std::back_inserter(out), "  {:<{}}  {:<5}  {:<{}}  {:>12}  {:>12}\n", "name",
                 name_w, "type", "dims", dims_w, "offset", "bytes");
  for (size_t i = 0; i < f.tensors().size(); ++i) {
    const GgufTensor& t = f.tensors()[i];
    fmt::format_to(std::back_inserter(out), "  {:<{}}  {:<5}  {:<{}}  {:>12}  {:>12}\n", t.name,
                   name_w, type_traits(t.type).name, dims[i], dims_w, t.offset, t.n_bytes);
  }
  return out;
}

}  // namespace tandem

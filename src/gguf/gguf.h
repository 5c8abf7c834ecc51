// GGUF files (v2, v3): a validated, memory-mapped view of the metadata and the
// tensor table. Every count, length, offset and size is checked against the
// file before use; a malformed file throws tandem::Error(kInvalidFile) naming
// the problem and the key or tensor. Tensor data is never copied.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "quant/ggml_type.h"

namespace tandem {

enum class GgufType : uint32_t {
  UINT8 = 0, INT8 = 1, UINT16 = 2, INT16 = 3, UINT32 = 4, INT32 = 5,
  FLOAT32 = 6, BOOL = 7, STRING = 8, ARRAY = 9, UINT64 = 10, INT64 = 11, FLOAT64 = 12,
};
std::string_view gguf_type_name(GgufType t);

struct GgufValue;

// A flat array (numbers, bools or strings) as read from a file: its n
// elements exactly as serialized there, already validated: a view of the
// file's own bytes costs no memory, where a GgufValue per element of a large
// vocabulary's arrays took tens of MB (they are read from
// the mapping, which GgufFile::release_metadata_pages gives back once the
// tokenizer is built). `bytes` points into the file (valid while the
// GgufFile lives) or into `owned`: GgufWriter::add copies a view it is
// given, so that a writer may outlive the file it copied keys from.
struct GgufPackedArray {
  uint64_t n = 0;
  std::span<const uint8_t> bytes;
  std::shared_ptr<const std::vector<uint8_t>> owned;
};

// One metadata value. Scalars are held by value; arrays hold their elements
// (arrays of arrays are allowed by the format and supported), or, when read
// from a file and flat, their packed bytes: use the array_* accessors, which
// serve both.
struct GgufValue {
  GgufType type = GgufType::UINT8;
  GgufType elem_type = GgufType::UINT8;  // for ARRAY
  std::variant<uint64_t, int64_t, double, bool, std::string, std::vector<GgufValue>, GgufPackedArray> v;

  size_t array_size() const;  // 0 when not an array
  // Calls f on each element in order until it returns false.
  void for_each_element(const std::function<bool(GgufValue&&)>& f) const;
  // The first min(max, array_size()) elements.
  std::vector<GgufValue> array_elements(size_t max = SIZE_MAX) const;

  bool is_integer() const;  // any of the 8 integer types
  bool is_float() const;    // FLOAT32/FLOAT64
  std::string to_display(size_t max_array_elems = 8) const;  // for `tandem inspect`
};

struct GgufKV {
  std::string key;
  GgufValue value;
};

struct GgufTensor {
  std::string name;
  GgmlType type;
  std::vector<int64_t> dims;  // ne[0] first (ne[0] is the contiguous dimension)
  int64_t n_elements = 0;
  uint64_t offset = 0;        // relative to the start of the data section
  uint64_t n_bytes = 0;
  const uint8_t* data = nullptr;  // points into the mapping
  int64_t rows() const { return dims.empty() ? 1 : n_elements / dims[0]; }
};

class GgufFile {
 public:
  // Maps and validates the file. Throws tandem::Error.
  static std::unique_ptr<GgufFile> open(const std::string& path);
  // Validates an in-memory image (used by tests and fuzzing); the buffer must
  // outlive the returned object.
  static std::unique_ptr<GgufFile> from_memory(const uint8_t* data, size_t size,
                                               std::string name = "<memory>");
  ~GgufFile();
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }
  uint64_t file_size() const { return size_; }

  const std::vector<GgufKV>& metadata() const { return kvs_; }
  const GgufValue* find(std::string_view key) const;

  // Typed lookups: nullopt when absent; throw kInvalidFile when present with
  // the wrong type (the message names the key and both types). Integer getters
  // accept any integer type whose value fits.
  std::optional<int64_t> get_int(std::string_view key) const;
  std::optional<double> get_float(std::string_view key) const;  // also accepts integers
  std::optional<bool> get_bool(std::string_view key) const;
  std::optional<std::string> get_string(std::string_view key) const;
  std::optional<std::vector<std::string>> get_string_array(std::string_view key) const;
  // The elements of an arr[str] key in order, without a vector of them (a
  // 262k-token vocabulary); false when the key is absent.
  bool for_each_string(std::string_view key, const std::function<void(std::string_view)>& f) const;
  std::optional<std::vector<float>> get_float_array(std::string_view key) const;
  std::optional<std::vector<int64_t>> get_int_array(std::string_view key) const;

  // Tells the kernel the mapped bytes [p, p + n) will not be read for a
  // while (their weights were copied elsewhere): whole pages inside the range
  // leave this process's resident memory and come back from the page cache
  // if touched again. A no-op for files opened from memory.
  void release_pages(const uint8_t* p, size_t n) const;
  // release_pages for everything before the tensor data (the metadata, whose
  // packed arrays are read from the mapping: done after parsing, and worth
  // doing again once they have been read, e.g. into a tokenizer).
  void release_metadata_pages() const { release_pages(base_, static_cast<size_t>(data_offset_)); }
  // release_pages for the whole file: what is read later faults back in.
  void release_all_pages() const { release_pages(base_, static_cast<size_t>(size_)); }
  // Copies the mapped bytes [p, p + n) to dst by reading the file, so that
  // none of them becomes resident in this process: scattered reads such as
  // embedding rows (a fault maps the whole page-cache folio around it, up to
  // 2 MiB). A plain copy for files opened from memory.
  void copy_out(const uint8_t* p, size_t n, uint8_t* dst) const;

  const std::vector<GgufTensor>& tensors() const { return tensors_; }
  const GgufTensor* find_tensor(std::string_view name) const;

 private:
  GgufFile() = default;
  void parse();

  std::string path_;
  const uint8_t* base_ = nullptr;
  uint64_t size_ = 0;
  void* mapping_ = nullptr;  // non-null when we own an mmap
  int fd_ = -1;              // the mapped file, for copy_out
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  std::vector<GgufKV> kvs_;
  std::vector<GgufTensor> tensors_;
};

// Writes GGUF v3 files (convert, synth, tests). Keys and tensors are written in
// the order added; tensor data is aligned to `alignment`.
class GgufWriter {
 public:
  explicit GgufWriter(uint64_t alignment = 32) : alignment_(alignment) {}
  void add(std::string key, GgufValue value);
  void add_string(std::string key, std::string v);
  void add_u32(std::string key, uint32_t v);
  void add_i32(std::string key, int32_t v);
  void add_f32(std::string key, float v);
  void add_bool(std::string key, bool v);
  void add_string_array(std::string key, const std::vector<std::string>& v);
  void add_f32_array(std::string key, const std::vector<float>& v);
  void add_i32_array(std::string key, const std::vector<int32_t>& v);
  // `data` must hold exactly the bytes of a tensor of this type and shape.
  void add_tensor(std::string name, GgmlType type, std::vector<int64_t> dims,
                  std::vector<uint8_t> data);
  // Declares a tensor without its bytes, for a caller that streams the data
  // itself (tandem quantize): it writes header() and then each tensor's
  // row_bytes x rows bytes in order, each padded with zeros to alignment().
  // write() and to_bytes() refuse a writer that holds declared-only tensors.
  void add_tensor_info(std::string name, GgmlType type, std::vector<int64_t> dims);
  // Everything before the data section, including the padding up to it.
  std::vector<uint8_t> header() const;
  uint64_t alignment() const { return alignment_; }
  void write(const std::string& path) const;  // throws kIo on failure
  // The whole file image in memory (tests, small files).
  std::vector<uint8_t> to_bytes() const;

 private:
  struct PendingTensor {
    std::string name;
    GgmlType type;
    std::vector<int64_t> dims;
    std::vector<uint8_t> data;
    uint64_t n_bytes = 0;     // the tensor's size (data.size() when held)
    bool has_data = true;     // false: declared by add_tensor_info
  };
  // Checks name, type and shape; returns the tensor's byte count.
  uint64_t check_tensor(const std::string& name, GgmlType type, const std::vector<int64_t>& dims) const;
  void require_data() const;
  uint64_t alignment_;
  std::vector<GgufKV> kvs_;
  std::vector<PendingTensor> tensors_;
};

}  // namespace tandem

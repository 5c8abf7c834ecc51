// GGUF reader: maps the file and validates every field before it is used.
// Bounds checks are written as "n > remaining" so they cannot overflow.
#include "gguf/gguf.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <unordered_set>

#include <fmt/ranges.h>

#include "core/error.h"

namespace tandem {
namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" read as little-endian u32
constexpr int kMaxArrayDepth = 8;
constexpr uint64_t kMaxKeyLen = 65535;   // the spec's limit for keys
constexpr uint64_t kMaxTensorNameLen = 63;  // ggml's GGML_MAX_NAME - 1

// Smallest encodings, used to reject counts the remaining bytes cannot hold
// before anything is allocated for them.
constexpr uint64_t kMinKvBytes = 8 + 4 + 1;                 // empty key, type, u8 value
constexpr uint64_t kMinTensorInfoBytes = 8 + 4 + 8 + 4 + 8;  // name len, n_dims, 1 dim, type, offset

std::optional<uint64_t> scalar_size(GgufType t) {
  switch (t) {
    case GgufType::UINT8: case GgufType::INT8: case GgufType::BOOL: return 1;
    case GgufType::UINT16: case GgufType::INT16: return 2;
    case GgufType::UINT32: case GgufType::INT32: case GgufType::FLOAT32: return 4;
    case GgufType::UINT64: case GgufType::INT64: case GgufType::FLOAT64: return 8;
    default: return std::nullopt;
  }
}

// Bytes the smallest element of type `t` takes inside an array.
uint64_t min_elem_size(GgufType t) {
  if (auto s = scalar_size(t)) return *s;
  if (t == GgufType::STRING) return 8;
  return 4 + 8;  // nested array: element type + length
}

class Reader {
 public:
  Reader(const uint8_t* data, uint64_t size, const std::string& name)
      : data_(data), size_(size), name_(name) {}

  uint64_t pos() const { return pos_; }
  uint64_t remaining() const { return size_ - pos_; }

  void need(uint64_t n, std::string_view what) const {
    if (n > remaining())
      fail(ErrorKind::kInvalidFile,
           "{}: file truncated: {} at offset {} needs {} bytes but only {} remain", name_, what,
           pos_, n, remaining());
  }

  template <typename T>
  T read(std::string_view what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, data_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }

  void skip(uint64_t n, std::string_view what) {
    need(n, what);
    pos_ += n;
  }
  void skip_string(std::string_view what) { pos_ += string_length(what, UINT64_MAX); }
  const uint8_t* at(uint64_t pos) const { return data_ + pos; }

  // A u64-length-prefixed string; `max_len` rejects absurd lengths early.
  std::string read_string(std::string_view what, uint64_t max_len = UINT64_MAX) {
    const uint64_t len = string_length(what, max_len);
    std::string s(reinterpret_cast<const char*>(data_ + pos_), static_cast<size_t>(len));
    pos_ += len;
    return s;
  }

 private:
  // Reads a string's length and checks that its bytes follow.
  uint64_t string_length(std::string_view what, uint64_t max_len) {
    const uint64_t len = read<uint64_t>(what);
    if (len > max_len)
      fail(ErrorKind::kInvalidFile, "{}: {} has string length {} (limit {})", name_, what, len,
           max_len);
    if (len > remaining())
      fail(ErrorKind::kInvalidFile,
           "{}: {} has string length {} but only {} bytes remain in the file", name_, what, len,
           remaining());
    return len;
  }

  const uint8_t* data_;
  uint64_t size_;
  uint64_t pos_ = 0;
  const std::string& name_;
};

// A scalar or string value of type t at r. The spec calls any bool but 0/1
// invalid; the error names `key`.
GgufValue read_flat_value(Reader& r, GgufType t, std::string_view what, std::string_view key,
                          const std::string& name) {
  GgufValue v;
  v.type = t;
  switch (t) {
    case GgufType::UINT8: v.v = uint64_t{r.read<uint8_t>(what)}; break;
    case GgufType::INT8: v.v = int64_t{r.read<int8_t>(what)}; break;
    case GgufType::UINT16: v.v = uint64_t{r.read<uint16_t>(what)}; break;
    case GgufType::INT16: v.v = int64_t{r.read<int16_t>(what)}; break;
    case GgufType::UINT32: v.v = uint64_t{r.read<uint32_t>(what)}; break;
    case GgufType::INT32: v.v = int64_t{r.read<int32_t>(what)}; break;
    case GgufType::UINT64: v.v = r.read<uint64_t>(what); break;
    case GgufType::INT64: v.v = r.read<int64_t>(what); break;
    case GgufType::FLOAT32: v.v = double{r.read<float>(what)}; break;
    case GgufType::FLOAT64: v.v = r.read<double>(what); break;
    case GgufType::BOOL: {
      const uint8_t b = r.read<uint8_t>(what);
      if (b > 1) fail(ErrorKind::kInvalidFile, "{}: key '{}' has bool value {} (must be 0 or 1)", name, key, b);
      v.v = b == 1;
      break;
    }
    case GgufType::STRING: v.v = r.read_string(what); break;
    case GgufType::ARRAY: fail(ErrorKind::kInvalidArgument, "{}: key '{}': an array where a flat value belongs", name, key);
  }
  return v;
}

class Parser {
 public:
  Parser(Reader& r, const std::string& name) : r_(r), name_(name) {}

  GgufType read_type(std::string_view key, std::string_view role) {
    const uint32_t id = r_.read<uint32_t>(role);
    if (id > static_cast<uint32_t>(GgufType::FLOAT64))
      fail(ErrorKind::kInvalidFile, "{}: key '{}' has unknown {} id {}", name_, key, role, id);
    return static_cast<GgufType>(id);
  }

  GgufValue read_value(GgufType t, std::string_view key, int depth) {
    const std::string what = fmt::format("value of key '{}'", key);
    if (t != GgufType::ARRAY) return read_flat_value(r_, t, what, key, name_);
    if (depth >= kMaxArrayDepth)
      fail(ErrorKind::kInvalidFile, "{}: key '{}' has arrays nested deeper than {}", name_, key,
           kMaxArrayDepth);
    GgufValue v;
    v.type = t;
    v.elem_type = read_type(key, "array element type");
    const uint64_t n = r_.read<uint64_t>(what);
    const uint64_t min = min_elem_size(v.elem_type);
    if (n > r_.remaining() / min)
      fail(ErrorKind::kInvalidFile,
           "{}: key '{}' has array length {} of {} that cannot fit in the {} bytes left", name_,
           key, n, gguf_type_name(v.elem_type), r_.remaining());
    if (v.elem_type == GgufType::ARRAY) {
      std::vector<GgufValue> elems;
      elems.reserve(static_cast<size_t>(n));
      for (uint64_t i = 0; i < n; ++i) elems.push_back(read_value(v.elem_type, key, depth + 1));
      v.v = std::move(elems);
      return v;
    }
    // Flat: validated in place, then viewed where it lies.
    const uint64_t start = r_.pos();
    if (v.elem_type == GgufType::STRING) {
      for (uint64_t i = 0; i < n; ++i) r_.skip_string(what);
    } else if (v.elem_type == GgufType::BOOL) {
      for (uint64_t i = 0; i < n; ++i) read_flat_value(r_, GgufType::BOOL, what, key, name_);
    } else {
      r_.skip(n * min, what);  // n * min fits: checked above
    }
    v.v = GgufPackedArray{n, std::span<const uint8_t>(r_.at(start), r_.at(r_.pos())), nullptr};
    return v;
  }

 private:
  Reader& r_;
  const std::string& name_;
};

std::string dims_str(const std::vector<int64_t>& d) {
  return fmt::format("[{}]", fmt::join(d, ", "));
}

}  // namespace

std::unique_ptr<GgufFile> GgufFile::open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail(ErrorKind::kIo, "{}: cannot open: {}", path, std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int e = errno;
    ::close(fd);
    fail(ErrorKind::kIo, "{}: cannot stat: {}", path, std::strerror(e));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    fail(ErrorKind::kInvalidFile, "{}: not a regular file", path);
  }
  if (st.st_size == 0) {
    ::close(fd);
    fail(ErrorKind::kInvalidFile, "{}: file is empty (truncated?), not a GGUF file", path);
  }
  void* m = ::mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ, MAP_PRIVATE, fd, 0);
  if (m == MAP_FAILED) {
    const int e = errno;
    ::close(fd);
    fail(ErrorKind::kIo, "{}: cannot mmap: {}", path, std::strerror(e));
  }
  // No PMD mappings of the file. A file read with read() (cat, a copy, a
  // download) sits in the page cache in large folios, up to 2 MiB, and a
  // fault on one 2 MiB folio maps all of it: reading a norm vector of a few
  // KB, or a 1 MB q6_K matrix decode reads from the file, then keeps up to
  // 4 MiB of its neighbours resident. Decode from the file's layout reads
  // as fast either way. Advice only.
  ::madvise(m, static_cast<size_t>(st.st_size), MADV_NOHUGEPAGE);

  std::unique_ptr<GgufFile> f(new GgufFile());
  f->path_ = path;
  f->mapping_ = m;
  f->fd_ = fd;  // kept for copy_out
  f->base_ = static_cast<const uint8_t*>(m);
  f->size_ = static_cast<uint64_t>(st.st_size);
  f->parse();
  // Everything before the tensor data has been parsed; what is read again
  // (the packed arrays, a large vocabulary's megabytes) faults back in.
  f->release_metadata_pages();
  return f;
}

std::unique_ptr<GgufFile> GgufFile::from_memory(const uint8_t* data, size_t size,
                                                std::string name) {
  std::unique_ptr<GgufFile> f(new GgufFile());
  f->path_ = std::move(name);
  f->base_ = data;
  f->size_ = size;
  f->parse();
  return f;
}

GgufFile::~GgufFile() {
  if (mapping_) ::munmap(mapping_, static_cast<size_t>(size_));
  if (fd_ >= 0) ::close(fd_);
}

void GgufFile::copy_out(const uint8_t* p, size_t n, uint8_t* dst) const {
  if (p < base_ || n > size_ || p - base_ > static_cast<ptrdiff_t>(size_ - n))
    fail(ErrorKind::kInvalidArgument, "{}: copy_out of {} bytes outside the file", path_, n);
  size_t done = 0;
  if (fd_ >= 0) {
    const off_t at = static_cast<off_t>(p - base_);
    while (done < n) {
      const ssize_t got = ::pread(fd_, dst + done, n - done, at + static_cast<off_t>(done));
      if (got > 0) done += static_cast<size_t>(got);
      else if (got < 0 && errno == EINTR) continue;
      else break;  // an error or end of file: the rest is copied from the mapping below
    }
  }
  if (done < n) std::memcpy(dst + done, p + done, n - done);
}

void GgufFile::release_pages(const uint8_t* p, size_t n) const {
  if (!mapping_ || p < base_ || p + n > base_ + size_) return;
  const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t a = (reinterpret_cast<uintptr_t>(p) + page - 1) / page * page;
  const uintptr_t b = (reinterpret_cast<uintptr_t>(p) + n) / page * page;
  if (b > a) ::madvise(reinterpret_cast<void*>(a), b - a, MADV_DONTNEED);
}

void GgufFile::parse() {
  const std::string& name = path_;
  if (size_ > 0 && base_ == nullptr)
    fail(ErrorKind::kInvalidArgument, "{}: null buffer of {} bytes", name, size_);
  Reader r(base_, size_, name);
  Parser p(r, name);

  const uint32_t magic = r.read<uint32_t>("magic");
  if (magic != kMagic)
    fail(ErrorKind::kInvalidFile, "{}: not a GGUF file (bad magic 0x{:08x}, expected \"GGUF\")",
         name, magic);
  version_ = r.read<uint32_t>("version");
  if (version_ == 1)
    fail(ErrorKind::kInvalidFile,
         "{}: GGUF version 1 is not supported (only versions 2 and 3; re-convert the model)", name);
  if (version_ != 2 && version_ != 3) {
    const bool swapped = version_ == 0x02000000u || version_ == 0x03000000u;
    fail(ErrorKind::kInvalidFile, "{}: unsupported GGUF version {}{}", name, version_,
         swapped ? " (a big-endian file? only little-endian is supported)" : "");
  }

  const uint64_t n_tensors = r.read<uint64_t>("tensor count");
  const uint64_t n_kv = r.read<uint64_t>("metadata kv count");
  if (n_kv > r.remaining() / kMinKvBytes)
    fail(ErrorKind::kInvalidFile, "{}: metadata kv count {} cannot fit in the {} bytes left", name,
         n_kv, r.remaining());
  if (n_tensors > r.remaining() / kMinTensorInfoBytes)
    fail(ErrorKind::kInvalidFile, "{}: tensor count {} cannot fit in the {} bytes left", name,
         n_tensors, r.remaining());

  kvs_.reserve(static_cast<size_t>(n_kv));
  std::unordered_set<std::string> keys;
  for (uint64_t i = 0; i < n_kv; ++i) {
    GgufKV kv;
    kv.key = r.read_string(fmt::format("key of metadata entry #{}", i), kMaxKeyLen);
    if (kv.key.empty())
      fail(ErrorKind::kInvalidFile, "{}: metadata entry #{} has an empty key", name, i);
    if (!keys.insert(kv.key).second)
      fail(ErrorKind::kInvalidFile, "{}: duplicate key '{}'", name, kv.key);
    const GgufType t = p.read_type(kv.key, "value type");
    kv.value = p.read_value(t, kv.key, 0);
    kvs_.push_back(std::move(kv));
  }

  alignment_ = 32;
  if (const GgufValue* a = find("general.alignment")) {
    if (a->type != GgufType::UINT32)
      fail(ErrorKind::kInvalidFile, "{}: key 'general.alignment' has type {}, expected u32", name,
           gguf_type_name(a->type));
    const uint64_t al = std::get<uint64_t>(a->v);
    if (al == 0 || (al & (al - 1)) != 0)
      fail(ErrorKind::kInvalidFile,
           "{}: key 'general.alignment' is {}, which is not a nonzero power of two", name, al);
    alignment_ = al;
  }

  tensors_.reserve(static_cast<size_t>(n_tensors));
  std::unordered_set<std::string> names;
  for (uint64_t i = 0; i < n_tensors; ++i) {
    GgufTensor t;
    t.name = r.read_string(fmt::format("name of tensor #{}", i), kMaxTensorNameLen);
    if (t.name.empty()) fail(ErrorKind::kInvalidFile, "{}: tensor #{} has an empty name", name, i);
    if (!names.insert(t.name).second)
      fail(ErrorKind::kInvalidFile, "{}: duplicate tensor name '{}'", name, t.name);
    const std::string what = fmt::format("tensor '{}'", t.name);

    const uint32_t n_dims = r.read<uint32_t>(what);
    if (n_dims < 1 || n_dims > 4)
      fail(ErrorKind::kInvalidFile, "{}: tensor '{}' has n_dims {} (must be 1..4)", name, t.name,
           n_dims);
    int64_t n = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      const uint64_t ne = r.read<uint64_t>(what);
      t.dims.push_back(static_cast<int64_t>(ne));
      if (ne == 0 || ne > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        fail(ErrorKind::kInvalidFile, "{}: tensor '{}' has dimension {} = {} (must be > 0)", name,
             t.name, d, static_cast<int64_t>(ne));
      if (__builtin_mul_overflow(n, static_cast<int64_t>(ne), &n))
        fail(ErrorKind::kInvalidFile, "{}: tensor '{}' dims {}... element count overflows int64",
             name, t.name, dims_str(t.dims));
    }
    t.n_elements = n;

    const uint32_t type_id = r.read<uint32_t>(what);
    const auto traits = type_traits(type_id);
    if (!traits)
      fail(ErrorKind::kInvalidFile, "{}: tensor '{}' has unknown tensor type id {}", name, t.name,
           type_id);
    t.type = static_cast<GgmlType>(type_id);
    if (t.dims[0] % traits->block_elems != 0)
      fail(ErrorKind::kInvalidFile,
           "{}: tensor '{}' has ne[0] = {}, not a multiple of the {} block size {}", name, t.name,
           t.dims[0], traits->name, traits->block_elems);
    const uint64_t row = static_cast<uint64_t>(t.dims[0] / traits->block_elems);
    uint64_t row_b = 0, total = 0;
    if (__builtin_mul_overflow(row, static_cast<uint64_t>(traits->block_bytes), &row_b) ||
        __builtin_mul_overflow(row_b, static_cast<uint64_t>(t.rows()), &total))
      fail(ErrorKind::kInvalidFile, "{}: tensor '{}' dims {} byte size overflows", name, t.name,
           dims_str(t.dims));
    t.n_bytes = total;

    t.offset = r.read<uint64_t>(what);
    if (t.offset % alignment_ != 0)
      fail(ErrorKind::kInvalidFile,
           "{}: tensor '{}' offset {} is misaligned (not a multiple of the alignment {})", name,
           t.name, t.offset, alignment_);
    tensors_.push_back(std::move(t));
  }

  // Data starts at the next multiple of the alignment; pos <= size_ and the
  // alignment is at most 2^31, so this cannot overflow.
  data_offset_ = (r.pos() + alignment_ - 1) / alignment_ * alignment_;
  // A vocab-only file may end without the padding; only files with tensors
  // need the data section to exist.
  if (!tensors_.empty() && data_offset_ > size_)
    fail(ErrorKind::kInvalidFile,
         "{}: data section at offset {} (aligned to {}) starts past the end of the file (size {})",
         name, data_offset_, alignment_, size_);
  for (auto& t : tensors_) {
    const uint64_t avail = size_ - data_offset_;
    if (t.offset > avail || t.n_bytes > avail - t.offset)
      fail(ErrorKind::kInvalidFile,
           "{}: tensor '{}' data [offset {}, {} bytes] runs past the end of the file (size {}, "
           "data section at {})",
           name, t.name, t.offset, t.n_bytes, size_, data_offset_);
    t.data = base_ + data_offset_ + t.offset;
  }
}

size_t GgufValue::array_size() const {
  if (const auto* a = std::get_if<std::vector<GgufValue>>(&v)) return a->size();
  if (const auto* p = std::get_if<GgufPackedArray>(&v)) return static_cast<size_t>(p->n);
  return 0;
}

void GgufValue::for_each_element(const std::function<bool(GgufValue&&)>& f) const {
  if (const auto* a = std::get_if<std::vector<GgufValue>>(&v)) {
    for (const GgufValue& e : *a)
      if (!f(GgufValue(e))) return;
    return;
  }
  const auto* p = std::get_if<GgufPackedArray>(&v);
  if (!p) return;
  static const std::string kName = "<packed GGUF array>";
  Reader r(p->bytes.data(), p->bytes.size(), kName);
  for (uint64_t i = 0; i < p->n; ++i)
    if (!f(read_flat_value(r, elem_type, "packed array element", "", kName))) return;
}

std::vector<GgufValue> GgufValue::array_elements(size_t max) const {
  std::vector<GgufValue> out;
  out.reserve(std::min(max, array_size()));
  if (max == 0) return out;
  for_each_element([&](GgufValue&& e) {
    out.push_back(std::move(e));
    return out.size() < max;
  });
  return out;
}

}  // namespace tandem

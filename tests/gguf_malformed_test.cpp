// Malformed GGUF images must throw tandem::Error(kInvalidFile) with a message
// that says what is wrong, and never read outside the buffer (run under ASan).
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "gguf/gguf.h"

namespace fs = std::filesystem;
using namespace tandem;

namespace {

// Builds GGUF images field by field so each test can put one bad value in an
// otherwise valid file.
struct Raw {
  std::vector<uint8_t> b;
  template <typename T>
  Raw& put(T v) {
    const size_t at = b.size();
    b.resize(at + sizeof(T));
    std::memcpy(b.data() + at, &v, sizeof(T));
    return *this;
  }
  Raw& u32(uint32_t v) { return put(v); }
  Raw& u64(uint64_t v) { return put(v); }
  Raw& str(const std::string& s) {
    u64(s.size());
    b.insert(b.end(), s.begin(), s.end());
    return *this;
  }
  Raw& header(uint64_t n_tensors, uint64_t n_kv, uint32_t version = 3) {
    return u32(0x46554747).u32(version).u64(n_tensors).u64(n_kv);
  }
  Raw& kv_u32(const std::string& k, uint32_t v) { return str(k).u32(4).u32(v); }
  Raw& tensor(const std::string& name, std::vector<uint64_t> dims, uint32_t type, uint64_t off) {
    str(name).u32(static_cast<uint32_t>(dims.size()));
    for (auto d : dims) u64(d);
    return u32(type).u64(off);
  }
  // Pads to `align` and appends `n` data bytes.
  Raw& data(size_t n, size_t align = 32) {
    b.resize((b.size() + align - 1) / align * align, 0);
    b.resize(b.size() + n, 0x11);
    return *this;
  }
};

// Parses a heap copy of exactly `img` so any over-read is caught by ASan.
std::string parse_error(const std::vector<uint8_t>& img) {
  std::vector<uint8_t> copy(img);
  try {
    GgufFile::from_memory(copy.data(), copy.size(), "bad.gguf");
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidFile) << e.what();
    const std::string msg = e.what();
    EXPECT_EQ(msg.rfind("bad.gguf: ", 0), 0u) << msg;
    return msg;
  }
  ADD_FAILURE() << "image of " << img.size() << " bytes was accepted";
  return "";
}

#define EXPECT_REJECTED(img, ...)                                               \
  do {                                                                          \
    const std::string m_ = parse_error(img);                                    \
    for (const char* w_ : {__VA_ARGS__})                                        \
      EXPECT_NE(m_.find(w_), std::string::npos) << "missing '" << w_ << "' in: " << m_; \
  } while (0)

// A small valid file with nested arrays and tensors, whose last tensor ends
// exactly at the end of the file (so every shorter prefix is invalid).
std::vector<uint8_t> small_valid_file() {
  GgufWriter w;
  w.add_string("general.architecture", "llama");
  w.add_u32("llama.block_count", 1);
  w.add_f32("f", 1.0f);
  w.add_bool("b", true);
  w.add_string_array("tokens", {"a", "bc", ""});
  GgufValue inner{GgufType::ARRAY, GgufType::INT16,
                  std::vector<GgufValue>{GgufValue{GgufType::INT16, GgufType::UINT8, int64_t{-2}}}};
  w.add("nested", GgufValue{GgufType::ARRAY, GgufType::ARRAY, std::vector<GgufValue>{inner, inner}});
  w.add_tensor("w.q8", GgmlType::Q8_0, {32, 1}, std::vector<uint8_t>(34, 3));
  w.add_tensor("w.f32", GgmlType::F32, {8}, std::vector<uint8_t>(32, 5));
  return w.to_bytes();
}

}  // namespace

TEST(GgufMalformed, SmallValidFileParses) {
  const auto img = small_valid_file();
  auto f = GgufFile::from_memory(img.data(), img.size());
  EXPECT_EQ(f->tensors().size(), 2u);
  EXPECT_EQ(f->tensors()[1].offset + f->tensors()[1].n_bytes + f->data_offset(), img.size());
}

TEST(GgufMalformed, EveryTruncationIsRejected) {
  const auto img = small_valid_file();
  for (size_t n = 0; n < img.size(); ++n) {
    SCOPED_TRACE(n);
    const std::vector<uint8_t> prefix(img.begin(), img.begin() + static_cast<std::ptrdiff_t>(n));
    const std::string m = parse_error(prefix);
    const bool explained = m.find("truncated") != std::string::npos ||
                           m.find("past the end") != std::string::npos ||
                           m.find("cannot fit") != std::string::npos ||
                           m.find("bytes remain") != std::string::npos;
    EXPECT_TRUE(explained) << m;
  }
}

TEST(GgufMalformed, EveryByteCorruptionIsHandled) {
  // Not every flip makes the file invalid; none may crash or throw anything else.
  const auto img = small_valid_file();
  for (size_t i = 0; i < img.size(); ++i) {
    for (uint8_t v : {uint8_t{0x00}, uint8_t{0xff}, uint8_t{0x80}, uint8_t{0x05}}) {
      std::vector<uint8_t> bad(img);
      bad[i] = v;
      try {
        GgufFile::from_memory(bad.data(), bad.size(), "bad.gguf");
      } catch (const Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::kInvalidFile) << e.what();
      }
    }
  }
}

TEST(GgufMalformed, TruncatedFileOnDisk) {
  const auto img = small_valid_file();
  const fs::path p = fs::temp_directory_path() / "tandem_malformed_trunc.gguf";
  {
    std::ofstream out(p, std::ios::binary);
    out.write(reinterpret_cast<const char*>(img.data()), static_cast<std::streamsize>(img.size() - 1));
  }
  try {
    GgufFile::open(p.string());
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidFile);
    EXPECT_NE(std::string(e.what()).find(p.string()), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("w.f32"), std::string::npos) << e.what();
  }
  { std::ofstream out(p, std::ios::binary | std::ios::trunc); }
  EXPECT_THROW(GgufFile::open(p.string()), Error);
  fs::remove(p);
}

TEST(GgufMalformed, MagicAndVersion) {
  Raw r;
  r.u32(0x46554746).u32(3).u64(0).u64(0);
  EXPECT_REJECTED(r.b, "magic");
  EXPECT_REJECTED(Raw().header(0, 0, 1).b, "version 1");
  EXPECT_REJECTED(Raw().header(0, 0, 99).b, "version 99");
  EXPECT_REJECTED(Raw().header(0, 0, 0x03000000).b, "big-endian");
  EXPECT_REJECTED(Raw().u32(0x46554747).b, "truncated", "version");
  // v2 is accepted.
  auto v2 = Raw().header(0, 1, 2).kv_u32("a", 1).b;
  EXPECT_EQ(GgufFile::from_memory(v2.data(), v2.size())->version(), 2u);
}

TEST(GgufMalformed, HugeCounts) {
  EXPECT_REJECTED(Raw().header(0, UINT64_MAX).b, "kv count");
  EXPECT_REJECTED(Raw().header(0, 3).kv_u32("a", 1).b, "kv count");
  EXPECT_REJECTED(Raw().header(UINT64_MAX, 0).b, "tensor count");
  EXPECT_REJECTED(Raw().header(uint64_t{1} << 40, 1).kv_u32("a", 1).b, "tensor count");
}

TEST(GgufMalformed, HugeStringAndArrayLengths) {
  EXPECT_REJECTED(Raw().header(0, 1).u64(UINT64_MAX).u32(4).u32(0).b, "string length");
  EXPECT_REJECTED(Raw().header(0, 1).u64(100).u32(4).u32(0).b, "string length");
  EXPECT_REJECTED(Raw().header(0, 1).str("k").u32(8).u64(UINT64_MAX - 3).b, "string length", "'k'");
  EXPECT_REJECTED(Raw().header(0, 1).str("k").u32(9).u32(0).u64(UINT64_MAX).b, "array length", "'k'");
  // 2^61 u64 elements would wrap to 0 bytes if multiplied by 8.
  EXPECT_REJECTED(Raw().header(0, 1).str("k").u32(9).u32(10).u64(uint64_t{1} << 61).b, "array length");
  EXPECT_REJECTED(Raw().header(0, 1).str("k").u32(9).u32(8).u64(2).str("x").u64(50).b, "string length");
  // Nested: the inner array's length is checked too.
  EXPECT_REJECTED(Raw().header(0, 1).str("k").u32(9).u32(9).u64(1).u32(0).u64(1000).b, "array length");
}

TEST(GgufMalformed, ArrayNestingIsBounded) {
  Raw r;
  r.header(0, 1).str("deep").u32(9);
  for (int i = 0; i < 100; ++i) r.u32(9).u64(1);
  r.u32(0).u64(0);
  EXPECT_REJECTED(r.b, "nested", "'deep'");
}

TEST(GgufMalformed, UnknownValueTypes) {
  EXPECT_REJECTED(Raw().header(0, 1).str("k").u32(13).u32(0).b, "unknown value type id 13", "'k'");
  EXPECT_REJECTED(Raw().header(0, 1).str("k").u32(9).u32(77).u64(0).b, "array element type id 77");
  EXPECT_REJECTED(Raw().header(0, 1).str("k").u32(7).put<uint8_t>(2).b, "bool");
}

TEST(GgufMalformed, DuplicatesAndEmptyNames) {
  EXPECT_REJECTED(Raw().header(0, 2).kv_u32("a.b", 1).kv_u32("a.b", 2).b, "duplicate key", "'a.b'");
  EXPECT_REJECTED(Raw().header(0, 1).kv_u32("", 1).b, "empty key");
  EXPECT_REJECTED(Raw().header(2, 0).tensor("t", {4}, 0, 0).tensor("t", {4}, 0, 32).data(64).b,
                  "duplicate tensor", "'t'");
  EXPECT_REJECTED(Raw().header(1, 0).tensor("", {4}, 0, 0).data(16).b, "empty name");
  EXPECT_REJECTED(Raw().header(1, 0).tensor(std::string(64, 'x'), {4}, 0, 0).data(16).b,
                  "string length 64");
}

TEST(GgufMalformed, Alignment) {
  for (uint32_t bad : {0u, 3u, 48u, 0xffffffffu})
    EXPECT_REJECTED(Raw().header(0, 1).kv_u32("general.alignment", bad).b, "general.alignment",
                    "power of two");
  EXPECT_REJECTED(Raw().header(0, 1).str("general.alignment").u32(10).u64(32).b, "general.alignment",
                  "expected u32");
  // A valid custom alignment moves the data section and constrains offsets.
  auto ok = Raw().header(1, 1).kv_u32("general.alignment", 128).tensor("t", {4}, 0, 0).data(16, 128).b;
  auto f = GgufFile::from_memory(ok.data(), ok.size());
  EXPECT_EQ(f->alignment(), 128u);
  EXPECT_EQ(f->data_offset() % 128, 0u);
  EXPECT_REJECTED(Raw().header(1, 1).kv_u32("general.alignment", 128).tensor("t", {4}, 0, 32).data(64, 128).b,
                  "misaligned", "'t'");
}

TEST(GgufMalformed, TensorShapes) {
  EXPECT_REJECTED(Raw().header(1, 0).tensor("t", {}, 0, 0).data(16).b, "n_dims 0", "'t'");
  EXPECT_REJECTED(Raw().header(1, 0).tensor("t", {1, 1, 1, 1, 1}, 0, 0).data(16).b, "n_dims 5");
  EXPECT_REJECTED(Raw().header(1, 0).tensor("t", {4, 0}, 0, 0).data(16).b, "dimension 1 = 0");
  EXPECT_REJECTED(Raw().header(1, 0).tensor("t", {UINT64_MAX}, 0, 0).data(16).b, "dimension 0 = -1");
  EXPECT_REJECTED(Raw().header(1, 0).tensor("t", {uint64_t{1} << 32, uint64_t{1} << 32}, 0, 0).data(16).b,
                  "overflows", "'t'");
  // Elements fit int64 but bytes overflow u64.
  EXPECT_REJECTED(Raw().header(1, 0).tensor("t", {uint64_t{1} << 62}, 0, 0).data(16).b, "overflows");
  EXPECT_REJECTED(Raw().header(1, 0).tensor("t", {33, 2}, 8, 0).data(68).b, "block size", "'t'");
}

TEST(GgufMalformed, TensorTypes) {
  for (uint32_t id : {4u, 5u, 31u, 1000u})
    EXPECT_REJECTED(Raw().header(1, 0).tensor("blk.0.w", {32}, id, 0).data(128).b,
                    "unknown tensor type id", "'blk.0.w'");
}

TEST(GgufMalformed, TensorDataBounds) {
  EXPECT_REJECTED(Raw().header(1, 0).tensor("t", {4}, 0, 0).data(15).b, "past the end", "'t'",
                  "16 bytes");
  EXPECT_REJECTED(Raw().header(1, 0).tensor("t", {4}, 0, 32).data(32).b, "past the end");
  EXPECT_REJECTED(Raw().header(1, 0).tensor("t", {4}, 0, 7).data(64).b, "misaligned");
  // offset + size wraps around u64.
  EXPECT_REJECTED(Raw().header(1, 0).tensor("t", {16}, 0, UINT64_MAX - 31).data(64).b, "past the end");
  // Header padding missing: the data section would start past the end.
  Raw r;
  r.header(1, 0).tensor("t", {1}, 0, 0);
  EXPECT_REJECTED(r.b, "past the end");
}

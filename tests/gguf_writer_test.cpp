#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "core/error.h"
#include "gguf/gguf.h"

namespace fs = std::filesystem;
using namespace tandem;

namespace {

GgufValue scalar(GgufType t, std::variant<uint64_t, int64_t, double, bool, std::string> v) {
  GgufValue out;
  out.type = t;
  std::visit([&](auto&& x) { out.v = x; }, v);
  return out;
}

GgufValue array(GgufType elem, std::vector<GgufValue> elems) {
  GgufValue out;
  out.type = GgufType::ARRAY;
  out.elem_type = elem;
  out.v = std::move(elems);
  return out;
}

std::vector<uint8_t> pattern(size_t n, uint8_t seed) {
  std::vector<uint8_t> d(n);
  for (size_t i = 0; i < n; ++i) d[i] = static_cast<uint8_t>(seed + i * 7);
  return d;
}

bool same_value(const GgufValue& a, const GgufValue& b) {
  if (a.type != b.type) return false;
  if (a.type == GgufType::ARRAY) {
    if (a.elem_type != b.elem_type) return false;
    const std::vector<GgufValue> x = a.array_elements(), y = b.array_elements();
    if (x.size() != y.size()) return false;
    for (size_t i = 0; i < x.size(); ++i)
      if (!same_value(x[i], y[i])) return false;
    return true;
  }
  if (a.v.index() != b.v.index()) return false;
  if (auto* u = std::get_if<uint64_t>(&a.v)) return *u == std::get<uint64_t>(b.v);
  if (auto* i = std::get_if<int64_t>(&a.v)) return *i == std::get<int64_t>(b.v);
  if (auto* d = std::get_if<double>(&a.v)) return *d == std::get<double>(b.v);
  if (auto* x = std::get_if<bool>(&a.v)) return *x == std::get<bool>(b.v);
  return std::get<std::string>(a.v) == std::get<std::string>(b.v);
}

struct TensorSpec {
  std::string name;
  GgmlType type;
  std::vector<int64_t> dims;
  size_t bytes;
};

}  // namespace

TEST(GgufWriter, RoundTripsEveryValueTypeAndTensorType) {
  for (uint64_t alignment : {uint64_t{32}, uint64_t{64}, uint64_t{1}, uint64_t{4096}}) {
    SCOPED_TRACE(alignment);
    GgufWriter w(alignment);
    std::vector<GgufKV> expect = {
        {"t.u8", scalar(GgufType::UINT8, uint64_t{255})},
        {"t.i8", scalar(GgufType::INT8, int64_t{-128})},
        {"t.u16", scalar(GgufType::UINT16, uint64_t{65535})},
        {"t.i16", scalar(GgufType::INT16, int64_t{-32768})},
        {"t.u32", scalar(GgufType::UINT32, uint64_t{4294967295u})},
        {"t.i32", scalar(GgufType::INT32, int64_t{-2147483647 - 1})},
        {"t.u64", scalar(GgufType::UINT64, uint64_t{18446744073709551615u})},
        {"t.i64", scalar(GgufType::INT64, int64_t{-9223372036854775807 - 1})},
        {"t.f32", scalar(GgufType::FLOAT32, double{0.1f})},
        {"t.f64", scalar(GgufType::FLOAT64, 0.1)},
        {"t.bool", scalar(GgufType::BOOL, true)},
        {"t.str", scalar(GgufType::STRING, std::string("h\xc3\xa9llo\n\0x", 9))},
        {"t.empty_str", scalar(GgufType::STRING, std::string())},
        {"t.arr_empty", array(GgufType::FLOAT64, {})},
        {"t.arr_bool", array(GgufType::BOOL, {scalar(GgufType::BOOL, false), scalar(GgufType::BOOL, true)})},
        {"t.arr_nested",
         array(GgufType::ARRAY,
               {array(GgufType::INT16, {scalar(GgufType::INT16, int64_t{-1}), scalar(GgufType::INT16, int64_t{7})}),
                array(GgufType::STRING, {scalar(GgufType::STRING, std::string("x"))}),
                array(GgufType::ARRAY, {array(GgufType::UINT64, {scalar(GgufType::UINT64, uint64_t{9})})}),
                array(GgufType::UINT8, {})})},
    };
    for (const auto& kv : expect) w.add(kv.key, kv.value);
    w.add_string("c.s", "abc");
    w.add_u32("c.u32", 7);
    w.add_i32("c.i32", -7);
    w.add_f32("c.f32", 1e-5f);
    w.add_bool("c.b", false);
    w.add_string_array("c.sa", {"a", "", "\xe2\x96\x81z"});
    w.add_f32_array("c.fa", {1.5f, -2.0f});
    w.add_i32_array("c.ia", {1, -2, 3});

    const std::vector<TensorSpec> specs = {
        {"a.f32", GgmlType::F32, {3, 5}, 60},
        {"b.f16", GgmlType::F16, {7}, 14},
        {"c.q4_0", GgmlType::Q4_0, {64, 2, 3}, 2 * 3 * 2 * 18},
        {"d.q8_0", GgmlType::Q8_0, {32, 1, 1, 2}, 2 * 34},
        {"e.q4_K", GgmlType::Q4_K, {256, 3}, 3 * 144},
        {"f.q6_K", GgmlType::Q6_K, {512}, 2 * 210},
        {"g.i32", GgmlType::I32, {1}, 4},
        {"h.bf16", GgmlType::BF16, {2, 2, 2, 2}, 32},
    };
    for (size_t i = 0; i < specs.size(); ++i)
      w.add_tensor(specs[i].name, specs[i].type, specs[i].dims, pattern(specs[i].bytes, uint8_t(i)));

    const std::vector<uint8_t> img = w.to_bytes();
    auto f = GgufFile::from_memory(img.data(), img.size(), "rt.gguf");
    EXPECT_EQ(f->version(), 3u);
    EXPECT_EQ(f->alignment(), alignment);
    EXPECT_EQ(f->data_offset() % alignment, 0u);
    // A non-default alignment is recorded in general.alignment, the default is not.
    EXPECT_EQ(f->find("general.alignment") != nullptr, alignment != 32);
    for (const auto& kv : expect) {
      const GgufValue* v = f->find(kv.key);
      ASSERT_NE(v, nullptr) << kv.key;
      EXPECT_TRUE(same_value(*v, kv.value)) << kv.key << " = " << v->to_display();
    }
    EXPECT_EQ(f->get_string("c.s"), "abc");
    EXPECT_EQ(f->get_int("c.u32"), 7);
    EXPECT_EQ(f->get_int("c.i32"), -7);
    EXPECT_EQ(f->get_float("c.f32"), double{1e-5f});
    EXPECT_EQ(f->get_bool("c.b"), false);
    EXPECT_EQ(f->get_string_array("c.sa"), (std::vector<std::string>{"a", "", "\xe2\x96\x81z"}));
    EXPECT_EQ(f->get_float_array("c.fa"), (std::vector<float>{1.5f, -2.0f}));
    EXPECT_EQ(f->get_int_array("c.ia"), (std::vector<int64_t>{1, -2, 3}));
    EXPECT_THROW(f->get_int("t.u64"), Error);  // does not fit int64

    ASSERT_EQ(f->tensors().size(), specs.size());
    for (size_t i = 0; i < specs.size(); ++i) {
      const GgufTensor& t = f->tensors()[i];
      EXPECT_EQ(t.name, specs[i].name);
      EXPECT_EQ(t.type, specs[i].type);
      EXPECT_EQ(t.dims, specs[i].dims);
      EXPECT_EQ(t.n_bytes, specs[i].bytes);
      EXPECT_EQ(t.offset % alignment, 0u);
      EXPECT_EQ(t.data, img.data() + f->data_offset() + t.offset);
      const auto want = pattern(specs[i].bytes, uint8_t(i));
      EXPECT_EQ(std::memcmp(t.data, want.data(), want.size()), 0) << t.name;
    }

    // write() streams the same image to disk.
    const fs::path p = fs::temp_directory_path() / ("tandem_gguf_rt_" + std::to_string(alignment) + ".gguf");
    w.write(p.string());
    std::ifstream in(p, std::ios::binary);
    std::vector<uint8_t> disk((std::istreambuf_iterator<char>(in)), {});
    EXPECT_EQ(disk, img);
    auto g = GgufFile::open(p.string());
    EXPECT_EQ(g->tensors().size(), specs.size());
    fs::remove(p);
  }
}

TEST(GgufWriter, RejectsInconsistentInput) {
  GgufWriter w;
  w.add_u32("k", 1);
  EXPECT_THROW(w.add_u32("k", 2), Error);
  EXPECT_THROW(w.add_tensor("t", GgmlType::F32, {4}, std::vector<uint8_t>(15)), Error);
  EXPECT_THROW(w.add_tensor("t", GgmlType::F32, {0}, {}), Error);
  EXPECT_THROW(w.add_tensor("t", GgmlType::F32, {1, 1, 1, 1, 1}, std::vector<uint8_t>(4)), Error);
  EXPECT_THROW(w.add_tensor("t", GgmlType::Q4_0, {16}, std::vector<uint8_t>(9)), Error);
  w.add_tensor("t", GgmlType::F32, {1}, std::vector<uint8_t>(4));
  EXPECT_THROW(w.add_tensor("t", GgmlType::F32, {1}, std::vector<uint8_t>(4)), Error);

  GgufWriter range;
  range.add("u8", scalar(GgufType::UINT8, uint64_t{256}));
  EXPECT_THROW(range.to_bytes(), Error);
  GgufWriter mixed;
  mixed.add("a", array(GgufType::INT32, {scalar(GgufType::STRING, std::string("x"))}));
  EXPECT_THROW(mixed.to_bytes(), Error);
  GgufWriter bad_align(48);
  EXPECT_THROW(bad_align.to_bytes(), Error);
  GgufWriter wrong_key(64);
  wrong_key.add_u32("general.alignment", 32);
  EXPECT_THROW(wrong_key.to_bytes(), Error);
  EXPECT_THROW(GgufWriter().write("/nonexistent/dir/x.gguf"), Error);
}

TEST(GgufValue, DisplayAbbreviatesLongArrays) {
  std::vector<GgufValue> e;
  for (int i = 0; i < 100; ++i) e.push_back(scalar(GgufType::INT32, int64_t{i}));
  GgufValue a = array(GgufType::INT32, e);
  EXPECT_EQ(a.to_display(3), "[0, 1, 2, ... (100 elements)]");
  EXPECT_EQ(scalar(GgufType::STRING, std::string("a\"b\n")).to_display(), "\"a\\\"b\\n\"");
  EXPECT_EQ(scalar(GgufType::FLOAT32, double{1e-5f}).to_display(), "1e-05");
  EXPECT_EQ(scalar(GgufType::BOOL, true).to_display(), "true");
}

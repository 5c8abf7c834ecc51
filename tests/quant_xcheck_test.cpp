// Cross-check against an independent implementation: the dump written by
// scripts/quant_xcheck.py holds real tensors' raw blocks and the PyPI gguf
// package's numpy dequantization of them, or (--synthetic) blocks made to
// cover a format's exponents and gguf-py's quantization of float rows.
// Skipped unless TANDEM_QUANT_XCHECK names such a dump (the model and numpy
// are not part of the build).
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "quant/ggml_type.h"
#include "quant/quant.h"

namespace tandem {
namespace {

template <typename T>
bool read_le(std::ifstream& in, T& v) {
  return static_cast<bool>(in.read(reinterpret_cast<char*>(&v), sizeof(v)));
}

TEST(QuantXcheck, MatchesGgufPyDequantizationOfRealTensors) {
  const char* path = std::getenv("TANDEM_QUANT_XCHECK");
  if (path == nullptr) GTEST_SKIP() << "set TANDEM_QUANT_XCHECK to a dump from scripts/quant_xcheck.py";
  std::ifstream in(path, std::ios::binary);
  ASSERT_TRUE(in) << path;
  char magic[4];
  ASSERT_TRUE(in.read(magic, 4));
  ASSERT_EQ(std::string(magic, 4), "TQX2");

  std::map<std::string, int> tensors_per_type;
  uint8_t kind = 0;
  while (read_le(in, kind)) {
    uint32_t type = 0;
    uint64_t n = 0;
    uint32_t name_len = 0;
    ASSERT_TRUE(read_le(in, type) && read_le(in, n) && read_le(in, name_len));
    ASSERT_LE(kind, 1) << "record kind";
    std::string name(name_len, '\0');
    ASSERT_TRUE(in.read(name.data(), name_len));
    const auto traits = type_traits(type);
    ASSERT_TRUE(traits.has_value()) << name << " type " << type;
    const auto t = static_cast<GgmlType>(type);
    std::vector<uint8_t> raw(row_bytes(t, static_cast<int64_t>(n)));
    std::vector<float> want(n), got(n);
    ASSERT_TRUE(in.read(reinterpret_cast<char*>(raw.data()), static_cast<std::streamsize>(raw.size())));
    ASSERT_TRUE(in.read(reinterpret_cast<char*>(want.data()), static_cast<std::streamsize>(n * 4)));
    if (kind == 1) {
      // want holds the quantizer's input, raw gguf-py's blocks.
      std::vector<uint8_t> ours(raw.size());
      quantize_row(t, want.data(), ours.data(), static_cast<int64_t>(n));
      const size_t bb = traits->block_bytes;
      size_t bad_blocks = 0;
      for (size_t b = 0; b < raw.size() / bb; ++b)
        if (std::memcmp(&ours[b * bb], &raw[b * bb], bb) != 0 && bad_blocks++ < 3)
          ADD_FAILURE() << name << " (" << traits->name << ") block " << b << " quantizes differently from gguf-py";
      EXPECT_EQ(bad_blocks, 0u) << name;
      ++tensors_per_type[std::string(traits->name) + " quantize"];
      continue;
    }
    dequantize_row(t, raw.data(), got.data(), static_cast<int64_t>(n));
    size_t mismatches = 0;
    for (size_t i = 0; i < n; ++i) {
      uint32_t a, b;
      std::memcpy(&a, &got[i], 4);
      std::memcpy(&b, &want[i], 4);
      if (a != b && mismatches++ < 3)
        ADD_FAILURE() << name << " (" << traits->name << ") element " << i << ": " << got[i] << " vs gguf-py "
                      << want[i];
    }
    EXPECT_EQ(mismatches, 0u) << name;
    ++tensors_per_type[std::string(traits->name)];
  }
  for (const auto& [name, count] : tensors_per_type) std::printf("  %s: %d tensors compared\n", name.c_str(), count);
  EXPECT_FALSE(tensors_per_type.empty());
}

}  // namespace
}  // namespace tandem

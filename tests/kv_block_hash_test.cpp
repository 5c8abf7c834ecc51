// SHA-256 and the KV event block hashes, against values computed by Python's
// hashlib and cbor2 (canonical=True), the libraries vLLM hashes with.
#include "kv/block_hash.h"

#include <numeric>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "runtime/sha256.h"
#include "sha256_file.h"

namespace tandem {
namespace {

std::string sha256_hex(const std::string& data, size_t piece) {
  Sha256 h;
  for (size_t i = 0; i < data.size(); i += piece) h.update(std::string_view(data).substr(i, piece));
  return test::hex_digest(h.finish());
}

TEST(Sha256, KnownDigests) {
  EXPECT_EQ(sha256_hex("", 1), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(sha256_hex("abc", 1), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  // Two blocks of padding (56..63 bytes of input).
  EXPECT_EQ(sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq", 7),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  // Fed whole and in pieces that straddle the 64-byte blocks.
  for (size_t piece : {size_t(1000), size_t(1), size_t(63), size_t(64), size_t(65)})
    EXPECT_EQ(sha256_hex(std::string(1000, 'a'), piece),
              "41edece42d63e8d9bf515a9ba6932e1c20cbc9f5a5d134645adb5db1b9737ea3")
        << piece;
}

TEST(KvBlockHash, MatchesVllmAndLlmd) {
  // low 64 bits of sha256(cbor2.dumps(seed, canonical=True))
  EXPECT_EQ(root_block_hash(""), 0x0ad38662763f13d3ULL);
  EXPECT_EQ(root_block_hash("42"), 0xa74ffcc4f31c1780ULL);
  // low 64 bits of sha256(cbor2.dumps([parent, tokens, None], canonical=True))
  std::vector<int32_t> first(16);
  std::iota(first.begin(), first.end(), 1);
  const uint64_t h1 = chained_block_hash(root_block_hash(""), first);
  EXPECT_EQ(h1, 0xb2d4f55f6847e50cULL);
  // Every width of CBOR integer: 0, 23 | 24, 255 | 256, 65535 | 65536, 2^31 - 1.
  const std::vector<int32_t> widths = {0, 23, 24, 255, 256, 65535, 65536, 2147483647};
  EXPECT_EQ(chained_block_hash(h1, widths), 0x568b736ccb6c8f5aULL);
  // A salted first block (vLLM's cache_salt): [parent, tokens, ("tenant-a",)].
  EXPECT_EQ(chained_block_hash(root_block_hash(""), first, "tenant-a"), 0x8daff4d9cf6eecaeULL);
}

}  // namespace
}  // namespace tandem

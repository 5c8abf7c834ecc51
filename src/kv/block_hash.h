// The names KV events give blocks: vLLM's sha256_cbor_64bit hashes, as
// llm-d's KV-cache indexer computes them from a prompt's tokens, so that a
// router can match a request's blocks to the ones a replica announced.
//
// A block's hash is the low 64 bits (big-endian) of SHA-256 over the
// canonical CBOR of [parent hash, [token ids], null]; the first block's parent
// is the same over the CBOR of a seed string (vLLM's NONE_HASH from
// PYTHONHASHSEED, llm-d's HashSeed). A salted prompt's first block (vLLM's
// cache_salt) hashes [parent, [token ids], [salt]] instead: its extra keys.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

namespace tandem {

uint64_t root_block_hash(std::string_view seed);
uint64_t chained_block_hash(uint64_t parent, std::span<const int32_t> tokens, std::string_view salt = {});
// The hashes of a prompt's full blocks (at most `most`), chained from seed "",
// the salt on the first: the names the KV store's files and transferred blocks go by.
std::vector<uint64_t> prompt_block_hashes(std::span<const int32_t> tokens, int32_t block_size,
                                          std::string_view salt = {}, size_t most = SIZE_MAX);

}  // namespace tandem

// A model's identity for K/V that leaves the process (kv/block_format.h):
// two files give the same fingerprint only if their K/V for the same tokens
// is the same, as far as a cheap look can tell.
//
// It hashes the file's size, its whole metadata section (architecture,
// shapes, RoPE and norm parameters, vocabulary), every tensor's name, type,
// shape and offset, and 64 bytes at the start, middle and end of each
// tensor's data. The samples tell apart files that share every shape and
// size (a fine-tune, synth models of different seeds), which hashing the
// metadata alone would not, while a full hash of the weights (hundreds of
// MB) would cost seconds at every start. The samples are read with pread so
// that no weight page becomes resident for it.
#pragma once

#include <cstdint>

namespace tandem {

class GgufFile;

uint64_t model_fingerprint(const GgufFile& file);

}  // namespace tandem

#include "model/model_fingerprint.h"

#include <algorithm>
#include <cstring>
#include <span>
#include <vector>

#include "gguf/gguf.h"
#include "kv/block_format.h"

namespace tandem {

uint64_t model_fingerprint(const GgufFile& file) {
  uint64_t h = kv_checksum({}, file.file_size());
  std::vector<uint8_t> buf;
  auto mix = [&](const void* p, size_t n) { h = kv_checksum(std::as_bytes(std::span(static_cast<const std::byte*>(p), n)), h); };
  // The metadata section, read in pieces through the file.
  const auto& tensors = file.tensors();
  if (!tensors.empty() && tensors.front().data != nullptr) {
    const uint8_t* base = tensors.front().data - tensors.front().offset - file.data_offset();
    constexpr size_t kPiece = size_t{1} << 20;
    buf.resize(kPiece);
    for (uint64_t at = 0; at < file.data_offset(); at += kPiece) {
      const size_t n = size_t(std::min<uint64_t>(kPiece, file.data_offset() - at));
      file.copy_out(base + at, n, buf.data());
      mix(buf.data(), n);
    }
  }
  uint8_t sample[64];
  for (const GgufTensor& t : tensors) {
    mix(t.name.data(), t.name.size());
    const uint64_t meta[3] = {uint64_t(t.type), t.offset, t.n_bytes};
    mix(meta, sizeof meta);
    mix(t.dims.data(), t.dims.size() * sizeof(int64_t));
    if (t.data == nullptr) continue;
    for (uint64_t at : {uint64_t{0}, t.n_bytes / 2, t.n_bytes > 64 ? t.n_bytes - 64 : 0}) {
      const size_t n = size_t(std::min<uint64_t>(64, t.n_bytes - std::min(at, t.n_bytes)));
      file.copy_out(t.data + at, n, sample);
      mix(sample, n);
    }
  }
  return h;
}

}  // namespace tandem

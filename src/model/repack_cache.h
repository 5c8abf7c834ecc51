// A file of weights already repacked (kernels/layouts.h), mapped at the next
// load instead of repacking again.
//
// Repacking writes the weights into fresh memory. On a VM that hands freed
// memory back to the host (virtio-balloon free page reporting, as on ours),
// every load after a pause faults all of it in again from the host, several
// times as slow as a load back to back. A cache file stays in the page cache like the model file, so a
// load maps it as llama.cpp maps a GGUF.
//
// The file is named by a hash of what decides its bytes (the model file's
// device, inode, size and modification time; the kernel level and prepack
// mode; the running binary's size and modification time, since the layouts
// belong to the code) and carries that key and every buffer's size in its
// header: any mismatch is a miss, and the weights are repacked as without a
// cache. It is written to a temporary name and renamed, so a reader never sees
// a partial file; a write that fails (disk full, no permission) leaves a
// warning and the load goes on with the weights in memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace tandem {

class RepackCache {
 public:
  // The cache in `dir` (created when first written) for the model file at
  // `model_path` repacked under `settings` (kernel level, prepack mode).
  RepackCache(std::string dir, const std::string& model_path, std::string_view settings);
  ~RepackCache();
  RepackCache(const RepackCache&) = delete;
  RepackCache& operator=(const RepackCache&) = delete;

  // The buffers of a valid cache file, mapped read-only, if there is one
  // whose key and buffer sizes are exactly these; empty otherwise.
  std::vector<const uint8_t*> open(std::span<const size_t> sizes);
  // Writes the buffers under this key; "" on success, else why not.
  std::string write(std::span<const std::span<const uint8_t>> buffers) const;

  const std::string& path() const { return path_; }  // "" when the model file could not be identified

 private:
  std::string dir_, key_, path_;
  void* mapping_ = nullptr;
  size_t mapped_bytes_ = 0;
};

}  // namespace tandem

#!/usr/bin/env bash
# Fills .gpu_data/ (ignored by git) with what scripts/gpu_check.sh needs on a
# GPU machine that can download nothing. Run it here, in the repository root,
# before carrying .gpu_data to that machine:
#   - stories260K.gguf, from ../shared/models;
#   - the build's library packages as .deb files (fmt, nlohmann-json, CLI11,
#     GoogleTest, PCRE2, ZeroMQ, pkgconf), which gpu_check.sh unpacks under
#     /tmp;
#   - with --prebuilt [BUILD_DIR]: tandem and tandem_cuda_tests built here
#     with CUDA (in BUILD_DIR, or built now in build-cuda), and the libraries
#     they need that the GPU machine may lack; gpu_check.sh runs them if its
#     own build fails.
set -euo pipefail
cd "$(dirname "$0")/.."

mkdir -p .gpu_data/debs
if ! git check-ignore -q .gpu_data 2>/dev/null; then
  echo /.gpu_data/ >>"$(git rev-parse --git-path info/exclude)"
fi

for p in ../shared/models/gguf/stories260K.gguf ../shared/models/stories260K.gguf; do
  if [ -f "$p" ]; then
    cp "$p" .gpu_data/stories260K.gguf
    break
  fi
done
[ -f .gpu_data/stories260K.gguf ] || { echo "stories260K.gguf is not in ../shared/models" >&2; exit 1; }

# The libraries the build links (and their shared dependencies, which the
# linker resolves too): fmt, nlohmann-json, CLI11, GoogleTest, PCRE2, ZeroMQ.
pkgs=(libfmt-dev libfmt9 nlohmann-json3-dev libcli11-dev libgtest-dev libpcre2-dev libpcre2-8-0 pkgconf pkgconf-bin
      libpkgconf3 libzmq3-dev libzmq5 libsodium23 libpgm-5.3-0 libnorm1 libbsd0 libmd0 libgssapi-krb5-2 libkrb5-3
      libk5crypto3 libkrb5support0 libcom-err2 libkeyutils1)
(cd .gpu_data/debs && { apt-get download "${pkgs[@]}" || { apt-get update -qq && apt-get download "${pkgs[@]}"; }; })

if [ "${1:-}" = "--prebuilt" ]; then
  # --prebuilt DIR: the binaries of an existing -DTANDEM_CUDA=ON build of this
  # tree; --prebuilt alone: build them here first (build-cuda).
  bdir=${2:-build-cuda}
  if [ -z "${2:-}" ]; then
    cmake -S . -B build-cuda -G Ninja -DTANDEM_CUDA=ON -DCMAKE_BUILD_TYPE=Release
    cmake --build build-cuda -j"$(nproc)" --target tandem tandem_cuda_tests
  fi
  mkdir -p .gpu_data/bin
  cp "$bdir/tandem" "$bdir/tandem_cuda_tests" .gpu_data/bin/
  # Libraries that machine may lack: fmt and ZeroMQ's (the debs above hold them too).
  for lib in $(ldd "$bdir/tandem" | awk '/libfmt|libzmq|libsodium|libpgm|libnorm/ {print $3}'); do cp -L "$lib" .gpu_data/bin/; done
fi
du -sh .gpu_data

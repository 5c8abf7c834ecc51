#!/usr/bin/env bash
# Sets up (scripts/setup.sh) and runs the whole test suite: the release build
# (with the CUDA backend and its tests wherever nvcc is; they skip without a
# GPU), then the same tests built with AddressSanitizer + UndefinedBehaviorSanitizer,
# then the server suite against a ThreadSanitizer build.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh

# Dequantization cross-check data: real tensors of the default model as the
# PyPI gguf package (numpy) decodes them; read by QuantXcheck.* tests.
MODEL="${TANDEM_MODEL_DIR:-$HOME/.cache/tandem/models}/gemma-3-270m-q4_k_m.gguf"
.venv/bin/python scripts/quant_xcheck.py "$MODEL" build/quant_xcheck.bin >/dev/null
export TANDEM_QUANT_XCHECK="$PWD/build/quant_xcheck.bin"

echo "== tests (release build)" >&2
ctest --test-dir build --output-on-failure -j"$(nproc)"

# The OpenAI-compatible server, driven by the official openai client over
# loopback (tests/server: completions, chat, streaming, disconnects, metrics,
# overload, batch invariance).
echo "== server tests (openai client against build/tandem serve)" >&2
TANDEM_CLI="$PWD/build/tandem" .venv/bin/python -m pytest -q tests/server

# The Python package: `pip install .` into the venv, built in the tree setup.sh
# configured (the same options, so it links the objects already built), then
# its tests (tests/python: stories260K and two Gemma cases, against the CLI).
echo "== python package tests (pip install ., tests/python)" >&2
.venv/bin/pip install -q --disable-pip-version-check --no-build-isolation --no-deps -C build-dir=build \
  -C cmake.define.TANDEM_TESTS=ON -C cmake.define.TANDEM_BENCH=ON .
TANDEM_CLI="$PWD/build/tandem" .venv/bin/python -m pytest -q tests/python

# The sanitizer builds: -O1 with line tables only (-g1). Reports keep their
# file:line stack traces, and each build compiles in about half the time
# that -O2 -g takes (the ASan build was the suite's longest step).
SANITIZER_BUILD=(-G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG"
  -DTANDEM_BENCH=OFF)

echo "== tests (ASan + UBSan build)" >&2
cmake -S . -B build-asan "${SANITIZER_BUILD[@]}" -DTANDEM_SANITIZE=ON >/dev/null
cmake --build build-asan -j"$(nproc)"
TANDEM_TEST_QUICK=1 ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --test-dir build-asan --output-on-failure -j"$(nproc)"

# Data races: the HTTP threads, the engine loop and the compute thread pool
# under ThreadSanitizer, driven by the same server suite (the Gemma tests are
# left out: 10x slower under TSan and no different in threading, as are the
# tool-calling tests, which run on Gemma; so are the replicas behind
# vllm-router, each the same server, which spend their time in the router's
# health checks; the deploy checks read the release binary's linked
# libraries, which TSan's runtime changes). Two more run only in the release
# pass: the stalled timeline subscribers (two minutes under TSan; the
# timeline's threads are raced by test_page_timeline_with_an_api_key) and the
# quantized pool's capacity (compute, no threading of its own).
echo "== server tests (ThreadSanitizer build)" >&2
cmake -S . -B build-tsan "${SANITIZER_BUILD[@]}" -DTANDEM_TSAN=ON -DTANDEM_TESTS=OFF >/dev/null
cmake --build build-tsan -j"$(nproc)" --target tandem
TSAN_OPTIONS="halt_on_error=1 exitcode=66 suppressions=$PWD/tests/tsan.supp" TANDEM_CLI="$PWD/build-tsan/tandem" \
  .venv/bin/python -m pytest -q tests/server -k "not test_chat and not test_gemma and not cluster_script and not test_deploy and not test_tools and not test_cluster \
  and not test_stalled_timeline_subscribers and not test_quantized_pool_holds_more_tokens"

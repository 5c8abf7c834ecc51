#!/usr/bin/env bash
# The CUDA backend's check on a GPU machine (docs/cuda.md). From the
# repository root, with .gpu_data/ made by scripts/gpu_prepare.sh:
#
#   bash scripts/gpu_check.sh
#
# Stages: the machine (nvidia-smi), the build (-DTANDEM_CUDA=ON, tandem and
# tandem_cuda_tests only), the CUDA tests, 1.1B synthetic models (q8_0, f16),
# the benchmarks (the card's read bandwidth, decode at batch 1, prefill of
# 512 tokens, decode at batch 8, decode without CUDA graphs), greedy `tandem
# run` on the GPU against the CPU, and a `tandem serve` smoke test. Each stage
# has its own timeout and the next runs whatever happened; the whole stays
# under ~7 minutes. Everything goes to $OUT/gpu_check.log as it happens;
# $OUT/summary.txt gets one line per stage and the numbers.
set -x
OUT=${OUT:-/tmp/gpu_check_out}
mkdir -p "$OUT"
LOG=$OUT/gpu_check.log
SUM=$OUT/summary.txt
: >"$SUM"
exec > >(tee -a "$LOG") 2>&1
START=$(date +%s)
BUDGET=${GPU_CHECK_BUDGET:-420}  # seconds for all stages

left() { echo $((BUDGET - ($(date +%s) - START))); }
note() { echo "$*" | tee -a "$SUM"; }
# stage NAME MAX_SECONDS COMMAND...: runs COMMAND (a program, or a function
# of this script: they are exported) under a timeout no longer than what the
# budget leaves, and notes how it ended.
stage() {
  local name=$1 max=$2
  shift 2
  local t
  t=$(left)
  [ "$t" -gt "$max" ] && t=$max
  if [ "$t" -lt 15 ]; then
    note "SKIP  $name (budget spent)"
    return 99
  fi
  local s=$(date +%s)
  if [ "$(type -t "$1")" = function ]; then
    timeout -k 5 "$t" bash -c '"$@"' _ "$@"
  else
    timeout -k 5 "$t" "$@"
  fi
  local rc=$?
  local d=$(($(date +%s) - s))
  if [ $rc -eq 0 ]; then note "OK    $name (${d}s)"
  elif [ $rc -eq 124 ] || [ $rc -eq 137 ]; then note "TIME  $name: killed after ${t}s"
  else note "FAIL  $name: exit $rc (${d}s)"; fi
  return $rc
}

# ---- a) the machine and the build ----
stage nvidia-smi 20 nvidia-smi
nvcc --version | tail -2
cmake --version | head -1
c++ --version | head -1
nproc

export PATH=/usr/local/cuda/bin:$PATH
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
CMAKE_EXTRA=()
DEPS=/tmp/tandem-deps
if ls .gpu_data/debs/*.deb >/dev/null 2>&1; then
  # The library packages gpu_prepare.sh carried, unpacked under /tmp; their
  # pkg-config files are pointed at that prefix.
  mkdir -p "$DEPS"
  for f in .gpu_data/debs/*.deb; do dpkg -x "$f" "$DEPS"; done
  sed -i "s#^prefix=/usr\$#prefix=$DEPS/usr#" "$DEPS"/usr/lib/x86_64-linux-gnu/pkgconfig/*.pc
  # libzmq.pc names the .pc files of its private dependencies, not carried:
  # their libraries are, and the linker finds them on LD_LIBRARY_PATH.
  sed -i '/^Requires.private/d' "$DEPS"/usr/lib/x86_64-linux-gnu/pkgconfig/libzmq.pc
  export LD_LIBRARY_PATH=$DEPS/usr/lib/x86_64-linux-gnu:$LD_LIBRARY_PATH
  export PKG_CONFIG_PATH=$DEPS/usr/lib/x86_64-linux-gnu/pkgconfig
  CMAKE_EXTRA+=("-DCMAKE_PREFIX_PATH=$DEPS/usr")
  command -v pkg-config >/dev/null || CMAKE_EXTRA+=("-DPKG_CONFIG_EXECUTABLE=$DEPS/usr/bin/pkgconf")
fi
build() {
  # shellcheck disable=SC2086  # the words of CMAKE_EXTRA_STR (paths without spaces)
  cmake -S . -B build-gpu -G Ninja -DTANDEM_CUDA=ON -DCMAKE_BUILD_TYPE=Release -DTANDEM_BENCH=OFF $CMAKE_EXTRA_STR &&
    cmake --build build-gpu -j16 --target tandem tandem_cuda_tests
}
export -f build note
export CMAKE_EXTRA_STR="${CMAKE_EXTRA[*]}"
export SUM OUT
if [ -n "${GPU_CHECK_PREBUILT:-}" ]; then
  note "SKIP  build (GPU_CHECK_PREBUILT)"
else
  stage build 300 build
fi
BIN=build-gpu
if [ ! -x build-gpu/tandem ] || [ ! -x build-gpu/tandem_cuda_tests ]; then
  if [ -x .gpu_data/bin/tandem ]; then
    note "NOTE  no binaries from the build: running those built elsewhere (.gpu_data/bin)"
    BIN=.gpu_data/bin
    export LD_LIBRARY_PATH=$PWD/.gpu_data/bin:$LD_LIBRARY_PATH
  fi
fi
TANDEM=$BIN/tandem
export TANDEM BIN LD_LIBRARY_PATH
export TANDEM_STORIES=$PWD/.gpu_data/stories260K.gguf

# ---- b) the CUDA tests ----
# One process per test: a kernel that faults leaves the CUDA context broken
# for every later test of its process.
run_tests() {
  : >"$OUT/cuda_tests.txt"
  : >/tmp/tests.failed
  local suite="" name rc pass=0 fail=0
  while IFS= read -r line; do
    case "$line" in
      " "*) name=${line#  }; name=${name%%  #*}
            timeout -k 5 120 "$BIN/tandem_cuda_tests" --gtest_color=no --gtest_filter="$suite$name" >>"$OUT/cuda_tests.txt" 2>&1
            rc=$?
            if [ $rc -eq 0 ]; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "$suite$name exit $rc" >>/tmp/tests.failed; fi ;;
      *) suite=$line ;;
    esac
  done < <("$BIN/tandem_cuda_tests" --gtest_list_tests | grep -v '^Running main')
  note "      tests: $pass passed (or skipped), $fail failed"
  sed 's/^/      FAILED /' /tmp/tests.failed | tee -a "$SUM"
  grep -h "SKIPPED \]\|no CUDA GPU" "$OUT/cuda_tests.txt" | sort | uniq -c | head -3
  [ $fail -eq 0 ]
}
export -f run_tests
if [ -x "$BIN/tandem_cuda_tests" ]; then
  stage cuda-tests 240 run_tests
  # The failed kernel tests again under compute-sanitizer: which access, where.
  if command -v compute-sanitizer >/dev/null && grep -q '^CudaKernels' /tmp/tests.failed 2>/dev/null; then
    filt=$(grep '^CudaKernels' /tmp/tests.failed | head -3 | awk '{print $1}' | paste -sd: -)
    stage "compute-sanitizer $filt" 90 sh -c "compute-sanitizer --tool memcheck --print-limit 20 '$BIN/tandem_cuda_tests' --gtest_color=no --gtest_filter='$filt' >'$OUT/sanitizer.txt' 2>&1"
    tail -40 "$OUT/sanitizer.txt"
  fi
fi

# ---- c) the models ----
SYN=/tmp/tandem-synth
mkdir -p "$SYN"
for t in q8_0 f16; do
  stage "synth tinyllama-1.1b $t" 90 "$TANDEM" synth --preset tinyllama-1.1b --vocab-from "$TANDEM_STORIES" --type $t \
    -o "$SYN/tl-$t.gguf"
done
ls -la "$SYN"

# ---- d) benchmarks, greedy runs, the server ----
: >"$OUT/bench.txt"
: >"$OUT/bench.jsonl"
for t in q8_0 f16; do
  stage "bench $t table (-p 512 -n 128)" 120 sh -c "'$TANDEM' bench -m '$SYN/tl-$t.gguf' --device cuda -p 512 -n 128 --reps 3 >>'$OUT/bench.txt' 2>&1"
  stage "bench $t json" 120 sh -c "'$TANDEM' bench -m '$SYN/tl-$t.gguf' --device cuda -p 512 -n 128 --reps 3 --json >>'$OUT/bench.jsonl'"
done
stage "bench q8_0 batch 8" 90 sh -c "'$TANDEM' bench -m '$SYN/tl-q8_0.gguf' --device cuda -p 128 -n 64 --reps 2 --batch 8 >>'$OUT/bench.txt' 2>&1"
stage "bench q8_0 without graphs" 90 sh -c "'$TANDEM' bench -m '$SYN/tl-q8_0.gguf' --device cuda --cuda-disable graphs -p 16 -n 128 --reps 2 >>'$OUT/bench.txt' 2>&1"
stage "bench q8_0 without PDL" 90 sh -c "'$TANDEM' bench -m '$SYN/tl-q8_0.gguf' --device cuda --cuda-disable pdl -p 16 -n 128 --reps 2 >>'$OUT/bench.txt' 2>&1"
cat "$OUT/bench.txt"

: >"$OUT/compare.txt"
compare() {  # greedy text of `tandem run` on the CPU and on the GPU
  local m=$1 name=$2
  "$TANDEM" run -m "$m" --device cpu -p "Once upon a time" --temp 0 -n 48 >"/tmp/run_cpu_$name.txt" 2>>"$OUT/compare.txt" &&
    "$TANDEM" run -m "$m" --device cuda -p "Once upon a time" --temp 0 -n 48 >"/tmp/run_gpu_$name.txt" 2>>"$OUT/compare.txt" || return 1
  { echo "== $name cpu:"; cat "/tmp/run_cpu_$name.txt"; echo; echo "== $name cuda:"; cat "/tmp/run_gpu_$name.txt"; echo; } >>"$OUT/compare.txt"
  if cmp -s "/tmp/run_cpu_$name.txt" "/tmp/run_gpu_$name.txt"; then
    note "      greedy run $name: the same text on cpu and cuda"
  else
    note "      greedy run $name: DIFFERENT ($(cmp "/tmp/run_cpu_$name.txt" "/tmp/run_gpu_$name.txt" | head -1))"
  fi
}
export -f compare
stage "run cpu vs cuda stories260K" 60 compare "$TANDEM_STORIES" stories260K
stage "run cpu vs cuda tinyllama q8_0" 90 compare "$SYN/tl-q8_0.gguf" tl-q8_0

serve_smoke() {
  local port=18093
  "$TANDEM" serve -m "$TANDEM_STORIES" --device cuda --port $port >"$OUT/serve.txt" 2>&1 &
  local pid=$!
  PYTHONUNBUFFERED=1 python3 - "$port" <<'PY'
import json, sys, time, urllib.request
port = sys.argv[1]
base = f"http://127.0.0.1:{port}"
for _ in range(120):
    try:
        urllib.request.urlopen(base + "/health", timeout=2).read()
        break
    except Exception:
        time.sleep(0.25)
req = urllib.request.Request(base + "/v1/completions", method="POST", headers={"Content-Type": "application/json"},
                             data=json.dumps({"prompt": "Once upon a time", "max_tokens": 16, "temperature": 0}).encode())
r = json.loads(urllib.request.urlopen(req, timeout=30).read())
print("completion:", json.dumps(r["choices"][0]["text"]), r["usage"])
m = urllib.request.urlopen(base + "/metrics", timeout=10).read().decode()
print("\n".join(l for l in m.splitlines() if l.startswith(("tandem_requests", "tandem_generation_tokens", "tandem_engine_phase_steps"))))
PY
  local rc=$?
  kill $pid
  wait $pid
  return $rc
}
export -f serve_smoke
stage "serve --device cuda smoke" 60 serve_smoke
tail -5 "$OUT/serve.txt"

# ---- e) the numbers ----
python3 - "$OUT/bench.jsonl" <<'PY' | tee -a "$SUM"
import json, sys
for line in open(sys.argv[1]):
    line = line.strip()
    if not line.startswith("{"):
        continue
    j = json.loads(line)
    print(f"      bench {j['weight_type_main']}: prefill {j['prefill_tok_s']:.0f} tok/s = "
          f"{j.get('device_prefill_tflops', 0):.1f} TFLOPS ({100 * j.get('device_prefill_peak_fraction', 0):.1f}% of "
          f"{j.get('device_prefill_peak_tflops', 0):.0f}); decode {j['decode_tok_s']:.0f} tok/s, "
          f"{j['decode_weight_bytes_per_token'] / 2**20:.0f} MiB/token = {j.get('device_decode_gb_s', 0):.0f} GB/s = "
          f"{100 * j.get('device_decode_bandwidth_fraction', 0):.1f}% of the measured {j.get('device_read_gb_s', 0):.0f} GB/s")
PY
grep -E '^(decode|prefill) ' "$OUT/bench.txt" | sed 's/^/      /' | tee -a "$SUM"
note "total $(($(date +%s) - START))s"
sleep 1  # let tee finish the log

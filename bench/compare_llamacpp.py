#!/usr/bin/env python3
"""Tandem against llama.cpp on the same GGUF files, side by side.

For each model, R rounds; each round runs Tandem (`tandem bench --json --reps 1`,
one warm-up then one timed repetition, in a fresh process) and then llama.cpp
(through llama-cpp-python's low-level API, also a fresh process with one
warm-up and one timed repetition). Before each run the model file is read
once, so both load it from the page cache. Both get the same prompt token ids (the
ones Tandem's bench picked, read from its JSON), the same number of threads,
a P-token prefill in one batch on an empty KV cache, then N single-token
decode steps of fixed ids (no sampling). Prints one markdown table of
medians with the min-max spread and the ratios (of the medians, and the median
of each round's own ratio), and a second one with Tandem's roofline.

llama-cpp-python is installed from PyPI into its own venv (bench/.venv by
default), compiled from source for this CPU (bench/llama_build.py).
--venv PATH reuses an existing one (it is installed there if missing).
--repack-cache DIR runs Tandem with its repack cache (written once before a
model's rounds): the load maps the repacked weights instead of repacking.

  bench/compare_llamacpp.py                 # Gemma 3 270M + the synthetic 1.1B models
  bench/compare_llamacpp.py -p 512 -n 64 -r 3 --venv /tmp/venvtest/v
  bench/compare_llamacpp.py some.gguf other.gguf --threads 2
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from llama_build import ggml_cmake_args

LLAMA_CPP_PYTHON_VERSION = "0.3.36"
REPO = Path(__file__).resolve().parent.parent
HOME = Path(os.environ.get("HOME", "/root"))
DEFAULT_GEMMA = HOME / ".cache/tandem/models/gemma-3-270m-q4_k_m.gguf"
DEFAULT_CACHE = HOME / ".cache/tandem/bench"
SYNTH_PRESET = "tinyllama-1.1b"
SYNTH_TYPES = ["q8_0", "q4_0", "q4_k_m", "f16"]
SYNTH_VOCAB = REPO.parent / "shared/models/vocab/ggml-vocab-llama-spm.gguf"
RUN_TIMEOUT_S = 3600


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- llama.cpp side


# ggml's type ids of the KV cache types both engines have (llama_context_params.type_k / type_v).
GGML_KV_TYPES = {"f16": 1, "q8_0": 8, "q4_0": 2}


def llama_worker(args: argparse.Namespace) -> int:
    """Runs inside the venv: one warm-up and one timed repetition, JSON to stdout."""
    import ctypes
    import resource

    import llama_cpp as L

    logs: list[str] = []

    @L.llama_log_callback
    def on_log(level, text, user_data):  # noqa: ARG001 - ctypes signature
        logs.append(text.decode("utf-8", errors="replace"))

    L.llama_log_set(on_log, ctypes.c_void_p())
    L.llama_backend_init()

    tokens = json.loads(Path(args.tokens).read_text())
    P, N, T = args.prompt, args.gen, args.threads
    if len(tokens) < P + N:
        raise SystemExit(f"need {P + N} token ids, got {len(tokens)}")

    t0 = time.perf_counter()
    model = L.llama_model_load_from_file(args.model.encode(), L.llama_model_default_params())
    if not model:
        raise SystemExit(f"llama.cpp could not load {args.model}")
    cp = L.llama_context_default_params()
    cp.n_ctx = P + N
    cp.n_batch = P  # the whole prompt is one batch and one micro-batch
    cp.n_ubatch = P
    cp.n_threads = T
    cp.n_threads_batch = T
    cp.flash_attn_type = {"auto": L.LLAMA_FLASH_ATTN_TYPE_AUTO, "on": L.LLAMA_FLASH_ATTN_TYPE_ENABLED,
                          "off": L.LLAMA_FLASH_ATTN_TYPE_DISABLED}[args.flash_attn]
    cp.type_k = cp.type_v = GGML_KV_TYPES[args.kv_type]
    ctx = L.llama_init_from_model(model, cp)
    if not ctx:
        raise SystemExit("llama.cpp could not create a context")
    load_s = time.perf_counter() - t0

    batch = L.llama_batch_init(P, 0, 1)

    def fill(ids: list[int], start: int, last_logits_only: bool) -> None:
        for i, tok in enumerate(ids):
            batch.token[i] = tok
            batch.pos[i] = start + i
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = 0
            batch.logits[i] = 1 if (not last_logits_only or i == len(ids) - 1) else 0
        batch.n_tokens = len(ids)

    def decode() -> None:
        rc = L.llama_decode(ctx, batch)
        if rc != 0:
            raise SystemExit(f"llama_decode returned {rc}")
        L.llama_synchronize(ctx)

    def one_rep() -> tuple[float, float, float, float]:
        """Wall and process-CPU seconds of the prefill and of the decode steps."""
        L.llama_memory_clear(L.llama_get_memory(ctx), True)
        fill(tokens[:P], 0, True)
        t, c = time.perf_counter(), time.process_time()
        decode()
        prefill_s, prefill_cpu_s = time.perf_counter() - t, time.process_time() - c
        t, c = time.perf_counter(), time.process_time()
        for i in range(N):
            fill([tokens[P + i]], P + i, False)
            decode()
        return prefill_s, time.perf_counter() - t, prefill_cpu_s, time.process_time() - c

    tw = time.perf_counter()
    one_rep()
    warmup_s = time.perf_counter() - tw
    prefill_s, decode_s, prefill_cpu_s, decode_cpu_s = one_rep()
    L.llama_batch_free(batch)

    out = {
        "engine": "llama.cpp",
        "llama_cpp_python": L.__version__,
        "system_info": L.llama_print_system_info().decode(errors="replace").strip(),
        "model": args.model,
        "threads": T,
        "n_prompt": P,
        "n_gen": N,
        "load_s": load_s,
        "warmup_s": warmup_s,
        "prefill_s": prefill_s,
        "decode_s": decode_s,
        "prefill_cpu_s": [prefill_cpu_s],
        "decode_cpu_s": [decode_cpu_s],
        "prefill_tok_s": P / prefill_s,
        "decode_tok_s": N / decode_s if N else 0.0,
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "flash_attn_requested": args.flash_attn,
        "type_k": int(cp.type_k),
        "type_v": int(cp.type_v),
        # "auto" is resolved inside llama.cpp; its graph log shows whether the
        # fused FLASH_ATTN_EXT op was used.
        "flash_attn_used": any("FLASH_ATTN_EXT" in ln for ln in logs),
        "log_notes": [ln.strip() for ln in logs
                      if "flash_attn " in ln or "llama_kv_cache: size" in ln or "CPU_REPACK model buffer" in ln][:8],
    }
    L.llama_free(ctx)
    L.llama_model_free(model)
    print(json.dumps(out))
    return 0


# ---------------------------------------------------------------- driver side


def venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def llama_cpp_version(py: Path) -> str | None:
    if not py.exists():
        return None
    r = subprocess.run([str(py), "-c", "import llama_cpp; print(llama_cpp.__version__)"], capture_output=True,
                       text=True, cwd="/")
    return r.stdout.strip() if r.returncode == 0 else None


def ensure_venv(venv: Path) -> Path:
    py = venv_python(venv)
    have = llama_cpp_version(py)
    if have == LLAMA_CPP_PYTHON_VERSION:
        log(f"llama-cpp-python {have} found in {venv}")
        return py
    if not py.exists():
        log(f"creating venv {venv}")
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    # From source, no cached wheel: ggml then targets this CPU's instruction set.
    env = dict(os.environ, CMAKE_ARGS=" ".join(ggml_cmake_args()), FORCE_CMAKE="1")
    log(f"installing llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION} (compiles llama.cpp; takes a while)")
    subprocess.run([str(py), "-m", "pip", "install", "--no-cache-dir", "--no-binary", "llama-cpp-python",
                    f"llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION}"], check=True, env=env)
    have = llama_cpp_version(py)
    if have != LLAMA_CPP_PYTHON_VERSION:
        raise SystemExit(f"llama-cpp-python did not install into {venv} (import gives {have!r})")
    return py


def ensure_synth(tandem: Path, cache: Path, typ: str) -> Path:
    path = cache / f"{SYNTH_PRESET}-synth-{typ}.gguf"
    if path.exists():
        return path
    cache.mkdir(parents=True, exist_ok=True)
    log(f"writing {path} with tandem synth")
    tmp = path.with_suffix(".gguf.part")
    subprocess.run([str(tandem), "synth", "--preset", SYNTH_PRESET, "--vocab-from", str(SYNTH_VOCAB), "--type", typ,
                    "-o", str(tmp)], check=True)
    tmp.rename(path)
    return path


def page_in(path: Path) -> float:
    """Reads the whole file so that it is in the page cache when a run starts:
    the load target is for a file in the page cache, and this VM pages out
    file pages left idle for about a minute (DAMON), so a model untouched since
    the previous model's rounds would otherwise load partly from disk. Returns
    the seconds it took (long when the file had been paged out)."""
    t0 = time.perf_counter()
    with open(path, "rb", buffering=0) as f:
        while f.read(16 << 20):
            pass
    return time.perf_counter() - t0


def run_json(cmd: list[str]) -> dict:
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    if r.returncode != 0:
        raise SystemExit(f"command failed ({r.returncode}): {' '.join(cmd)}\n{r.stderr[-4000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def stats(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def cell(s: dict) -> str:
    return f"{s['median']:.1f} ({s['min']:.1f}-{s['max']:.1f})"


def machine_info(tandem: Path) -> dict:
    info = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "platform": platform.platform()}
    try:
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        for line in lscpu.splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("Model name", "CPU(s)", "Thread(s) per core", "Core(s) per socket", "L3 cache"):
                info[key.strip()] = value.strip()
            if key.strip() == "Flags":
                info["simd_flags"] = " ".join(f for f in value.split()
                                              if f.startswith(("avx", "fma", "f16c", "amx")))
    except OSError:
        pass
    info["tandem_binary"] = str(Path(tandem).resolve())
    try:
        info["repo_head"] = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
                                               capture_output=True, text=True).stdout.strip()
    except OSError:
        pass
    return info


def compare(args: argparse.Namespace) -> int:
    tandem = Path(args.tandem).resolve()
    if not tandem.exists():
        raise SystemExit(f"{tandem} does not exist: build Tandem first (cmake --build build)")
    py = ensure_venv(Path(args.venv) if args.venv else REPO / "bench/.venv")

    models = [Path(m) for m in args.models]
    if not models:
        models = [DEFAULT_GEMMA] + [ensure_synth(tandem, Path(args.cache_dir), t) for t in SYNTH_TYPES]
    for m in models:
        if not m.exists():
            raise SystemExit(f"model {m} does not exist")

    P, N, R = args.prompt, args.gen, args.rounds
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for m in models:
            tokens_file = Path(tmp) / "tokens.json"
            token_ids = None
            runs: dict[str, list[dict]] = {"tandem": [], "llama": []}
            cache_args = ["--repack-cache", args.repack_cache] if args.repack_cache else []
            if cache_args:  # written once here, outside the rounds; each round then maps it
                log(f"{m.name}: writing the repack cache in {args.repack_cache}")
                run_json([str(tandem), "bench", "--json", "-m", str(m), "-p", "8", "-n", "1", "--reps", "1",
                          "--warmup", "0", "--threads", str(args.threads), *cache_args])
            for rnd in range(R):
                log(f"{m.name}: round {rnd + 1}/{R}: tandem")
                page_in_s = page_in(m)
                load_before = os.getloadavg()[0]
                tj = run_json([str(tandem), "bench", "--json", "-m", str(m), "-p", str(P), "-n", str(N),
                               "--threads", str(args.threads), "--reps", "1", "--kv-type", args.kv_type,
                               *cache_args])
                if token_ids is None:
                    token_ids = tj["token_ids"]
                    tokens_file.write_text(json.dumps(token_ids))
                elif tj["token_ids"] != token_ids:
                    raise SystemExit("tandem bench chose different token ids between runs")
                tj.pop("token_ids")
                tj["loadavg_1min_before"] = load_before
                tj["page_in_s_before"] = page_in_s
                runs["tandem"].append(tj)
                log(f"  tandem prefill {tj['prefill_tok_s']:.1f} tok/s, decode {tj['decode_tok_s']:.1f} tok/s; "
                    f"round {rnd + 1}/{R}: llama.cpp")
                page_in_s = page_in(m)
                load_before = os.getloadavg()[0]
                lj = run_json([str(py), str(Path(__file__).resolve()), "--llama-worker", "--model", str(m),
                               "--tokens", str(tokens_file), "-p", str(P), "-n", str(N), "--threads",
                               str(args.threads), "--flash-attn", args.flash_attn, "--kv-type", args.kv_type])
                lj["loadavg_1min_before"] = load_before
                lj["page_in_s_before"] = page_in_s
                runs["llama"].append(lj)
                log(f"  llama.cpp prefill {lj['prefill_tok_s']:.1f} tok/s, decode {lj['decode_tok_s']:.1f} tok/s")
            results.append({"model": str(m), "runs": runs})

    info = machine_info(tandem)
    if results:
        info["llama_system_info"] = results[0]["runs"]["llama"][0]["system_info"]
        info["llama_log_notes"] = results[0]["runs"]["llama"][0]["log_notes"]
        info["llama_flash_attn_used"] = {Path(r["model"]).name: r["runs"]["llama"][0]["flash_attn_used"]
                                         for r in results}
    report = {"machine": info, "prompt": P, "gen": N, "rounds": R, "threads": args.threads, "kv_type": args.kv_type,
              "flash_attn": args.flash_attn, "repack_cache": args.repack_cache, "results": results}
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(report, indent=1))
    print(markdown(report))
    return 0


def round_speeds(runs: list[dict], P: int, N: int, cpu: bool) -> tuple[list[float], list[float]]:
    """Prefill and decode tok/s of each round: wall clock, or per process-CPU second."""
    if cpu:
        return [P / x["prefill_cpu_s"][0] for x in runs], [N / x["decode_cpu_s"][0] for x in runs]
    return [x["prefill_tok_s"] for x in runs], [x["decode_tok_s"] for x in runs]


def paired(t: list[float], l: list[float]) -> str:
    """Median (min-max) of the rounds' own ratios: each round's two runs are
    seconds apart, so a drift of the machine's speed over minutes divides out
    where a ratio of medians may pair one engine's fast round with the
    other's slow one."""
    r = [a / b for a, b in zip(t, l)]
    return f"{statistics.median(r):.2f} ({min(r):.2f}-{max(r):.2f})"


def speed_table(report: dict, cpu: bool) -> list[str]:
    P, N = report["prompt"], report["gen"]
    unit = "tok/CPU-s" if cpu else "tok/s"
    lines = [f"| model | type | Tandem prefill {unit} | llama.cpp prefill {unit} | ratio | per round "
             f"| Tandem decode {unit} | llama.cpp decode {unit} | ratio | per round |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for res in report["results"]:
        t, l = res["runs"]["tandem"], res["runs"]["llama"]
        tp, td = round_speeds(t, P, N, cpu)
        lp, ld = round_speeds(l, P, N, cpu)
        lines.append(f"| {Path(res['model']).name} | {t[0]['model_type']} | {cell(stats(tp))} | {cell(stats(lp))} "
                     f"| {statistics.median(tp) / statistics.median(lp):.2f} | {paired(tp, lp)} "
                     f"| {cell(stats(td))} | {cell(stats(ld))} "
                     f"| {statistics.median(td) / statistics.median(ld):.2f} | {paired(td, ld)} |")
    return lines


def markdown(report: dict) -> str:
    P, N = report["prompt"], report["gen"]
    lines = [f"P = {P} prompt tokens, N = {N} decode steps, KV cache {report.get('kv_type', 'f16')}, "
             f"{report['threads']} threads, "
             f"{report['rounds']} alternating rounds; tok/s as median (min-max); ratio = Tandem / llama.cpp "
             f"(medians); per round = median (min-max) of each round's own Tandem / llama.cpp."
             + (f" Tandem maps its repacked weights from --repack-cache {report['repack_cache']}."
                if report.get("repack_cache") else ""), ""] + speed_table(report, False)
    if report["threads"] == 1:
        # One thread: process CPU time is the work itself, little disturbed by
        # other processes (no spin-waits are counted: there is nobody to wait for).
        lines += ["", "The same runs, per second of process CPU time:", ""] + speed_table(report, True)
    # "beside": each repetition's decode against a plain read of the same
    # weights right after it (the machine's bandwidth drifts within minutes).
    detail = ["| model | Tandem load s | Tandem peak RSS MiB | file + KV MiB | decode GB/s (of read BW) "
              "| decode / read beside | llama.cpp decode / read beside (1.25x needs) | prefill GOP/s (of peak) "
              "| llama.cpp load s | llama.cpp peak RSS MiB |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for res in report["results"]:
        t, l = res["runs"]["tandem"], res["runs"]["llama"]
        name = Path(res["model"]).name
        mib = 1024 * 1024
        gb = statistics.median([x["decode_gb_s"] for x in t])
        gbf = statistics.median([x["decode_bandwidth_fraction"] for x in t])
        beside = statistics.median([x["decode_bandwidth_fraction_beside"] for x in t])
        read = statistics.median([v for x in t for v in x["read_gb_s_beside"]])
        # llama.cpp reads the same weights per token: its decode over the read
        # measured beside Tandem's run of the same round says how much room
        # the memory leaves, and what a 1.25x Tandem would have to read at.
        per_token = t[0]["decode_weight_bytes_per_token"]
        llama_beside = statistics.median([y["decode_tok_s"] * per_token / 1e9 / statistics.median(x["read_gb_s_beside"])
                                          for x, y in zip(t, l)])
        gop = statistics.median([x["prefill_gop_s"] for x in t])
        gopf = statistics.median([x["prefill_peak_fraction"] for x in t])
        detail.append(
            f"| {name} | {statistics.median([x['load_s'] for x in t]):.3f} "
            f"| {max(x['peak_rss_bytes'] for x in t) / mib:.0f} "
            f"| {(t[0]['file_bytes'] + t[0]['kv_cache_bytes']) / mib:.0f} "
            f"| {gb:.1f} ({100 * gbf:.0f}% of {t[0]['roofline']['read_gb_s']['value']:.1f}) "
            f"| {100 * beside:.0f}% of {read:.1f} "
            f"| {100 * llama_beside:.0f}% ({125 * llama_beside:.0f}%) "
            f"| {gop:.0f} ({100 * gopf:.0f}% of {t[0]['prefill_peak_gop_s']:.0f} {t[0]['prefill_compute_family']}) "
            f"| {statistics.median([x['load_s'] for x in l]):.3f} "
            f"| {max(x['peak_rss_bytes'] for x in l) / mib:.0f} |")
    return "\n".join(lines + ["", "Tandem roofline, load and memory (medians; RSS is the maximum over rounds):", ""]
                     + detail)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="*", help="GGUF files (default: Gemma 3 270M Q4_K_M and the synthetic "
                    "TinyLlama-shaped 1.1B in q8_0, q4_0, q4_k_m, f16, created if missing)")
    ap.add_argument("-p", "--prompt", type=int, default=512, help="prompt tokens (one batch)")
    ap.add_argument("-n", "--gen", type=int, default=64, help="decode steps")
    ap.add_argument("-r", "--rounds", type=int, default=3, help="alternating rounds per model")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="threads for both engines")
    ap.add_argument("--tandem", default=str(REPO / "build/tandem"), help="the tandem binary")
    ap.add_argument("--venv", help="reuse this venv for llama-cpp-python (installed there if missing)")
    ap.add_argument("--cache-dir", default=str(DEFAULT_CACHE), help="where the synthetic models are written")
    ap.add_argument("--flash-attn", choices=["auto", "on", "off"], default="auto",
                    help="llama.cpp flash attention (auto is the library default)")
    ap.add_argument("--kv-type", choices=sorted(GGML_KV_TYPES), default="f16",
                    help="K and V cache type for both engines (a quantized V needs llama.cpp's flash attention)")
    ap.add_argument("--json-out", help="also write every run's raw results here")
    ap.add_argument("--repack-cache", help="run Tandem with --repack-cache DIR (the cache is written before "
                    "the rounds, so every round maps it)")
    ap.add_argument("--llama-worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--tokens", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.prompt < 1 or args.gen < 1 or args.rounds < 1 or args.threads < 1:
        ap.error("need -p >= 1, -n >= 1, -r >= 1, --threads >= 1")
    if args.kv_type != "f16" and args.flash_attn == "off":
        ap.error(f"--kv-type {args.kv_type} needs llama.cpp's flash attention (--flash-attn on or auto)")
    if args.kv_type != "f16" and args.flash_attn == "auto":
        args.flash_attn = "on"
    if args.llama_worker:
        return llama_worker(args)
    return compare(args)


if __name__ == "__main__":
    sys.exit(main())

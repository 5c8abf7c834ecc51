#!/usr/bin/env python3
"""The serving scenarios, for `tandem serve` and for llama.cpp's server, in one table.

For each model a server is started (fresh per model and side, loopback only,
the same thread count for both), the scenarios below run against it through
bench/serve_bench.py (the official `openai` client, streaming), and the server
is stopped. Scenarios:

  (a) throughput: output tok/s of C concurrent clients (default 16) against the
      single-stream decode rate (1 / median TPOT of one client alone, run before
      and after the concurrent clients; the faster of the two counts).
      Target: >= 4x.
  (b) shared system prompt: one client sends requests that all start with the
      same ~1,000-token system prompt; the TTFT of the later requests (median)
      against the first's. Target: <= 20%.
  (c) chats under long prompts: K chat clients (short prompts, streamed
      replies) decode while a background client keeps sending ~1,500-token
      prompts back to back; the chats' p99 TPOT against the same chats run
      alone. Target: within 2x (chunked prefill). The chats go through
      /v1/completions: the synthetic model has no chat template, and the chat
      endpoint would only add templating.

Every scenario uses streaming /v1/completions with greedy sampling and runs
each request to its max_tokens.

`--sides llama-server` adds llama.cpp's own server, built once from the llama.cpp
sources inside the same llama-cpp-python sdist (bench/.llama-server; native CPU
flags, no web UI), with one slot per concurrent client (-np, each with the
per-sequence context) and its default continuous batching.

llama.cpp's side is llama-cpp-python's server (`python -m llama_cpp.server`,
the llama-cpp-python[server] extra), installed from source with
built for this CPU (bench/llama_build.py) into bench/.venv (shared with compare_llamacpp.py)
unless --venv points at another venv; the server's Python dependencies and
the openai client are added there. It runs with --interrupt_requests False:
its default cuts a streaming request short whenever another one arrives.
It serves one request at a time (no continuous batching).

  bench/serve_compare.py                                 # both models, both sides, all scenarios
  bench/serve_compare.py --venv /tmp/venvtest/v --sides tandem --scenarios a,b
  bench/serve_compare.py --models gemma --json out.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

from llama_build import ggml_cmake_args

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
import serve_bench as sb  # noqa: E402 - needs the path above; imports no third-party module

LLAMA_CPP_PYTHON_VERSION = "0.3.36"
SERVER_DEPS = ["uvicorn>=0.22.0", "fastapi>=0.100.0", "pydantic-settings>=2.0.1", "sse-starlette>=1.6.1",
               "starlette-context>=0.3.6,<0.4", "PyYAML>=5.1", "openai"]
HOME = Path(os.environ.get("HOME", "/root"))
MODELS = {
    "gemma": HOME / ".cache/tandem/models/gemma-3-270m-q4_k_m.gguf",
    "tinyllama": HOME / ".cache/tandem/bench/tinyllama-1.1b-synth-q8_0.gguf",
}
SYNTH_VOCAB = REPO.parent / "shared/models/vocab/ggml-vocab-llama-spm.gguf"

# Per scenario: the serve_bench arguments. Sized for a 2-core machine; the
# same requests go to both sides.
A_SINGLE = ["-c", "1", "-n", "3", "--prompt-len", "64", "--output-len", "{out}"]
SCENARIOS = {
    "a_single": A_SINGLE,
    "a_batch": ["-c", "{conc}", "-n", "{nbatch}", "--prompt-len", "uniform:32:96", "--output-len", "{out}"],
    # The machine's memory bandwidth drifts over minutes (see docs/benchmarks.md), so the single
    # stream runs before and after the batch and the faster of the two is the baseline.
    "a_single_after": A_SINGLE,
    "b_shared": ["-c", "1", "-n", "6", "--shared-prefix", "1000", "--prompt-len", "24", "--output-len", "8"],
    "c_unloaded": ["-c", "{chats}", "-n", "{nchats}", "--prompt-len", "64", "--output-len", "{chat_out}"],
    "c_loaded": ["-c", "{chats}", "-n", "{nchats}", "--prompt-len", "64", "--output-len", "{chat_out}",
                 "--bg-concurrency", "1", "--bg-prompt-len", "1500", "--bg-output-len", "4", "--bg-lead", "1"],
}
GROUPS = {"a": ["a_single", "a_batch", "a_single_after"], "b": ["b_shared"], "c": ["c_unloaded", "c_loaded"]}


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- setup


def venv_has(py: Path, code: str) -> str | None:
    if not py.exists():
        return None
    r = subprocess.run([str(py), "-c", code], capture_output=True, text=True, cwd="/")
    return r.stdout.strip() if r.returncode == 0 else None


def ensure_venv(venv: Path) -> Path:
    py = venv / "bin" / "python"
    if venv_has(py, "import llama_cpp; print(llama_cpp.__version__)") != LLAMA_CPP_PYTHON_VERSION:
        if not py.exists():
            log(f"creating venv {venv}")
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        # From source, no cached wheel: ggml then targets this CPU's instruction set.
        env = dict(os.environ, CMAKE_ARGS=" ".join(ggml_cmake_args()), FORCE_CMAKE="1")
        log(f"installing llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION} (compiles llama.cpp; takes a while)")
        subprocess.run([str(py), "-m", "pip", "install", "--no-cache-dir", "--no-binary", "llama-cpp-python",
                        f"llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION}"], check=True, env=env)
    if venv_has(py, "import llama_cpp.server.app, openai; print('ok')") != "ok":
        # The [server] extra's dependencies, named one by one so pip never
        # reconsiders (and rebuilds) llama-cpp-python itself.
        log(f"installing the server's dependencies and openai into {venv}")
        subprocess.run([str(py), "-m", "pip", "install", *SERVER_DEPS], check=True)
        if venv_has(py, "import llama_cpp.server.app, openai; print('ok')") != "ok":
            raise SystemExit(f"llama_cpp.server or openai does not import in {venv}")
    return py


def ensure_llama_server(root: Path) -> Path:
    """llama.cpp's own server, built from the llama.cpp sources that the
    llama-cpp-python sdist on PyPI carries (same version as the venv's), for
    this CPU; without its web UI, HTTPS or tests."""
    binary = root / "build" / "bin" / "llama-server"
    if binary.exists():
        return binary
    src = root / "src"
    src.mkdir(parents=True, exist_ok=True)
    sdist = src / f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}.tar.gz"
    if not sdist.exists():
        log(f"downloading the llama-cpp-python {LLAMA_CPP_PYTHON_VERSION} sdist (llama.cpp's sources)")
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps", "-d", str(src),
                        f"llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION}"], check=True)
    tree = src / f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}" / "vendor" / "llama.cpp"
    if not tree.exists():
        subprocess.run(["tar", "xzf", str(sdist), "-C", str(src)], check=True)
    log("building llama-server (takes a while)")
    subprocess.run(["cmake", "-S", str(tree), "-B", str(root / "build"), "-DCMAKE_BUILD_TYPE=Release",
                    *ggml_cmake_args(), "-DLLAMA_BUILD_SERVER=ON", "-DLLAMA_BUILD_TOOLS=ON", "-DLLAMA_BUILD_TESTS=OFF",
                    "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_OPENSSL=OFF", "-DLLAMA_BUILD_UI=OFF",
                    "-DLLAMA_USE_PREBUILT_UI=OFF"], check=True)
    subprocess.run(["cmake", "--build", str(root / "build"), "--target", "llama-server", "-j",
                    str(os.cpu_count() or 2)], check=True)
    if not binary.exists():
        raise SystemExit(f"the llama.cpp build did not produce {binary}")
    return binary


def ensure_model(name: str, tandem: Path) -> Path:
    path = MODELS.get(name, Path(name))
    if path.exists():
        return path
    if name != "tinyllama":
        raise SystemExit(f"model {path} does not exist")
    path.parent.mkdir(parents=True, exist_ok=True)
    log(f"writing {path} with tandem synth")
    tmp = path.with_suffix(".gguf.part")
    subprocess.run([str(tandem), "synth", "--preset", "tinyllama-1.1b", "--vocab-from", str(SYNTH_VOCAB),
                    "--type", "q8_0", "-o", str(tmp)], check=True)
    tmp.rename(path)
    return path


EOG_PROBE = """
import json, sys
import llama_cpp as L
L.llama_backend_init()
mp = L.llama_model_default_params()
mp.vocab_only = True
m = L.llama_model_load_from_file(sys.argv[1].encode(), mp)
if not m:
    raise SystemExit("llama.cpp could not load " + sys.argv[1])
v = L.llama_model_get_vocab(m)
print(json.dumps([i for i in range(L.llama_vocab_n_tokens(v)) if L.llama_vocab_is_eog(v, i)]))
"""


def llama_eog_tokens(py: Path, model: Path) -> list[int]:
    """llama.cpp's end-of-generation tokens for the model (EOS, end-of-turn, ...)."""
    r = subprocess.run([str(py), "-c", EOG_PROBE, str(model)], capture_output=True, text=True, cwd="/")
    if r.returncode != 0:
        raise SystemExit(f"could not read the EOG tokens of {model}: {r.stderr[-1000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_cmd(side: str, model: Path, port: int, args, py: Path) -> list[str]:
    prefix = ["nice", "-n", str(args.nice)] if args.nice else []
    if side == "tandem":
        return prefix + [str(args.tandem), "serve", "-m", str(model), "--host", "127.0.0.1", "--port", str(port),
                "--threads", str(args.threads), "--ctx-size", str(args.ctx), "--max-seqs", str(args.max_seqs),
                *args.tandem_arg]
    if side == "llama-server":
        # One slot per concurrent client, each with the per-sequence context (-c is their total);
        # continuous batching is llama-server's default.
        slots = max(args.concurrency, args.chats + 1)
        return prefix + [str(args.llama_server), "-m", str(model), "--host", "127.0.0.1", "--port", str(port),
                "--threads", str(args.threads), "--threads-batch", str(args.threads), "-c", str(args.ctx * slots),
                "-np", str(slots), *args.llama_server_arg]
    return prefix + [str(py), "-m", "llama_cpp.server", "--model", str(model), "--host", "127.0.0.1", "--port", str(port),
            "--n_threads", str(args.threads), "--n_threads_batch", str(args.threads), "--n_ctx", str(args.ctx),
            "--interrupt_requests", "False", *args.llama_arg]


def machine_info(args) -> dict:
    info = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "platform": platform.platform(), "cpus": os.cpu_count()}
    try:
        for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("Model name", "Thread(s) per core", "Core(s) per socket", "L3 cache"):
                info[key.strip()] = value.strip()
    except OSError:
        pass
    info["tandem_commit"] = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
                                           capture_output=True, text=True).stdout.strip()
    info["tandem_worktree_dirty"] = bool(subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "-uno"],
                                                        capture_output=True, text=True).stdout.strip())
    if args.tandem.exists():
        st = args.tandem.stat()
        info["tandem_binary"] = {"path": str(args.tandem), "mtime": time.strftime("%Y-%m-%d %H:%M:%S",
                                                                                 time.localtime(st.st_mtime))}
    return info


# ---------------------------------------------------------------- running


def run_side(side: str, model: Path, args, py: Path, out_dir: Path) -> dict:
    port = free_port()
    cmd = server_cmd(side, model, port, args, py)
    base = f"http://127.0.0.1:{port}/v1"
    tag = f"{model.stem}-{side}"
    proc = sb.launch(" ".join(map(sb.shlex.quote, cmd)), str(out_dir / f"{tag}-server.log"))
    results: dict[str, dict] = {}
    # Both sides generate exactly max_tokens: Tandem through ignore_eos; the
    # llama-cpp-python server has min_tokens, which masks only EOS and not a
    # chat model's end-of-turn token, so its side also bans every EOG token.
    extra = []
    if side == "llama":
        extra = ["--extra-body", json.dumps({"logit_bias": {str(t): -1e4 for t in llama_eog_tokens(py, model)}})]
    try:
        t = time.monotonic()
        sb.wait_ready(base, proc, args.ready_timeout, None)
        log(f"{tag}: ready after {time.monotonic() - t:.1f} s")
        fill = {"out": args.output_len, "conc": args.concurrency, "nbatch": args.batch_requests,
                "chats": args.chats, "nchats": args.chat_requests, "chat_out": args.chat_output_len}
        for seed, name in enumerate(n for g in args.scenarios for n in GROUPS[g]):
            argv = [a.format(**fill) for a in SCENARIOS[name]]
            jpath = out_dir / f"{tag}-{name}.json"
            full = [str(py), str(HERE / "serve_bench.py"), "--base-url", base, "--seed", str(100 + seed),
                    "--json", str(jpath), "--quiet", *extra, *argv]
            load = os.getloadavg()[0]
            log(f"{tag}: {name}: serve_bench {' '.join(argv)} (1-min load {load:.2f})")
            r = subprocess.run(full, capture_output=True, text=True, timeout=args.scenario_timeout)
            if r.returncode != 0 or not jpath.exists():
                log(f"{tag}: {name} failed ({r.returncode}):\n{r.stdout[-2000:]}{r.stderr[-2000:]}")
                results[name] = {"error": (r.stdout + r.stderr)[-2000:]}
                if proc.poll() is not None:
                    break
                continue
            rep = json.loads(jpath.read_text())
            rep["loadavg_1min_before"] = load
            rep["command"] = " ".join(["bench/serve_bench.py", *argv])
            jpath.write_text(json.dumps(rep, indent=1))
            results[name] = rep
            print(r.stdout.rstrip(), file=sys.stderr)
    finally:
        sb.stop_server(proc)
    return {"server_command": " ".join(cmd), "scenarios": results}


# ---------------------------------------------------------------- the table


def metric(res: dict, name: str, *path):
    r = res["scenarios"].get(name)
    if not r or "summary" not in r:
        return None
    v = r["summary"]
    for p in path:
        v = v.get(p) if isinstance(v, dict) else None
        if v is None:
            return None
    return v


def phase_steps(res: dict) -> str | None:
    """What the engine's steps looked like during the 16-client run (Tandem's per-phase counters)."""
    delta = (res["scenarios"].get("a_batch") or {}).get("server_metrics_delta") or {}
    def get(kind: str, phase: str) -> float:
        return delta.get(f'tandem_engine_phase_{kind}_total{{phase="{phase}"}}', 0.0)
    if not any(k.startswith("tandem_engine_phase_") for k in delta):
        return None
    decode, mixed = get("steps", "decode"), get("steps", "mixed")
    per_mixed = f"{get('rows', 'mixed') / mixed:.1f}" if mixed else "-"
    return f"{decode:.0f} / {mixed:.0f}, {per_mixed}"


def scenario_rows(res: dict, conc: int) -> list[tuple[str, str, float | None, str]]:
    """(scenario, quantity, value, unit) for one side."""
    rows = []
    tpots = [t for t in (metric(res, n, "tpot_s", "p50") for n in ("a_single", "a_single_after")) if t]
    single = 1 / min(tpots) if tpots else None
    batch = metric(res, "a_batch", "output_throughput")
    rows += [("a", "single-stream decode rate (1 / TPOT p50; the faster of before and after)", single, "tok/s"),
             ("a", f"{conc} clients: output throughput", batch, "tok/s"),
             ("a", f"{conc} clients: TPOT p50", metric(res, "a_batch", "tpot_s", "p50"), "ms"),
             ("a", f"{conc} clients / single stream (target >= 4x)",
              batch / single if batch and single else None, "x"),
             ("a", f"{conc} clients: steps decode-only / mixed, rows per mixed step", phase_steps(res), "text")]
    b = res["scenarios"].get("b_shared")
    first = later = None
    if b and "requests" in b:
        ttfts = [q["ttft"] for q in b["requests"] if q["ok"]]
        if len(ttfts) >= 2 and b["requests"][0]["ok"]:
            first, later = ttfts[0], statistics.median(ttfts[1:])
    rows += [("b", "TTFT of the first request", first, "ms"),
             ("b", "TTFT of the later requests (median)", later, "ms"),
             ("b", "later / first (target <= 20%)", later / first if first and later else None, "%")]
    un = metric(res, "c_unloaded", "tpot_s", "p99")
    lo = metric(res, "c_loaded", "tpot_s", "p99")
    iu, il = metric(res, "c_unloaded", "itl_s", "p99"), metric(res, "c_loaded", "itl_s", "p99")
    bg = res["scenarios"].get("c_loaded", {}).get("background", {}).get("summary", {})
    rows += [("c", "chats alone: TPOT p99", un, "ms"),
             ("c", "chats + long prompts: TPOT p99", lo, "ms"),
             ("c", "loaded / alone TPOT p99 (target <= 2x)", lo / un if lo and un else None, "x"),
             ("c", "chats alone / loaded: ITL p99", None if iu is None or il is None else (iu, il), "ms pair"),
             ("c", "chats alone / loaded: TTFT p50", None if metric(res, "c_unloaded", "ttft_s", "p50") is None
              or metric(res, "c_loaded", "ttft_s", "p50") is None
              else (metric(res, "c_unloaded", "ttft_s", "p50"), metric(res, "c_loaded", "ttft_s", "p50")), "ms pair"),
             ("c", "long prompts prefilled during the chats", bg.get("completed"), "count")]
    return rows


def fmt(v, unit: str) -> str:
    if v is None:
        return "-"
    if unit == "ms":
        return f"{v * 1000:.1f} ms"
    if unit == "ms pair":
        return f"{v[0] * 1000:.1f} / {v[1] * 1000:.1f} ms"
    if unit == "%":
        return f"{v * 100:.1f}%"
    if unit == "x":
        return f"{v:.2f}x"
    if unit in ("count", "text"):
        return str(v)
    return f"{v:.1f} {unit}"


def markdown(report: dict) -> str:
    sides = report["sides"]
    names = {"tandem": "Tandem", "llama": "llama.cpp (llama-cpp-python server)",
             "llama-server": "llama.cpp (llama-server)"}
    head = "| model | | " + " | ".join(names[s] for s in sides) + " |"
    lines = [head, "|---|---|" + "---|" * len(sides)]
    for m in report["results"]:
        per = {s: scenario_rows(m[s], report["settings"]["concurrency"]) for s in sides if s in m}
        if not per:
            continue
        first = next(iter(per.values()))
        for i, (sc, what, _, unit) in enumerate(first):
            if not any(sc in g for g in report["scenarios"]):
                continue
            cells = [fmt(per[s][i][2], unit) if s in per else "-" for s in sides]
            lines.append(f"| {m['model_name']} | ({sc}) {what} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="gemma,tinyllama",
                    help="comma-separated: gemma, tinyllama (the synthetic 1.1B Q8_0, written if missing) or paths")
    ap.add_argument("--sides", default="tandem,llama",
                    help="any of tandem, llama (llama-cpp-python's server), llama-server (llama.cpp's own, built "
                         "from the sdist's sources into bench/.llama-server)")
    ap.add_argument("--scenarios", default="a,b,c", help="any of a, b, c")
    ap.add_argument("--tandem", default=str(REPO / "build/tandem"), help="the tandem binary")
    ap.add_argument("--venv", help="venv with llama-cpp-python (default bench/.venv; set up if needed)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ctx", type=int, default=4096, help="context per sequence (both servers)")
    ap.add_argument("--max-seqs", type=int, default=32, help="tandem serve --max-seqs")
    ap.add_argument("--concurrency", type=int, default=16, help="(a): concurrent clients")
    ap.add_argument("--batch-requests", type=int, default=32, help="(a): requests of the concurrent run")
    ap.add_argument("--output-len", type=int, default=64, help="(a): tokens per request")
    ap.add_argument("--chats", type=int, default=4, help="(c): concurrent chat clients")
    ap.add_argument("--chat-requests", type=int, default=8, help="(c): chat requests")
    ap.add_argument("--chat-output-len", type=int, default=64, help="(c): tokens per chat reply")
    ap.add_argument("--nice", type=int, default=0,
                    help="run both servers under nice -n N (negative needs root: less noise on a shared machine)")
    ap.add_argument("--tandem-arg", action="append", default=[], help="extra argument for tandem serve (repeatable)")
    ap.add_argument("--llama-arg", action="append", default=[], help="extra argument for llama_cpp.server")
    ap.add_argument("--llama-server-arg", action="append", default=[], help="extra argument for llama-server")
    ap.add_argument("--ready-timeout", type=float, default=300)
    ap.add_argument("--scenario-timeout", type=float, default=1800)
    ap.add_argument("--out-dir", help="per-scenario JSON and server logs (default: a new folder under /tmp)")
    ap.add_argument("--json", help="write the combined report here")
    args = ap.parse_args()
    # A SIGTERM (a timeout) still stops the server that is running.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    args.scenarios = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    sides = [s.strip() for s in args.sides.split(",") if s.strip()]
    if any(s not in GROUPS for s in args.scenarios) or any(s not in ("tandem", "llama", "llama-server") for s in sides):
        ap.error("--scenarios takes a, b, c; --sides takes tandem, llama, llama-server")
    if "llama-server" in sides:
        args.llama_server = str(ensure_llama_server(HERE / ".llama-server"))
    args.tandem = Path(args.tandem).resolve()
    if "tandem" in sides and not args.tandem.exists():
        raise SystemExit(f"{args.tandem} does not exist: build Tandem first")
    # serve_bench needs the openai client; the venv has it (and llama.cpp's server).
    py = ensure_venv(Path(args.venv) if args.venv else HERE / ".venv")
    out_dir = Path(args.out_dir or f"/tmp/tandem-serve-compare-{time.strftime('%Y%m%d-%H%M%S')}")
    out_dir.mkdir(parents=True, exist_ok=True)
    log(f"results in {out_dir}")

    report = {"machine": machine_info(args), "sides": sides, "scenarios": args.scenarios,
              "threads": args.threads, "settings": {k: v for k, v in vars(args).items() if k != "tandem"},
              "results": []}
    report["settings"]["tandem"] = str(args.tandem)
    for name in [m.strip() for m in args.models.split(",") if m.strip()]:
        model = ensure_model(name, args.tandem)
        entry = {"model": str(model), "model_name": model.name}
        for side in sides:
            entry[side] = run_side(side, model, args, py, out_dir)
        report["results"].append(entry)
        if args.json:
            Path(args.json).write_text(json.dumps(report, indent=1))
    table = markdown(report)
    (out_dir / "table.md").write_text(table + "\n")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())

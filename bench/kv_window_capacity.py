#!/usr/bin/env python3
"""How many long sequences a fixed KV memory holds, with Gemma 3's
sliding-window layers keeping every block (--swa-full) or giving back the ones
their window has passed (the default), and what llama.cpp allocates for the
same.

Tandem: `tandem serve --kv-memory M --ctx-size C` first gets one prompt of
about --prompt-chars characters of real prose (the license texts Debian ships)
and /metrics is read every 0.1 s for the most KV blocks it holds (its prompt's
chunks included): the pool holds pool // that many such sequences whole. Then
--requests prompts (each from another offset, so no prefix is shared) arrive
at once: the most running and blocks held, preemptions, wall time, and
whether the greedy texts are the same both ways. llama.cpp
(llama-cpp-python, in the venv bench/kv_quality.py uses): the KV buffers it
allocates for --requests sequences of C tokens, swa_full on and off, from its
load log.

  bench/kv_window_capacity.py                       # 300 MiB, 8192 context, 6 prompts of ~7.8k tokens
  bench/kv_window_capacity.py --no-llama --requests 4
"""

from __future__ import annotations

import argparse
import json
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))
from kv_quality import GEMMA, LICENSES, log  # noqa: E402


def corpus() -> str:
    return "\n\n".join(Path("/usr/share/common-licenses", n).read_text(errors="replace") for n in LICENSES)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def metrics(port: int) -> dict[str, float]:
    out = {}
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        for line in r.read().decode().splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                out[name] = float(value)
    return out


def run_tandem(args: argparse.Namespace, swa_full: bool, prompts: list[str]) -> dict:
    port = free_port()
    cmd = [str(args.tandem), "serve", "-m", str(args.model), "--port", str(port), "--threads", str(args.threads),
           "--ctx-size", str(args.ctx), "--kv-memory", args.kv_memory, "--max-seqs", str(len(prompts)),
           "--no-prefix-cache"] + (["--swa-full"] if swa_full else [])
    srv = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    try:
        for line in srv.stderr:
            if "KV cache" in line:
                log(line.strip())
                break
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=5) as r:
            model_id = json.loads(r.read())["data"][0]["id"]

        def ask(prompt: str, out: dict) -> None:
            body = json.dumps({"model": model_id, "prompt": prompt, "max_tokens": args.max_tokens,
                               "temperature": 0}).encode()
            req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=body,
                                         headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(req, timeout=3600) as r:
                    out.update(json.loads(r.read()))
            except OSError as e:
                out["error"] = str(e)

        def watched(batch: list[str]) -> tuple[list[dict], dict, float]:
            """Runs the prompts at once; the most requests running and blocks held meanwhile."""
            peak = {"running": 0.0, "blocks": 0.0, "total": 0.0}
            done = threading.Event()

            def watch() -> None:
                while not done.is_set():
                    try:
                        m = metrics(port)
                    except OSError:
                        break
                    peak["running"] = max(peak["running"], m.get("tandem_requests_running", 0.0))
                    peak["blocks"] = max(peak["blocks"], m.get("tandem_kv_blocks_used", 0.0))
                    peak["total"] = m.get("tandem_kv_blocks_total", 0.0)
                    time.sleep(0.1)

            results: list[dict] = [{} for _ in batch]
            watcher = threading.Thread(target=watch)
            watcher.start()
            t0 = time.time()
            threads = [threading.Thread(target=ask, args=(p, results[i])) for i, p in enumerate(batch)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            wall = time.time() - t0
            done.set()
            watcher.join()
            failed = [r["error"] for r in results if "error" in r]
            if failed:
                raise SystemExit(f"{len(failed)} requests failed: {failed[0]}")
            return results, peak, wall

        # One sequence alone: the most blocks it holds (its prompt's chunks
        # included), and so how many such sequences the pool holds whole.
        _, alone, _ = watched(prompts[:1])
        results, peak, wall = watched(prompts)
        m = metrics(port)
    finally:
        srv.terminate()
        srv.wait(timeout=60)
    tokens = [r["usage"]["prompt_tokens"] for r in results]
    per_seq = int(alone["blocks"])
    return {"engine": "tandem", "swa_full": swa_full, "blocks_per_sequence": per_seq,
            "blocks_total": int(peak["total"]), "sequences_held": int(peak["total"]) // max(1, per_seq),
            "peak_running": int(peak["running"]), "peak_blocks": int(peak["blocks"]),
            "preemptions": int(m.get("tandem_preemptions_total", 0)), "wall_s": round(wall, 1),
            "prompt_tokens": [min(tokens), max(tokens)], "texts": [r["choices"][0]["text"] for r in results]}


LLAMA_WORKER = r"""
import sys, llama_cpp as L
model_path, ctx, seqs, swa_full = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "1"
L.llama_backend_init()
model = L.llama_model_load_from_file(model_path.encode(), L.llama_model_default_params())
cp = L.llama_context_default_params()
cp.n_ctx = ctx * seqs
cp.n_seq_max = seqs
cp.n_batch = 512
cp.n_ubatch = 512
cp.swa_full = swa_full
cp.kv_unified = False
c = L.llama_init_from_model(model, cp)
print("context created" if c else "no context", file=sys.stderr, flush=True)
"""


def run_llama(args: argparse.Namespace, swa_full: bool) -> dict:
    from quantize_compare import ensure_venv

    py = ensure_venv(args.venv)
    p = subprocess.run([str(py), "-c", LLAMA_WORKER, str(args.model), str(args.ctx), str(args.requests),
                        "1" if swa_full else "0"], capture_output=True, text=True, timeout=600)
    mib = [float(x) for x in re.findall(r"KV buffer size =\s*([\d.]+) MiB", p.stderr)]
    cells = re.findall(r"\(\s*(\d+) cells,\s+(\d+) layers", p.stderr)
    return {"engine": "llama.cpp", "swa_full": swa_full, "kv_mib": round(sum(mib), 1),
            "caches": [f"{c} cells x {n} layers" for c, n in cells], "ok": "context created" in p.stderr}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=GEMMA)
    ap.add_argument("--tandem", type=Path, default=REPO / "build/tandem")
    ap.add_argument("--ctx", type=int, default=8192)
    ap.add_argument("--kv-memory", default="300M")
    ap.add_argument("--requests", type=int, default=6)
    ap.add_argument("--prompt-chars", type=int, default=36000)
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-llama", action="store_true")
    ap.add_argument("--llama-only", action="store_true")
    ap.add_argument("--venv", type=Path, default=Path("/tmp/llamacpp-venv"))
    ap.add_argument("--json-out", type=Path)
    args = ap.parse_args()

    text = corpus()
    step = (len(text) - args.prompt_chars) // max(1, args.requests - 1)
    prompts = [text[i * step:i * step + args.prompt_chars] for i in range(args.requests)]
    rows = []
    if args.llama_only:
        for swa_full in (True, False):
            r = run_llama(args, swa_full)
            print(f"llama.cpp swa_full={swa_full}: {r['kv_mib']} MiB ({'; '.join(r['caches'])})")
        return 0
    for swa_full in (True, False):
        log(f"tandem, swa_full={swa_full}")
        rows.append(run_tandem(args, swa_full, prompts))
    if rows[0]["texts"] != rows[1]["texts"]:
        log("greedy texts differ between --swa-full and the windowed pool")
    if not args.no_llama:
        for swa_full in (True, False):
            log(f"llama.cpp, swa_full={swa_full}")
            rows.append(run_llama(args, swa_full))

    print(f"\n{args.requests} prompts of {rows[0]['prompt_tokens'][0]}-{rows[0]['prompt_tokens'][1]} tokens, "
          f"context {args.ctx}, --kv-memory {args.kv_memory}, {args.model.name}\n")
    print("| sliding-window layers | blocks (pages) in the pool | most blocks one sequence holds | sequences the "
          "pool holds whole | all at once: most running, blocks held | preemptions | wall s |")
    print("|---|---:|---:|---:|---|---:|---:|")
    for r in rows:
        if r["engine"] != "tandem":
            continue
        print(f"| {'every block (--swa-full)' if r['swa_full'] else 'last 512 positions'} | {r['blocks_total']} | "
              f"{r['blocks_per_sequence']} | {r['sequences_held']} | {r['peak_running']}, {r['peak_blocks']} | "
              f"{r['preemptions']} | {r['wall_s']} |")
    full, win = rows[0], rows[1]
    share = lambda r: r["blocks_per_sequence"] / max(1, r["blocks_total"])  # noqa: E731  (of the pool's bytes)
    print(f"\none sequence takes {100 * share(full):.1f}% of the pool with every block, {100 * share(win):.1f}% "
          f"without: {share(full) / max(1e-9, share(win)):.2f}x the sequences in the same memory")
    same = rows[0]["texts"] == rows[1]["texts"]
    print(f"\ngreedy outputs identical with and without --swa-full: {same}")
    llama = [r for r in rows if r["engine"] == "llama.cpp"]
    if llama:
        print(f"\nllama.cpp, {args.requests} sequences of {args.ctx} tokens (the KV buffers it allocates):\n")
        print("| swa_full | KV MiB | caches |")
        print("|---|---:|---|")
        for r in llama:
            print(f"| {r['swa_full']} | {r['kv_mib']} | {'; '.join(r['caches'])} |")
    if args.json_out:
        args.json_out.write_text(json.dumps(rows, indent=1))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""What sparse attention (--sparse-attention BUDGET, Quest) gains in decode speed: a table.

Runs `kernels_bench --benchmark_filter=AttentionDecodeSparse` (decode attention of the 1.1B
synthetic's shape: 22 layers, 32 query and 4 KV heads of 64, random keys, the cache evicted
before each step as the weights' stream would) in R rounds. Each round runs every shape's dense,
sparse and selection-alone rows one after another, seconds apart, so the ratio of one round is
measured on one state of the machine; the table gives medians over the rounds and their range.
Shapes: one sequence of 8k, 16k and 32k at budget 4,096, and 16 sequences of 4k at budget 1,024,
f16 and q8_0 caches.

With --model (the 1.1B synthetic: `tandem synth --preset tinyllama-1.1b --type q8_0`) it also
measures a decode step at a short context (`tandem bench -p 16 -n 32`: the weights' share of a
step, attention nearly free) and prints the whole step it implies at each context: weights +
attention, dense against sparse. That column is arithmetic on two measurements, not a decode
at 32k (whose prefill alone takes this machine most of an hour).

  bench/sparse_speed.py --rounds 3
  bench/sparse_speed.py --rounds 5 --model synth-q8_0.gguf --json-out /tmp/sparse_speed.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TYPES = {0: "f16", 2: "q8_0"}


def run_round(args) -> dict:
    cmd = [str(args.kernels_bench), f"--benchmark_filter=AttentionDecodeSparse/{args.shapes}", "--benchmark_format=json",
           f"--benchmark_min_time={args.min_time}"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(r.stderr[-800:])
    out = {}
    for b in json.loads(r.stdout)["benchmarks"]:
        # BM_AttentionDecodeSparse/N/B/threads/type/budget/select_only/min_time:.../real_time
        parts = b["name"].split("/")
        n, seqs, _, typ, budget, sel = (int(x) for x in parts[1:7])
        out[(n, seqs, typ, budget, sel)] = {"ms": b["real_time"], "cpu_ms": b["cpu_time"],
                                            "bounds": b.get("bounds B/block", 0.0),
                                            "kv": b.get("K/V B/block", 0.0)}
    return out


def whole_step_ms(args) -> float:
    cmd = [str(args.tandem), "bench", "-m", str(args.model), "-p", "16", "-n", "32", "--reps", "3", "-t", "2",
           "--json"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(r.stderr[-800:])
    j = json.loads(r.stdout.strip().splitlines()[-1])
    return 1000.0 / j["decode_tok_s"]


def spread(xs: list[float], fmt: str = "{:.1f}") -> str:
    return f"{fmt.format(statistics.median(xs))} ({fmt.format(min(xs))}-{fmt.format(max(xs))})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kernels-bench", type=Path, default=REPO / "build" / "kernels_bench")
    ap.add_argument("--tandem", type=Path, default=REPO / "build" / "tandem")
    ap.add_argument("--model", type=Path, help="the 1.1B synthetic, for the whole-step column")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--min-time", type=float, default=0.5, help="seconds per row per round")
    ap.add_argument("--shapes", default="", help="a regex on N/B/threads/type, e.g. '32768/1/2/' (default: all)")
    ap.add_argument("--json-out", type=Path)
    args = ap.parse_args()

    load = os.getloadavg()
    print(f"load before: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}", file=sys.stderr)
    rounds, steps = [], []
    for r in range(args.rounds):
        rounds.append(run_round(args))
        if args.model:
            steps.append(whole_step_ms(args))
        print(f"round {r + 1}/{args.rounds} done, load {os.getloadavg()[0]:.2f}", file=sys.stderr)

    shapes = sorted({(k[0], k[1], k[2], k[3]) for k in rounds[0] if k[3] > 0}, key=lambda s: (s[2], s[1], s[0]))
    rows = []
    head = ("| cache | seqs x context | budget | dense ms | sparse ms | selection ms | speed-up | speed-up, main thread's"
            " CPU time | bounds B/block (of K/V)")
    head += " | whole step, dense / sparse ms: speed-up |" if steps else " |"
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    for n, seqs, typ, budget in shapes:
        dense = [rd[(n, seqs, typ, 0, 0)]["ms"] for rd in rounds]
        sparse = [rd[(n, seqs, typ, budget, 0)]["ms"] for rd in rounds]
        sel = [rd[(n, seqs, typ, budget, 1)]["ms"] for rd in rounds]
        ratio = [d / s for d, s in zip(dense, sparse)]
        # The main thread's CPU time: what a loaded machine's waits for a core leave out.
        cpu = [rd[(n, seqs, typ, 0, 0)]["cpu_ms"] / rd[(n, seqs, typ, budget, 0)]["cpu_ms"] for rd in rounds]
        b = rounds[0][(n, seqs, typ, budget, 0)]
        row = {"type": TYPES[typ], "seqs": seqs, "context": n, "budget": budget, "dense_ms": dense,
               "sparse_ms": sparse, "select_ms": sel, "speedup": ratio, "speedup_cpu": cpu, "bounds_bytes_per_block": b["bounds"],
               "kv_bytes_per_block": b["kv"]}
        line = (f"| {TYPES[typ]} | {seqs} x {n:,} | {budget:,} | {spread(dense)} | {spread(sparse)} | {spread(sel)} | "
                f"{spread(ratio, '{:.2f}')}x | {spread(cpu, '{:.2f}')}x | {b['bounds']:,.0f} ({100 * b['bounds'] / b['kv']:.1f}%)")
        if steps:
            # One step of weights at a short context per round, beside that round's attention.
            w = statistics.median(steps)
            whole = [(w + d) / (w + s) for d, s in zip(dense, sparse)]
            row["weights_ms"] = steps
            row["whole_speedup"] = whole
            line += (f" | {w + statistics.median(dense):.0f} / {w + statistics.median(sparse):.0f}: "
                     f"{spread(whole, '{:.2f}')}x")
        print(line + " |")
        rows.append(row)
    if steps:
        print(f"\nweights' share of a step (short-context decode of {args.model.name}): {spread(steps)} ms")
    load = os.getloadavg()
    print(f"load after: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}", file=sys.stderr)
    if args.json_out:
        args.json_out.write_text(json.dumps({"rows": rows, "rounds": args.rounds}, indent=1))


if __name__ == "__main__":
    main()

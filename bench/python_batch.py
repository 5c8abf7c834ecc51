#!/usr/bin/env python3
"""tandem.LLM.generate over a batch of prompts, beside `tandem bench --batch`
(the same work on the same engine from the CLI) and llama-cpp-python's
`Llama` (its only way: one prompt after another), on the same GGUF file.

The work, for all three: B prompts of the same P token ids (the ones
`tandem bench` picks; prefix caching off, so every prompt is computed), each
continued greedily by N + 1 tokens with end-of-generation ignored. Each round
runs the three in turn, each in a fresh process with one untimed warm-up
repetition; the table gives the median tok/s (B x (N + 1) tokens over the
wall time of the repetition) with the min-max spread, and the ratios.

  bench/python_batch.py                                   # Gemma 3 270M, B 64, P 32, N 32, 3 rounds
  bench/python_batch.py -r 5 --ref-python /tmp/ref/bin/python
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_MODEL = Path.home() / ".cache/tandem/models/gemma-3-270m-q4_k_m.gguf"

GENERATE_CHILD = r"""
import json, sys, time
from tandem import LLM, SamplingParams
model, ids, B, P, N, T = sys.argv[1], json.loads(sys.argv[2]), *map(int, sys.argv[3:7])
# The engine as tandem bench sizes it: every prompt in one step, no prefix sharing.
llm = LLM(model=model, threads=T, max_model_len=P + N + 1, max_num_seqs=B, max_num_batched_tokens=B * P,
          enable_prefix_caching=False)
sp = SamplingParams(temperature=0, max_tokens=N + 1, ignore_eos=True)
llm.generate(prompt_token_ids=[ids] * B, sampling_params=sp)  # warm-up
t0 = time.perf_counter()
outs = llm.generate(prompt_token_ids=[ids] * B, sampling_params=sp)
wall = time.perf_counter() - t0
assert all(len(o.outputs[0].token_ids) == N + 1 for o in outs)
print(json.dumps({"wall_s": wall, "tokens": sum(len(o.outputs[0].token_ids) for o in outs)}))
"""

LLAMA_CHILD = r"""
import json, sys, time
import llama_cpp
model, ids, B, P, N, T = sys.argv[1], json.loads(sys.argv[2]), *map(int, sys.argv[3:7])
llm = llama_cpp.Llama(model_path=model, n_ctx=P + N + 8, n_batch=P, n_threads=T, n_threads_batch=T, verbose=False)
def one():
    llm.reset()  # no prefix reuse: every prompt computed, as on the other side
    got = 0
    for _ in llm.generate(ids, top_k=1, temp=0.0, reset=True):
        got += 1
        if got == N + 1:
            break
    return got
one()  # warm-up
t0 = time.perf_counter()
tokens = sum(one() for _ in range(B))
wall = time.perf_counter() - t0
print(json.dumps({"wall_s": wall, "tokens": tokens}))
"""


def run_json(cmd, env=None):
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=3600)
    if out.returncode != 0:
        sys.exit(f"failed: {' '.join(map(str, cmd[:3]))} ...\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def stats(v):
    return statistics.median(v), min(v), max(v)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", nargs="?", default=str(DEFAULT_MODEL))
    ap.add_argument("-b", "--batch", type=int, default=64)
    ap.add_argument("-p", "--prompt", type=int, default=32)
    ap.add_argument("-n", "--gen", type=int, default=32)
    ap.add_argument("-r", "--rounds", type=int, default=3)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--tandem", default=str(REPO / "build/tandem"), help="the CLI")
    ap.add_argument("--ref-python", default="/tmp/ref/bin/python",
                    help="a Python with llama-cpp-python; '' leaves llama.cpp out")
    a = ap.parse_args()
    B, P, N, T = a.batch, a.prompt, a.gen, a.threads
    env = dict(os.environ)
    built = REPO / "build/python"
    if built.is_dir():  # the package as built beside the CLI, unless installed
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(built), env.get("PYTHONPATH", "")]))
    bench_cmd = [a.tandem, "bench", "-m", a.model, "--batch", str(B), "-p", str(P), "-n", str(N), "-t", str(T),
                 "--reps", "1", "--warmup", "1", "--json"]
    ids = run_json(bench_cmd)["token_ids"][:P]
    args = [a.model, json.dumps(ids), str(B), str(P), str(N), str(T)]
    rows = {"tandem bench --batch": [], "tandem.LLM.generate": [], "llama-cpp-python Llama (loop)": []}
    for r in range(a.rounds):
        j = run_json(bench_cmd)
        rows["tandem bench --batch"].append(B * (N + 1) / (j["prefill_s"][0] + j["decode_s"][0]))
        g = run_json([sys.executable, "-c", GENERATE_CHILD, *args], env)
        rows["tandem.LLM.generate"].append(g["tokens"] / g["wall_s"])
        if a.ref_python:
            lj = run_json([a.ref_python, "-c", LLAMA_CHILD, *args])
            rows["llama-cpp-python Llama (loop)"].append(lj["tokens"] / lj["wall_s"])
        print(f"round {r + 1}: " + ", ".join(f"{k} {v[-1]:.1f}" for k, v in rows.items() if v),
              file=sys.stderr, flush=True)
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")),
               platform.processor())
    print(f"\n{Path(a.model).name}: {B} prompts of {P} tokens, {N + 1} tokens each, {T} threads, "
          f"{a.rounds} rounds; {cpu}; load {os.getloadavg()[0]:.1f} at the end ({time.strftime('%Y-%m-%d')})\n")
    print("| | total tok/s (median) | min - max | vs bench --batch (median of rounds) |")
    print("|---|---|---|---|")
    base = rows["tandem bench --batch"]
    for name, v in rows.items():
        if not v:
            continue
        med, lo, hi = stats(v)
        ratio = statistics.median(x / b for x, b in zip(v, base))
        print(f"| {name} | {med:.1f} | {lo:.1f} - {hi:.1f} | {ratio:.3f} |")


if __name__ == "__main__":
    main()

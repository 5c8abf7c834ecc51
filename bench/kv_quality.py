#!/usr/bin/env python3
"""What a compressed KV cache costs in quality: `tandem perplexity` and llama.cpp
(llama-cpp-python's type_k/type_v) on the same model, text and contexts.

For each context and cache type: perplexity (chunks of n_ctx, the second half
of each scored, as llama-perplexity does), its ratio to the same engine's f16
cache, the mean KL divergence KL(f16 || type) per scored token and the share
of tokens whose most likely next token is unchanged. Each engine is compared
with its own f16 run, chunk by chunk, in one process (Tandem: --kl-reference
f16; llama.cpp: one model, a context per chunk and type in turn, flash
attention on, as llama.cpp requires for a quantized V cache).

The text is real prose: the license texts Debian ships in
/usr/share/common-licenses (GPL, LGPL, GFDL, Apache, Artistic, MPL),
concatenated (~229 kB, ~55k Gemma 3 tokens), unless --text is given.

  bench/kv_quality.py                                   # Gemma 3 270M, 512 2048 8192
  bench/kv_quality.py --contexts 512 --types q8_0,q4_0 --json-out /tmp/kvq.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))
HOME = Path(os.environ.get("HOME", "/root"))
GEMMA = HOME / ".cache/tandem/models/gemma-3-270m-q4_k_m.gguf"
LICENSES = ["GPL-1", "GPL-2", "GPL-3", "LGPL-2", "LGPL-2.1", "LGPL-3", "GFDL-1.2", "GFDL-1.3", "Apache-2.0",
            "Artistic", "MPL-1.1", "MPL-2.0"]
GGML = {"f16": 1, "f32": 0, "q8_0": 8, "q4_0": 2}
# chunks per context: about 16k scored tokens at the longest, more at the shortest
CHUNKS = {512: 48, 1024: 24, 2048: 12, 4096: 4, 8192: 2}


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- llama.cpp side (inside its venv)


def worker(args: argparse.Namespace) -> int:
    import ctypes

    import llama_cpp as L
    import numpy as np

    L.llama_backend_init()
    mp = L.llama_model_default_params()
    model = L.llama_model_load_from_file(args.model.encode(), mp)
    if not model:
        raise SystemExit(f"llama.cpp could not load {args.model}")
    vocab = L.llama_model_get_vocab(model)
    nv = L.llama_vocab_n_tokens(vocab)
    text = Path(args.text).read_bytes()
    buf = (L.llama_token * (len(text) + 16))()
    n = L.llama_tokenize(vocab, text, len(text), buf, len(buf), True, False)
    if n < 0:
        raise SystemExit("tokenizing failed")
    tokens = list(buf[:n])
    n_ctx = args.ctx
    chunks = min(args.chunks, n // n_ctx)
    first = n_ctx // 2
    bos = L.llama_vocab_bos(vocab)

    def context(type_name: str):
        cp = L.llama_context_default_params()
        cp.n_ctx, cp.n_batch, cp.n_ubatch = n_ctx, n_ctx, min(n_ctx, 512)
        cp.n_threads = cp.n_threads_batch = args.threads
        cp.type_k = cp.type_v = GGML[type_name]
        cp.flash_attn_type = 1  # enabled: llama.cpp needs it for a quantized V cache
        ctx = L.llama_init_from_model(model, cp)
        if not ctx:
            raise SystemExit(f"llama.cpp could not create a {type_name} context")
        return ctx

    batch = L.llama_batch_init(n_ctx, 0, 1)
    scored = n_ctx - 1 - first
    slice_rows = 128  # rows of vocabulary-wide float64 at a time (~270 MB for Gemma 3's 262k tokens)

    def decode(type_name: str, chunk: list[int]):
        ctx = context(type_name)
        batch.n_tokens = n_ctx
        for i, t in enumerate(chunk):
            batch.token[i] = t
            batch.pos[i] = i
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = 0
            batch.logits[i] = 1 if first <= i < n_ctx - 1 else 0
        if L.llama_decode(ctx, batch) != 0:
            raise SystemExit("llama_decode failed")
        return ctx

    def log_probs(ctx, r0: int, r1: int) -> np.ndarray:
        x = np.empty((r1 - r0, nv), dtype=np.float64)
        for r in range(r0, r1):
            p = L.llama_get_logits_ith(ctx, first + r)
            x[r - r0] = np.ctypeslib.as_array(ctypes.cast(p, ctypes.POINTER(ctypes.c_float)), shape=(nv,))
        m = x.max(axis=1, keepdims=True)
        return x - (m + np.log(np.exp(x - m).sum(axis=1, keepdims=True)))

    def slices():
        for r0 in range(0, scored, slice_rows):
            yield r0, min(scored, r0 + slice_rows)

    # One context at a time, freed after its chunk: at 8k tokens each holds
    # 4 GB of logits. The f16 reference's log-probabilities are kept as
    # float32 (an error of ~1e-6 in a KL divergence of ~1e-2).
    acc = {t: {"nll": [], "kl": [], "same": []} for t in args.types}
    ref_nll: list[float] = []
    t0 = time.perf_counter()
    for k in range(chunks):
        chunk = tokens[k * n_ctx:(k + 1) * n_ctx]
        chunk[0] = bos
        target = np.array(chunk[first + 1:n_ctx])
        ctx = decode("f16", chunk)
        ref = np.empty((scored, nv), dtype=np.float32)
        for r0, r1 in slices():
            ref[r0:r1] = log_probs(ctx, r0, r1)
        L.llama_free(ctx)
        ref_nll += list(-ref[np.arange(scored), target].astype(np.float64))
        ref_top = ref.argmax(axis=1)
        for t in args.types:
            ctx = decode(t, chunk)
            for r0, r1 in slices():
                lp = log_probs(ctx, r0, r1)
                rf = ref[r0:r1].astype(np.float64)
                acc[t]["nll"] += list(-lp[np.arange(r1 - r0), target[r0:r1]])
                acc[t]["kl"] += list((np.exp(rf) * (rf - lp)).sum(axis=1))
                acc[t]["same"] += list(lp.argmax(axis=1) == ref_top[r0:r1])
            L.llama_free(ctx)
    out = {"tokens": n, "chunks": chunks, "seconds": time.perf_counter() - t0,
           "f16_ppl": float(np.exp(np.mean(ref_nll))), "types": {}}
    for t, a in acc.items():
        kl = np.array(a["kl"])
        ppl = float(np.exp(np.mean(a["nll"])))
        out["types"][t] = {"ppl": ppl, "ppl_ratio": ppl / out["f16_ppl"], "kl_mean": float(kl.mean()),
                           "kl_error": float(kl.std() / np.sqrt(max(len(kl) - 1, 1))),
                           "same_top": float(np.mean(a["same"]))}
    print(json.dumps(out))
    return 0


# ---------------------------------------------------------------- driver


def tandem_row(tandem: Path, model: Path, text: Path, ctx: int, chunks: int, threads: int, kv_args: list[str]) -> dict:
    cmd = [str(tandem), "perplexity", "-m", str(model), "-f", str(text), "-c", str(ctx), "--chunks", str(chunks),
           "-t", str(threads), "--kl-reference", "f16", "--json", *kv_args]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        return {"error": r.stderr.strip()[-500:]}
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--model", type=Path, default=GEMMA)
    ap.add_argument("--text", type=Path, help="default: the license texts, concatenated into --work")
    ap.add_argument("--ctx", type=int, default=512, help=argparse.SUPPRESS)
    ap.add_argument("--chunks", type=int, default=8, help=argparse.SUPPRESS)
    ap.add_argument("--contexts", default="512,2048,8192")
    ap.add_argument("--types", default="q8_0,q4_0")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--tandem", type=Path, default=REPO / "build/tandem")
    ap.add_argument("--venv", type=Path, default=Path("/tmp/llamacpp-venv"))
    ap.add_argument("--work", type=Path, default=Path("/tmp/kv_quality"))
    ap.add_argument("--no-llamacpp", action="store_true")
    ap.add_argument("--json-out", type=Path)
    args = ap.parse_args()
    args.types = args.types.split(",")
    if args.worker:
        args.model, args.text = str(args.model), str(args.text)
        return worker(args)

    args.work.mkdir(parents=True, exist_ok=True)
    text = args.text
    if text is None:
        text = args.work / "licenses.txt"
        text.write_bytes(b"".join((Path("/usr/share/common-licenses") / n).read_bytes() for n in LICENSES))
    py = None
    if not args.no_llamacpp:
        from quantize_compare import ensure_venv
        py = ensure_venv(args.venv)
    rows = []
    for ctx in [int(c) for c in args.contexts.split(",")]:
        chunks = CHUNKS.get(ctx, max(2, 16384 // ctx))
        for t in args.types:
            variants = [("", ["--kv-type", t])]
            if t == "q4_0":
                variants += [(" not smoothed", ["--kv-type", t, "--kv-smoothing", "off"]),
                             (" not rotated", ["--kv-type", t, "--kv-rotation", "off"])]
            else:
                variants += [(" rotated", ["--kv-type", t, "--kv-rotation", "all"]),
                             (" not smoothed", ["--kv-type", t, "--kv-smoothing", "off"])]
            for suffix, kv_args in variants:
                log(f"tandem {t}{suffix} at {ctx}")
                r = tandem_row(args.tandem, args.model, text, ctx, chunks, args.threads, kv_args)
                rows.append({"engine": "tandem", "ctx": ctx, "type": t + suffix, **r})
        if py:
            log(f"llama.cpp {','.join(args.types)} at {ctx}")
            p = subprocess.run([str(py), __file__, "--worker", "--model", str(args.model), "--text", str(text),
                                "--ctx", str(ctx), "--chunks", str(chunks), "--types", ",".join(args.types),
                                "--threads", str(args.threads)], capture_output=True, text=True)
            if p.returncode != 0:
                rows.append({"engine": "llama.cpp", "ctx": ctx, "error": p.stderr.strip()[-800:]})
            else:
                r = json.loads(p.stdout.strip().splitlines()[-1])
                for t, v in r["types"].items():
                    rows.append({"engine": "llama.cpp", "ctx": ctx, "type": t, "ref_ppl": r["f16_ppl"],
                                 "chunks": r["chunks"], **v})

    print(f"\n{args.model.name}, {text.name}; {datetime.date.today()}; KL(f16 || type) per scored token\n")
    print("| context | engine | KV cache | f16 PPL | PPL | vs f16 | mean KLD | same top |")
    print("|---:|---|---|---:|---:|---:|---:|---:|")
    for r in rows:
        if "error" in r:
            print(f"| {r['ctx']} | {r['engine']} | {r.get('type', '')} | error: {r['error'][:200]} |")
            continue
        print(f"| {r['ctx']} | {r['engine']} | {r['type']} | {r['ref_ppl']:.4f} | {r['ppl']:.4f} | "
              f"{100 * (r['ppl_ratio'] - 1):+.2f}% | {r['kl_mean']:.5f} ± {r['kl_error']:.5f} | "
              f"{100 * r['same_top']:.1f}% |")
    if args.json_out:
        args.json_out.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

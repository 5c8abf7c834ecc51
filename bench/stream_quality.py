#!/usr/bin/env python3
"""What a streaming window (--kv-window N --kv-sinks S) costs in perplexity,
beside llama.cpp's context shift on the same model and text.

Perplexity as llama-perplexity computes it (chunks of C tokens, a BOS first,
the second half of each scored), the same chunks for every row:

- tandem at C = N (1x: the window is the whole context), at C = 4N
  with every position kept, and at C = 4N through the window with S sinks and
  with none;
- llama.cpp (llama-cpp-python, the venv bench/kv_quality.py uses) at C = 4N
  through a context of S + N + 16 cells that shifts as llama-server's context
  shift does: once full, the positions after the first S go, down to the last
  N, and the rest are shifted back (llama_memory_seq_rm, llama_memory_seq_add:
  the kept keys re-rotated to their new positions). Tokens are fed in batches
  that end where the cache fills, as tandem's prompt chunks do.

  bench/stream_quality.py                       # Gemma 3 270M, window 512, 12 chunks of 2048
  bench/stream_quality.py --window 128 --chunks 4 --no-llama
  bench/stream_quality.py --heavy 256 --no-llama   # heavy hitters (H2O) against the plain window
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))
from kv_quality import GEMMA, LICENSES, log  # noqa: E402

BLOCK = 16


def llama_worker(args: argparse.Namespace) -> int:
    """Inside the llama.cpp venv: perplexity through a shifting context."""
    import ctypes

    import llama_cpp as L
    import numpy as np

    L.llama_backend_init()
    model = L.llama_model_load_from_file(str(args.model).encode(), L.llama_model_default_params())
    vocab = L.llama_model_get_vocab(model)
    nv = L.llama_vocab_n_tokens(vocab)
    text = Path(args.text).read_bytes()
    buf = (L.llama_token * (len(text) + 16))()
    n = L.llama_tokenize(vocab, text, len(text), buf, len(buf), True, False)
    tokens = list(buf[:n])
    C, S, N = args.ctx, args.sinks, args.window
    cells = S + N + BLOCK
    cp = L.llama_context_default_params()
    cp.n_ctx, cp.n_batch, cp.n_ubatch = cells, cells, cells
    cp.n_threads = cp.n_threads_batch = args.threads
    cp.swa_full = True  # positions can be removed from every layer's cache
    ctx = L.llama_init_from_model(model, cp)
    if not ctx:
        raise SystemExit("llama.cpp could not create the context")
    mem = L.llama_get_memory(ctx)
    batch = L.llama_batch_init(cells, 0, 1)
    nll: list[float] = []
    shifts = 0
    t0 = time.perf_counter()
    chunks = min(args.chunks, n // C)
    for k in range(chunks):
        chunk = tokens[k * C:(k + 1) * C]
        chunk[0] = L.llama_vocab_bos(vocab)
        L.llama_memory_clear(mem, True)
        held, i = 0, 0
        while i < C - 1:
            if held >= cells:  # full: keep the sinks and the last N
                discard = (held - S - N) // BLOCK * BLOCK
                L.llama_memory_seq_rm(mem, 0, S, S + discard)
                L.llama_memory_seq_add(mem, 0, S + discard, -1, -discard)
                held -= discard
                shifts += 1
            m = min(cells - held, C - 1 - i)
            batch.n_tokens = m
            for j in range(m):
                batch.token[j] = chunk[i + j]
                batch.pos[j] = held + j
                batch.n_seq_id[j] = 1
                batch.seq_id[j][0] = 0
                batch.logits[j] = 1 if i + j >= C // 2 else 0
            if L.llama_decode(ctx, batch) != 0:
                raise SystemExit("llama_decode failed")
            for j in range(m):
                if i + j < C // 2:
                    continue
                p = L.llama_get_logits_ith(ctx, j)
                x = np.ctypeslib.as_array(ctypes.cast(p, ctypes.POINTER(ctypes.c_float)), shape=(nv,)).astype(np.float64)
                mx = x.max()
                nll.append(float(mx + np.log(np.exp(x - mx).sum()) - x[chunk[i + j + 1]]))
            held += m
            i += m
    print(json.dumps({"ppl": float(np.exp(np.mean(nll))), "scored": len(nll), "shifts": shifts,
                      "seconds": time.perf_counter() - t0}))
    return 0


def tandem_ppl(args: argparse.Namespace, ctx: int, extra: list[str]) -> dict:
    cmd = [str(args.tandem), "perplexity", "-m", str(args.model), "-f", str(args.text), "-c", str(ctx),
           "--chunks", str(args.chunks * (args.ratio * args.window) // ctx), "-t", str(args.threads), "--json", *extra]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(r.stderr[-800:])
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--ctx", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--model", type=Path, default=GEMMA)
    ap.add_argument("--tandem", type=Path, default=REPO / "build/tandem")
    ap.add_argument("--text", type=Path)
    ap.add_argument("--window", type=int, default=512)
    ap.add_argument("--sinks", type=int, default=4)
    ap.add_argument("--heavy", type=int, default=0,
                    help="also compare heavy hitters (--kv-heavy H): a window of N - H with H heavy (the same "
                         "memory), and N with H heavy against a window of N + H")
    ap.add_argument("--ratio", type=int, default=4, help="the long context as a multiple of the window")
    ap.add_argument("--chunks", type=int, default=12, help="chunks of the long context")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-llama", action="store_true")
    ap.add_argument("--venv", type=Path, default=Path("/tmp/llamacpp-venv"))
    args = ap.parse_args()
    if args.worker:
        return llama_worker(args)
    if args.text is None:
        args.text = Path("/tmp/tandem-licenses.txt")
        args.text.write_text("\n\n".join(Path("/usr/share/common-licenses", n).read_text(errors="replace")
                                         for n in LICENSES))
    long_ctx = args.ratio * args.window
    one = args.window  # chunk boundaries line up with the long context's
    rows = []
    log(f"tandem at {one}")
    rows.append(("tandem", f"{one} (1x)", "every position", tandem_ppl(args, one, [])))
    log(f"tandem at {long_ctx}")
    rows.append(("tandem", f"{long_ctx}", "every position", tandem_ppl(args, long_ctx, [])))
    for s in (args.sinks, 0):
        log(f"tandem at {long_ctx}, window {args.window}, {s} sinks")
        rows.append(("tandem", f"{long_ctx}", f"window {args.window}, {s} sinks",
                     tandem_ppl(args, long_ctx, ["--kv-window", str(args.window), "--kv-sinks", str(s)])))
    if args.heavy > 0:
        h, w, s = args.heavy, args.window, args.sinks
        for win, heavy in ((w - h, h), (w, h), (w + h, 0)):
            label = f"window {win}, {heavy} heavy, {s} sinks" if heavy else f"window {win}, {s} sinks"
            log(f"tandem at {long_ctx}, {label}")
            extra = ["--kv-window", str(win), "--kv-sinks", str(s)] + (["--kv-heavy", str(heavy)] if heavy else [])
            rows.append(("tandem", f"{long_ctx}", label, tandem_ppl(args, long_ctx, extra)))
    if not args.no_llama:
        from quantize_compare import ensure_venv

        py = ensure_venv(args.venv)
        for s in (args.sinks, 0):
            log(f"llama.cpp at {long_ctx}, context shift keeping {s} + {args.window}")
            r = subprocess.run([str(py), __file__, "--worker", "--model", str(args.model), "--text", str(args.text),
                                "--ctx", str(long_ctx), "--window", str(args.window), "--sinks", str(s),
                                "--chunks", str(args.chunks), "--threads", str(args.threads)],
                               capture_output=True, text=True)
            if r.returncode != 0:
                raise SystemExit(r.stderr[-800:])
            rows.append(("llama.cpp", f"{long_ctx}", f"context shift: {s} kept + last {args.window}",
                         json.loads(r.stdout.strip().splitlines()[-1])))
    base = rows[0][3]["ppl"]
    print(f"\n{args.model.name}, {args.text.name}, the same {args.chunks * long_ctx} tokens in every row\n")
    print("| engine | context | cache | perplexity | vs 1x |")
    print("|---|---|---|---:|---:|")
    for eng, ctx, cache, r in rows:
        print(f"| {eng} | {ctx} | {cache} | {r['ppl']:.3f} | {100 * (r['ppl'] / base - 1):+.1f}% |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

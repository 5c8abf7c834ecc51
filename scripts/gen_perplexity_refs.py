#!/usr/bin/env python3
"""Regenerates llama.cpp's perplexity of a text for tests/eval_perplexity_test.cpp.

llama-perplexity's procedure, on llama.cpp's own logits (llama-cpp-python):
the text tokenized with BOS (no special-token parsing), cut into chunks of
n_ctx tokens; each chunk evaluated alone with BOS in its first position and
logits for every row; the tokens of its second half scored by the row
before each (log-softmax). Writes the running perplexity after each chunk, the
final one and llama.cpp's error estimate.

  python3 -m venv /tmp/ref && CMAKE_ARGS="-DGGML_NATIVE=ON" /tmp/ref/bin/pip install llama-cpp-python numpy
  /tmp/ref/bin/python scripts/gen_perplexity_refs.py ../shared/models/gguf/stories260K.gguf \\
      tests/data/perplexity/stories.txt 128 tests/data/llamacpp/perplexity_stories260k.json --kv-f32
  /tmp/ref/bin/python scripts/gen_perplexity_refs.py ~/.cache/tandem/models/gemma-3-270m-q4_k_m.gguf \\
      tests/data/perplexity/stories.txt 256 tests/data/llamacpp/perplexity_gemma3_270m.json
"""
import argparse
import json
import math

import llama_cpp
import numpy as np


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("text")
    ap.add_argument("n_ctx", type=int)
    ap.add_argument("out")
    ap.add_argument("--kv-f32", action="store_true", help="KV cache in f32 instead of llama.cpp's f16")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()

    text = open(args.text, encoding="utf-8").read()
    if text.endswith("\n"):
        text = text[:-1]  # as llama.cpp's -f reads a file
    kw = {"type_k": 0, "type_v": 0} if args.kv_f32 else {}
    n = args.n_ctx
    llm = llama_cpp.Llama(model_path=args.model, n_ctx=n, n_batch=n, n_threads=args.threads, logits_all=True,
                          flash_attn=False, verbose=False, **kw)
    tokens = llm.tokenize(text.encode(), add_bos=True, special=False)
    bos = llm.token_bos()
    first = n // 2
    nll = nll2 = 0.0
    count = 0
    running = []
    for k in range(len(tokens) // n):
        chunk = list(tokens[k * n:(k + 1) * n])
        chunk[0] = bos
        llm.reset()
        llm.eval(chunk)
        rows = np.array(llm.scores[:n], dtype=np.float64)
        for j in range(first, n - 1):
            row = rows[j]
            m = row.max()
            lp = row[tokens[k * n + j + 1]] - m - math.log(np.exp(row - m).sum())
            nll -= lp
            nll2 += lp * lp
            count += 1
        running.append(math.exp(nll / count))
    mean = nll / count
    ppl = math.exp(mean)
    err = math.sqrt((nll2 / count - mean * mean) / (count - 1)) * ppl
    out = {
        "meta": {"generator": "scripts/gen_perplexity_refs.py", "llama_cpp_python": llama_cpp.__version__,
                 "model": args.model.split("/")[-1], "text": args.text.split("tests/data/")[-1], "n_ctx": n,
                 "kv": "f32" if args.kv_f32 else "f16", "threads": args.threads},
        "n_tokens": len(tokens), "n_scored": count, "running_ppl": running, "ppl": ppl, "ppl_error": err,
    }
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
    print(f"{len(tokens)} tokens, {len(running)} chunks: PPL = {ppl:.4f} +/- {err:.5f}")


if __name__ == "__main__":
    main()

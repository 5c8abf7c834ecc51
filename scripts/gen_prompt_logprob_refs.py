#!/usr/bin/env python3
"""Regenerates llama.cpp's prompt logprobs for the echo / prompt_logprobs tests.

For each prompt: llama.cpp's token ids (BOS added, special tokens parsed) and,
for every token after the first, its log-probability under the logits of the
row before it (log-softmax of the raw logits, in float64), the most likely
token of that row and the top-2 logit margin there. The prompt runs in one
batch with logits for every row (logits_all). Uses the PyPI package
llama-cpp-python:

  python3 -m venv /tmp/ref && CMAKE_ARGS="-DGGML_NATIVE=ON" /tmp/ref/bin/pip install llama-cpp-python numpy
  /tmp/ref/bin/python scripts/gen_prompt_logprob_refs.py ../shared/models/gguf/stories260K.gguf \\
      tests/data/llamacpp/prompt_logprobs_stories260k.json --kv-f32 \\
      "Once upon a time, there was a little girl named Lily. She loved to play outside in the park." \\
      "Tom had a big red ball. He threw it to his friend and they laughed."
  /tmp/ref/bin/python scripts/gen_prompt_logprob_refs.py ~/.cache/tandem/models/gemma-3-270m-q4_k_m.gguf \\
      tests/data/llamacpp/prompt_logprobs_gemma3_270m.json \\
      "The capital of France is Paris, and the capital of Germany is Berlin." \\
      "def add(a, b):\\n    return a + b\\n"
"""
import argparse
import json

import llama_cpp
import numpy as np


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("out")
    ap.add_argument("prompts", nargs="+")
    ap.add_argument("--kv-f32", action="store_true", help="KV cache in f32 (as Tandem keeps it) instead of f16")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()

    kw = {"type_k": 0, "type_v": 0} if args.kv_f32 else {}
    llm = llama_cpp.Llama(model_path=args.model, n_ctx=512, n_batch=512, n_threads=args.threads, logits_all=True,
                          flash_attn=False, verbose=False, **kw)
    cases = []
    for text in args.prompts:
        llm.reset()
        ids = llm.tokenize(text.encode(), add_bos=True, special=True)
        llm.eval(ids)
        rows = np.array(llm.scores[: len(ids)], dtype=np.float64)
        lse = rows.max(axis=1) + np.log(np.exp(rows - rows.max(axis=1, keepdims=True)).sum(axis=1))
        logprobs, top1, margins = [], [], []
        for i in range(1, len(ids)):
            row = rows[i - 1]
            logprobs.append(float(row[ids[i]] - lse[i - 1]))
            best = np.argsort(-row, kind="stable")[:2]
            top1.append(int(best[0]))
            margins.append(float(row[best[0]] - row[best[1]]))
        cases.append({"prompt": text, "prompt_ids": ids, "logprobs": logprobs, "top1": top1, "top2_margin": margins})
        print(repr(text[:40]), len(ids), "tokens, sum of logprobs", round(sum(logprobs), 4))
    meta = {
        "generator": "scripts/gen_prompt_logprob_refs.py",
        "llama_cpp_python": llama_cpp.__version__,
        "model": args.model.split("/")[-1],
        "settings": f"n_ctx=512, one batch, logits_all, flash attention off, KV {'f32' if args.kv_f32 else 'f16'}, "
                    f"{args.threads} threads; logprobs[i] scores prompt_ids[i + 1]",
    }
    with open(args.out, "w") as f:
        json.dump({"meta": meta, "cases": cases}, f, indent=1)


if __name__ == "__main__":
    main()

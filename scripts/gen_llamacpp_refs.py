#!/usr/bin/env python3
"""Regenerates llama.cpp reference outputs for Tandem's model tests.

For each prompt: llama.cpp's token ids (BOS added, special tokens parsed), its
greedy continuation (argmax of the raw logits, ties to the lowest id, EOS not
special-cased) with the top-2 logit margin at each step, and the last prompt
position's logits (the top 64 and a fixed
sample of 256 other ids). Uses the PyPI package llama-cpp-python:

  python3 -m venv /tmp/ref && CMAKE_ARGS="-DGGML_NATIVE=ON" /tmp/ref/bin/pip install llama-cpp-python numpy
  /tmp/ref/bin/python scripts/gen_llamacpp_refs.py MODEL.gguf tests/data/llamacpp/OUT.json
"""
import argparse
import json
import random

import llama_cpp
import numpy as np

PROMPTS = [
    "Once upon a time",
    "The capital of France is",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "Here is a list of the planets of the solar system, in order from the sun:",
    "<start_of_turn>user\nWhy is the sky blue? Answer in two sentences.<end_of_turn>\n<start_of_turn>model\n",
    "Translate to German: The weather is nice today and we are going for a walk.",
]


def last_logits(llm, n_vocab):
    # Llama.eval no longer copies logits into llm.scores unless logits_all is
    # set; read the context's logits of the last evaluated row directly.
    ptr = llama_cpp.llama_get_logits_ith(llm.ctx, -1)
    return np.ctypeslib.as_array(ptr, shape=(n_vocab,)).astype(np.float32).copy()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("out")
    ap.add_argument("-n", type=int, default=40, help="greedy tokens per prompt")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()

    llm = llama_cpp.Llama(model_path=args.model, n_ctx=1024, n_threads=args.threads, n_batch=512,
                          logits_all=False, verbose=False)
    n_vocab = llm.n_vocab()
    rng = random.Random(1234)
    sample_ids = sorted(rng.sample(range(n_vocab), 256))
    cases = []
    for text in PROMPTS:
        llm.reset()
        prompt = llm.tokenize(text.encode(), add_bos=True, special=True)
        llm.eval(prompt)
        logits = last_logits(llm, n_vocab)
        top = np.argsort(-logits, kind="stable")[:64]
        greedy = []
        margins = []
        step_logits = logits
        for _ in range(args.n):
            tok = int(np.argmax(step_logits))
            greedy.append(tok)
            top2 = np.partition(step_logits, -2)[-2:]
            margins.append(float(top2[1] - top2[0]))
            llm.eval([tok])
            step_logits = last_logits(llm, n_vocab)
        cases.append({
            "prompt": text,
            "prompt_ids": prompt,
            "greedy_ids": greedy,
            # logit(best) - logit(second best) at each greedy step: where this is
            # small the choice is a near tie that rounding noise can flip.
            "greedy_margins": margins,
            "greedy_text": llm.detokenize(greedy).decode("utf-8", errors="replace"),
            "top_logits": [[int(i), float(logits[i])] for i in top],
            "sample_logits": [[i, float(logits[i])] for i in sample_ids],
        })
        print(repr(text[:40]), "->", repr(cases[-1]["greedy_text"][:60]))
    meta = {
        "generator": "scripts/gen_llamacpp_refs.py",
        "llama_cpp_python": llama_cpp.__version__,
        "model": args.model.split("/")[-1],
        "n_vocab": n_vocab,
        "settings": "n_ctx=1024, n_batch=512, default KV type (f16), default flash-attention setting, "
                    f"{args.threads} threads, greedy = argmax of raw logits",
    }
    with open(args.out, "w") as f:
        json.dump({"meta": meta, "cases": cases}, f, indent=1)


if __name__ == "__main__":
    main()

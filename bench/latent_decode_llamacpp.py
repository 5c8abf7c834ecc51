#!/usr/bin/env python3
"""llama.cpp's side of the latent-attention decode benchmark (docs/benchmarks.md):
prefill P tokens in one eval (micro-batches of 512), then N single-token evals,
2 threads, f16 cache. Uses llama-cpp-python.

  python bench/latent_decode_llamacpp.py MODEL.gguf 8192 32
"""
import sys
import time

import llama_cpp


def main():
    path, P, N = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    llm = llama_cpp.Llama(model_path=path, n_ctx=P + N + 16, n_batch=512, n_ubatch=512, n_threads=2, verbose=False)
    toks = [1] + [3 + (i * 97 + 31) % 509 for i in range(P - 1)]
    t0 = time.time()
    llm.eval(toks)
    t1 = time.time()
    for i in range(N):
        llm.eval([3 + i * 7 % 500])
    t2 = time.time()
    print(f"llama.cpp prefill {P} tok/s {P / (t1 - t0):.2f}  decode {N} at {P} ctx tok/s {N / (t2 - t1):.2f}")


if __name__ == "__main__":
    main()

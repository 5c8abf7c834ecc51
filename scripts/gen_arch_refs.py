#!/usr/bin/env python3
"""Regenerates the llama.cpp references for tests/model_arch_test.cpp.

Builds small synthetic models with `tandem synth` (random weights, the 512-token
stories260K vocabulary) for each architecture Tandem supports and for every
weight type on one llama shape, runs llama.cpp on a fixed token sequence, and
writes tests/data/llamacpp/arch_<name>.json per model with: the synth flags,
the SHA-256 of the synthesized file (the test re-synthesizes it with the C++ API
and checks the hash, so a change to synth fails loudly instead of silently
comparing against stale numbers), all last-position logits after the prompt
(one batch), and the greedy continuation (argmax of the raw logits, ties to the
lowest id) with the top-2 logit margin at each step.

llama.cpp settings: KV cache in f32 (type_k = type_v = GGML_TYPE_F32, as Tandem
keeps it), flash attention off, prompt in one batch, then one token per step.

Uses the PyPI package llama-cpp-python (it installs nothing itself):

  python3 -m venv /tmp/ref && CMAKE_ARGS="-DGGML_NATIVE=ON" /tmp/ref/bin/pip install llama-cpp-python numpy
  cmake --build build && /tmp/ref/bin/python scripts/gen_arch_refs.py --tandem build/tandem
"""
import argparse
import hashlib
import json
import os
import subprocess
import tempfile

import llama_cpp
import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VOCAB_REL = "gguf/stories260K.gguf"  # relative to ../shared/models

# 40 ids: BOS, then a fixed walk over the 512-token vocabulary (avoiding the
# control tokens 0..2), long enough to pass gemma3's window of 8 several times.
PROMPT = [1] + [3 + (i * 97 + 31) % 509 for i in range(39)]
N_GREEDY = 16

# A llama shape whose widths suit every block size (K-quants need 256).
K_SHAPE = ["--arch", "llama", "--layers", "2", "--embd", "256", "--ff", "512", "--heads", "4", "--kv-heads", "2"]
SMALL = ["--layers", "2", "--embd", "128", "--ff", "256"]
DS2 = SMALL + ["--heads", "4", "--head-dim", "64", "--rope-dim", "32", "--kv-lora", "64", "--head-dim-v", "32"]
DS2_MOE = ["--experts", "8", "--ff-exp", "64", "--experts-shared", "2"]
GPTOSS = ["--arch", "gpt-oss", "--layers", "3", "--embd", "128", "--ff", "128", "--heads", "4", "--kv-heads", "2",
          "--head-dim", "32", "--experts", "8", "--experts-used", "2", "--ff-exp", "64", "--window", "8",
          "--yarn-factor", "32"]

MODELS = {
    # Architectures, F32 weights: differences here are forward-pass bugs, not rounding.
    "llama_f32": ["--arch", "llama"] + SMALL + ["--heads", "4"],
    "llama_gqa_f32": ["--arch", "llama"] + SMALL + ["--heads", "8", "--kv-heads", "2", "--tied"],
    "llama_ropefreqs_f32": ["--arch", "llama"] + SMALL + ["--heads", "4", "--kv-heads", "2", "--rope-freqs",
                                                         "--rope-base", "500000"],
    "qwen2_f32": ["--arch", "qwen2"] + SMALL + ["--heads", "4", "--kv-heads", "2"],
    "qwen3_f32": ["--arch", "qwen3"] + SMALL + ["--heads", "4", "--kv-heads", "2", "--head-dim", "64"],
    "gemma3_f32": ["--arch", "gemma3", "--layers", "7", "--embd", "128", "--ff", "256", "--heads", "4",
                   "--kv-heads", "1", "--head-dim", "64", "--window", "8"],
    "gemma3_q4_k_m": ["--arch", "gemma3", "--layers", "7", "--embd", "256", "--ff", "512", "--heads", "4",
                      "--kv-heads", "1", "--head-dim", "64", "--window", "8", "--type", "q4_k_m"],
    "qwen3_q8_0": ["--arch", "qwen3"] + SMALL + ["--heads", "4", "--kv-heads", "2", "--head-dim", "64",
                                                "--type", "q8_0"],
    # Latent attention: DeepSeek-V2-Lite's structure at small widths (query
    # heads of 32 unrotated + 32 rotated, values of 32, a latent of 64).
    "deepseek2_f32": ["--arch", "deepseek2"] + DS2,
    "deepseek2_qlora_f32": ["--arch", "deepseek2"] + DS2 + ["--q-lora", "96"],
    "deepseek2_q8_0": ["--arch", "deepseek2"] + DS2 + ["--type", "q8_0"],
    # V2-Lite's YaRN (factor 40, log multiplier 0.0707) over an original
    # context of 32, so the ramp falls inside the 16 rotated pairs.
    "deepseek2_yarn_f32": ["--arch", "deepseek2"] + DS2 + ["--yarn-factor", "40", "--yarn-orig-ctx", "32",
                                                          "--yarn-log-mul", "0.0707"],
    # deepseek2 with V2-Lite's mixture of experts: layer 0 dense, layer 1 routed experts (softmax, top-k,
    # no renormalisation) plus two shared experts; then V3's gating options (renormalised, scaled by 2.5).
    "deepseek2_moe_f32": ["--arch", "deepseek2"] + DS2 + DS2_MOE + ["--experts-used", "2"],
    "deepseek2_moe_q8_0": ["--arch", "deepseek2"] + DS2 + DS2_MOE + ["--experts-used", "2", "--type", "q8_0"],
    "deepseek2_moe_norm_f32": ["--arch", "deepseek2"] + DS2 + DS2_MOE + ["--experts-used", "3", "--expert-norm",
                                                                         "--expert-scale", "2.5"],
    # Mixtures of experts: Mixtral's tensors on llama (softmax, top-k, renormalised), qwen3moe (the same
    # gating), qwen2moe (no renormalisation, a shared expert behind a sigmoid gate).
    "llama_moe_f32": ["--arch", "llama"] + SMALL + ["--heads", "4", "--kv-heads", "2", "--experts", "8",
                                                   "--experts-used", "2"],
    "qwen3moe_f32": ["--arch", "qwen3moe"] + SMALL + ["--heads", "4", "--kv-heads", "2", "--head-dim", "64",
                                                     "--experts", "16", "--experts-used", "4", "--ff-exp", "64"],
    "qwen2moe_f32": ["--arch", "qwen2moe"] + SMALL + ["--heads", "4", "--kv-heads", "2", "--experts", "8",
                                                     "--experts-used", "2", "--ff-exp", "64", "--ff-shexp", "192"],
    "qwen3moe_q8_0": ["--arch", "qwen3moe"] + SMALL + ["--heads", "4", "--kv-heads", "2", "--head-dim", "64",
                                                      "--experts", "16", "--experts-used", "4", "--ff-exp", "64",
                                                      "--type", "q8_0"],
    "qwen2moe_q8_0": ["--arch", "qwen2moe"] + SMALL + ["--heads", "4", "--kv-heads", "2", "--experts", "8",
                                                      "--experts-used", "2", "--ff-exp", "64", "--ff-shexp", "192",
                                                      "--type", "q8_0"],
    "qwen3moe_q4_k_m": ["--arch", "qwen3moe", "--layers", "2", "--embd", "256", "--ff", "512", "--heads", "4",
                        "--kv-heads", "2", "--head-dim", "64", "--experts", "8", "--experts-used", "2",
                        "--ff-exp", "256", "--type", "q4_k_m"],
    "llama_moe_q4_k_m": ["--arch", "llama", "--layers", "2", "--embd", "256", "--ff", "256", "--heads", "4",
                         "--kv-heads", "2", "--experts", "8", "--experts-used", "2", "--type", "q4_k_m"],
    # gpt-oss: biased attention with a sink logit per head, every other layer (0, 2) over a window of 8,
    # YaRN (factor 32 over 4096, as gpt-oss-20b), a biased router (top-k logits, then a softmax over the k)
    # and biased experts through the clamped SwiGLU; at F32, Q8_0 and llama.cpp's MXFP4_MOE mix.
    "gptoss_f32": GPTOSS,
    "gptoss_q8_0": GPTOSS + ["--type", "q8_0"],
    "gptoss_mxfp4_moe": GPTOSS + ["--type", "mxfp4_moe"],
}
for t in ["f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q2_k", "q3_k", "q4_k", "q5_k", "q6_k",
          "q4_k_m", "q5_k_m", "mxfp4"]:
    MODELS["llama_k_" + t] = K_SHAPE + ["--type", t]


def last_logits(llm, n_vocab):
    ptr = llama_cpp.llama_get_logits_ith(llm.ctx, -1)
    return np.ctypeslib.as_array(ptr, shape=(n_vocab,)).astype(np.float32).copy()


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tandem", default=os.path.join(REPO, "build", "tandem"))
    ap.add_argument("--shared", default=os.path.join(REPO, "..", "shared", "models"))
    ap.add_argument("--out-dir", default=os.path.join(REPO, "tests", "data", "llamacpp"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--only", nargs="*", help="model names (default: all)")
    args = ap.parse_args()
    vocab = os.path.join(args.shared, VOCAB_REL)

    with tempfile.TemporaryDirectory() as tmp:
        for name, synth_args in MODELS.items():
            if args.only and name not in args.only:
                continue
            path = os.path.join(tmp, name + ".gguf")
            subprocess.run([args.tandem, "synth", "-o", path, "--vocab-from", vocab] + synth_args, check=True,
                           stderr=subprocess.DEVNULL)
            llm = llama_cpp.Llama(model_path=path, n_ctx=128, n_batch=128, n_threads=args.threads,
                                  type_k=0, type_v=0, flash_attn=False, logits_all=False, verbose=False)
            n_vocab = llm.n_vocab()
            llm.eval(PROMPT)
            logits = last_logits(llm, n_vocab)
            greedy, margins = [], []
            step = logits
            for _ in range(N_GREEDY):
                tok = int(np.argmax(step))
                greedy.append(tok)
                top2 = np.partition(step, -2)[-2:]
                margins.append(float(top2[1] - top2[0]))
                llm.eval([tok])
                step = last_logits(llm, n_vocab)
            out = {
                "meta": {
                    "generator": "scripts/gen_arch_refs.py",
                    "llama_cpp_python": llama_cpp.__version__,
                    "settings": f"n_ctx=128, n_batch=128, KV f32, flash attention off, {args.threads} threads, "
                                "prompt in one batch, greedy = argmax of raw logits",
                },
                "name": name,
                "synth_args": synth_args,
                "vocab": VOCAB_REL,
                "synth_sha256": sha256(path),
                "prompt_ids": PROMPT,
                "logits": [float(x) for x in logits],
                "greedy_ids": greedy,
                # logit(best) - logit(second best) at each greedy step: where this
                # is small the choice is a near tie that rounding can flip.
                "greedy_margins": margins,
            }
            with open(os.path.join(args.out_dir, f"arch_{name}.json"), "w") as f:
                json.dump(out, f, indent=1)
            print(f"{name:22s} {out['synth_sha256'][:12]}  greedy {greedy[:8]}  min margin {min(margins):.3f}")
            del llm


if __name__ == "__main__":
    main()

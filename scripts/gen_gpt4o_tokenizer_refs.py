#!/usr/bin/env python3
"""Reference tokenizations for the o200k pre-tokenizer (tokenizer.ggml.pre = "gpt-4o").

No gpt-4o vocabulary GGUF is available here, so the byte-level BPE vocabulary
../shared/models/vocab/ggml-vocab-gpt-2.gguf is copied with only its
tokenizer.ggml.pre changed, and llama.cpp (llama-cpp-python, vocab only)
tokenizes the vocab test texts (ggml-vocab-*.inp) plus strings aimed at the
o200k rules: case runs, non-ASCII letters and marks, digit runs, capitalised
contractions, newlines and '/' after punctuation, emoji. The merges are
GPT-2's; the splits, which decide which merges can apply, are o200k's.

  /tmp/ref/bin/python scripts/gen_gpt4o_tokenizer_refs.py   (the venv of scripts/gen_arch_refs.py)

Writes tests/data/tokenizer/ggml-vocab-gpt-4o.json (read by
tests/tokenizer_gpt4o_test.cpp, which makes the same copy in memory).
"""
import os
import sys
import tempfile

import gguf

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gen_tokenizer_refs as base  # noqa: E402

SRC = os.path.join(base.VOCAB_DIR, "ggml-vocab-gpt-2.gguf")
OUT = os.path.join(base.OUT_DIR, "ggml-vocab-gpt-4o.json")
INPUTS = ["ggml-vocab-gpt-2.gguf.inp", "ggml-vocab-qwen35.gguf.inp", "ggml-vocab-gemma-4.gguf.inp"]

O200K_TEXTS = [
    "HelloWorld helloWORLD HTTPServer iPhone McDonald's XMLHttpRequest",
    "DON'T I'M YOU'RE WE'VE SHE'LL HE'D IT'S don't it's They'Re",
    "'s 'S x's X'S ''s a'll",
    "\u00c9cole \u00e9COLE Stra\u00dfe STRASSE \u00c0 la mode \u0130stanbul",
    "e\u0301 E\u0301COLE cafe\u0301 na\u0308ive",
    "\u03a9mega \u03c9MEGA \u0391\u03b8\u03ae\u03bd\u03b1 \u041c\u043e\u0441\u043a\u0432\u0430 \u041c\u041e\u0421\u041a\u0412\u0410",
    "\u6771\u4eac\u306f\u65e5\u672c\u306e\u9996\u90fd\u3067\u3059\u3002\u4e2d\u6587\u5206\u8bcd\u6d4b\u8bd5 \ud55c\uad6d\uc5b4 \u0627\u0644\u0639\u0631\u0628\u064a\u0629",
    "1 12 123 1234 12345 123456 1234567 \u0661\u0662\u0663\u0664 \u00bd\u2153 \u2460\u2461\u2462\u2463",
    "a1b22c333d4444 x9Y 3rd 42nd",
    "end.\nnext!\n\nwhy?\r\nok;\r\n\r\nx",
    "a/b //c https://example.com/path/to?q=1 ./run.sh ../x/ y.\n/z",
    "\"quoted\"\n'single'\n(paren)\n[list]/\n{}/\n",
    "I \u2764\ufe0f \U0001F999! \U0001F468\u200d\U0001F469\u200d\U0001F467 \U0001F44D\U0001F3FD ok\U0001F600",
    "  leading and trailing  \n  \t tab\t\n\n   ",
    "\u00a0nbsp\u2009thin\u3000ideo\u0085nel",
    "<|start|>user<|message|>Hi<|end|><|start|>assistant<|channel|>final<|message|>",
    "CamelCaseWordsAndALLCAPSWords_and_snake_case-and-kebab",
    "\u01c5ungla \u01c8j \u02b0ab \u02b0AB \u1d2c\u1d2e",
    "x\u0301\u0301\u0301y A\u0308 \u0308",
]


def copy_with_pre(src, dst, pre):
    r = gguf.GGUFReader(src)
    arch = r.fields["general.architecture"].contents()
    w = gguf.GGUFWriter(dst, arch)
    for name, f in r.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        val = pre if name == "tokenizer.ggml.pre" else f.contents()
        vtype = f.types[0]
        sub = f.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(name, val, vtype, sub_type=sub)
    if "tokenizer.ggml.pre" not in r.fields:
        w.add_string("tokenizer.ggml.pre", pre)
    if len(r.tensors):
        sys.exit(f"{src} has tensors; expected a vocabulary-only file")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main():
    texts = []
    for name in INPUTS:
        raw = open(os.path.join(base.VOCAB_DIR, name), "rb").read()
        parts = raw.split(b"\n__ggml_vocab_test__\n")
        if parts and parts[-1] == b"":
            parts.pop()
        texts += parts
    texts += [t.encode() for t in O200K_TEXTS + base.EXTRA_TEXTS + base.SHARED_TEXTS] + base.EXTRA_BYTES
    seen = set()
    texts = [t for t in texts if not (t in seen or seen.add(t))]
    with tempfile.TemporaryDirectory() as d:
        dst = os.path.join(d, "ggml-vocab-gpt-4o.gguf")
        copy_with_pre(SRC, dst, "gpt-4o")
        ref = base.reference(dst, texts)
    ref["model"] = "ggml-vocab-gpt-2.gguf with tokenizer.ggml.pre = gpt-4o"
    base.write_json(OUT, ref)


if __name__ == "__main__":
    main()

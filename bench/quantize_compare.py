#!/usr/bin/env python3
"""`tandem quantize` against llama.cpp's quantizer (llama_model_quantize, what
llama-quantize runs) on the same source files.

For each source and type: quantize with `tandem quantize` and with llama.cpp
(through llama-cpp-python, in a worker process inside its venv, without an
importance matrix), then compare the two files: the type chosen for each
tensor (must be equal), how many tensors are byte-identical, whether the whole
files are. Tandem's file is loaded by llama.cpp, which must generate from it
(greedy, a few tokens; the text is compared with what llama.cpp generates from
its own file). `tandem perplexity` scores both files on a real text.

Sources (by default):
  gemma-bf16       Gemma 3 270M dequantized to BF16 by `tandem quantize --type bf16`
                   from the installed Q4_K_M file (made once in --work)
  gemma-q4_k_m     the installed Q4_K_M file itself, requantized (both tools
                   with requantizing allowed)
  stories260K      ../shared/models/gguf/stories260K.gguf (F32)

llama-cpp-python is installed from PyPI into its own venv (--venv, default
/tmp/llamacpp-venv; built for this CPU by bench/llama_build.py), never the repo's .venv.

  bench/quantize_compare.py                                   # every source, every type
  bench/quantize_compare.py --sources stories260K --types q4_k_m,q8_0
  bench/quantize_compare.py --json-out /tmp/qc.json -c 512 --chunks 8
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import struct
import subprocess
import sys
import time
from pathlib import Path

from llama_build import ggml_cmake_args

LLAMA_CPP_PYTHON_VERSION = "0.3.36"
REPO = Path(__file__).resolve().parent.parent
HOME = Path(os.environ.get("HOME", "/root"))
GEMMA_Q4KM = HOME / ".cache/tandem/models/gemma-3-270m-q4_k_m.gguf"
STORIES = REPO.parent / "shared/models/gguf/stories260K.gguf"
DEFAULT_TEXT = Path("/usr/share/common-licenses/GPL-3")
PROMPT = "The GNU General Public License is"

# llama-quantize's names and llama_ftype numbers.
TYPES = {
    "f32": 0, "f16": 1, "bf16": 32, "q8_0": 7, "q4_0": 2, "q4_1": 3, "q5_0": 8, "q5_1": 9,
    "q2_k": 10, "q3_k_s": 11, "q3_k_m": 12, "q3_k_l": 13, "q4_k_s": 14, "q4_k_m": 15,
    "q5_k_s": 16, "q5_k_m": 17, "q6_k": 18,
}

# ggml type id -> (name, elements per block, bytes per block)
GGML_TYPES = {
    0: ("f32", 1, 4), 1: ("f16", 1, 2), 30: ("bf16", 1, 2), 2: ("q4_0", 32, 18), 3: ("q4_1", 32, 20),
    6: ("q5_0", 32, 22), 7: ("q5_1", 32, 24), 8: ("q8_0", 32, 34), 10: ("q2_K", 256, 84),
    11: ("q3_K", 256, 110), 12: ("q4_K", 256, 144), 13: ("q5_K", 256, 176), 14: ("q6_K", 256, 210),
}


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- GGUF tensor table


def read_gguf_tensors(path: Path) -> list[dict]:
    """Name, type, dims and data bytes of each tensor, in file order."""
    with open(path, "rb") as f:
        data = f.read(64 << 20)  # the header of any model here fits
    pos = 0

    def take(fmt: str):
        nonlocal pos
        v = struct.unpack_from("<" + fmt, data, pos)
        pos += struct.calcsize("<" + fmt)
        return v[0] if len(v) == 1 else v

    def string() -> str:
        n = take("Q")
        nonlocal pos
        s = data[pos:pos + n].decode("utf-8", errors="replace")
        pos += n
        return s

    scalar = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}

    def value(t: int):
        if t in scalar:
            return take(scalar[t])
        if t == 8:
            return string()
        if t == 9:
            et, n = take("I"), take("Q")
            return [value(et) for _ in range(n)]
        raise ValueError(f"{path}: bad GGUF value type {t}")

    magic, version, n_tensors, n_kv = take("I"), take("I"), take("Q"), take("Q")
    if magic != 0x46554747:
        raise ValueError(f"{path}: not a GGUF file")
    alignment = 32
    for _ in range(n_kv):
        key, t = string(), take("I")
        v = value(t)
        if key == "general.alignment":
            alignment = v
    tensors = []
    for _ in range(n_tensors):
        name = string()
        nd = take("I")
        dims = [take("Q") for _ in range(nd)]
        t, off = take("I"), take("Q")
        tname, blk, bb = GGML_TYPES[t]
        n = 1
        for d in dims:
            n *= d
        tensors.append({"name": name, "type": tname, "dims": dims, "offset": off, "n": n,
                        "bytes": n // blk * bb})
    data_start = (pos + alignment - 1) // alignment * alignment
    for t in tensors:
        t["offset"] += data_start
    return tensors


def tensor_bytes(path: Path, t: dict) -> bytes:
    with open(path, "rb") as f:
        f.seek(t["offset"])
        return f.read(t["bytes"])


# ---------------------------------------------------------------- llama.cpp side (inside the venv)


def worker(args: argparse.Namespace) -> int:
    import ctypes

    import llama_cpp as L

    if args.worker == "quantize":
        p = L.llama_model_quantize_default_params()
        p.ftype = args.ftype
        p.nthread = args.threads
        p.allow_requantize = bool(args.allow_requantize)
        t = time.perf_counter()
        rc = L.llama_model_quantize(args.input.encode(), args.output.encode(), ctypes.byref(p))
        print(json.dumps({"rc": rc, "seconds": time.perf_counter() - t}))
        return 0 if rc == 0 else 1
    if args.worker == "generate":
        # Greedy decoding through the low-level API, so that llama.cpp's weight
        # repacking (its CPU "extra buffer types") can be turned off: with it
        # on, llama.cpp 0.3.36 crashes on its own Q4_0/Q8_0 quantizations of
        # stories260K (64-wide rows), whichever tool wrote them.
        L.llama_backend_init()
        mp = L.llama_model_default_params()
        mp.use_extra_bufts = not args.no_repack
        model = L.llama_model_load_from_file(args.input.encode(), mp)
        if not model:
            raise SystemExit(f"llama.cpp could not load {args.input}")
        cp = L.llama_context_default_params()
        cp.n_ctx, cp.n_batch, cp.n_threads, cp.n_threads_batch = 256, 256, args.threads, args.threads
        ctx = L.llama_init_from_model(model, cp)
        if not ctx:
            raise SystemExit("llama.cpp could not create a context")
        vocab = L.llama_model_get_vocab(model)
        n_vocab = L.llama_vocab_n_tokens(vocab)
        buf = (L.llama_token * 256)()
        n = L.llama_tokenize(vocab, PROMPT.encode(), len(PROMPT), buf, 256, True, False)
        ids = list(buf[:n])
        out: list[int] = []
        batch = L.llama_batch_get_one(buf, n)
        for _ in range(args.n_gen):
            if L.llama_decode(ctx, batch) != 0:
                raise SystemExit("llama_decode failed")
            logits = L.llama_get_logits_ith(ctx, -1)
            best = max(range(n_vocab), key=lambda i: logits[i])
            if L.llama_vocab_is_eog(vocab, best):
                break
            out.append(best)
            one = (L.llama_token * 1)(best)
            batch = L.llama_batch_get_one(one, 1)
        piece = ctypes.create_string_buffer(256)
        text = b""
        for t in out:
            k = L.llama_token_to_piece(vocab, t, piece, 256, 0, False)
            text += piece.raw[:max(k, 0)]
        print(json.dumps({"text": text.decode("utf-8", errors="replace"), "tokens": len(out),
                          "repack": not args.no_repack, "prompt_tokens": len(ids)}))
        return 0
    raise SystemExit(f"unknown worker job {args.worker}")


def ensure_venv(venv: Path) -> Path:
    py = venv / "bin/python"
    if py.exists() and subprocess.run([str(py), "-c", "import llama_cpp"], capture_output=True).returncode == 0:
        return py
    log(f"installing llama-cpp-python {LLAMA_CPP_PYTHON_VERSION} into {venv} (a source build: minutes)")
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    env = dict(os.environ, CMAKE_ARGS=os.environ.get("CMAKE_ARGS", " ".join(ggml_cmake_args())))
    subprocess.run([str(py), "-m", "pip", "install", "-q", f"llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION}"],
                   check=True, env=env)
    return py


def run_worker(py: Path, *argv: str, timeout: int = 1800) -> dict:
    r = subprocess.run([str(py), __file__, "--worker", *argv], capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        return {"error": (r.stderr or r.stdout)[-2000:]}
    return json.loads(r.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------- Tandem side


def tandem_quantize(tandem: Path, src: Path, out: Path, type_name: str, threads: int, requant: bool) -> dict:
    cmd = [str(tandem), "quantize", str(src), str(out), "--type", type_name, "-t", str(threads)]
    if requant:
        cmd.append("--allow-requantize")
    t = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        return {"error": r.stderr[-2000:]}
    return {"seconds": time.perf_counter() - t, "summary": r.stderr.strip().splitlines()[-1]}


def tandem_ppl(tandem: Path, model: Path, text: Path, ctx: int, chunks: int, threads: int) -> dict:
    r = subprocess.run([str(tandem), "perplexity", "-m", str(model), "-f", str(text), "-c", str(ctx), "--chunks",
                        str(chunks), "-t", str(threads), "--json"], capture_output=True, text=True)
    if r.returncode != 0:
        return {"error": r.stderr[-2000:]}
    return json.loads(r.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------- driver


def compare_files(a: Path, b: Path) -> dict:
    ta, tb = read_gguf_tensors(a), read_gguf_tensors(b)
    same_order = [t["name"] for t in ta] == [t["name"] for t in tb]
    bmap = {t["name"]: t for t in tb}
    type_diff, identical = [], 0
    for t in ta:
        o = bmap.get(t["name"])
        if o is None or o["type"] != t["type"]:
            type_diff.append(f"{t['name']}: {t['type']} vs {o['type'] if o else 'missing'}")
            continue
        if tensor_bytes(a, t) == tensor_bytes(b, o):
            identical += 1
    n_el = sum(t["n"] for t in ta)
    n_bytes = sum(t["bytes"] for t in ta)
    return {
        "n_tensors": len(ta), "same_order": same_order, "type_mismatches": type_diff,
        "identical_tensors": identical, "file_identical": a.read_bytes() == b.read_bytes(),
        "file_mib": a.stat().st_size / 1048576.0, "bpw": 8.0 * n_bytes / n_el,
        "types": sorted({t["type"] for t in ta}),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worker", choices=["quantize", "generate"], help=argparse.SUPPRESS)
    ap.add_argument("--input", help=argparse.SUPPRESS)
    ap.add_argument("--output", help=argparse.SUPPRESS)
    ap.add_argument("--ftype", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--allow-requantize", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--no-repack", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--n-gen", type=int, default=16, help="tokens llama.cpp generates from each file")
    ap.add_argument("--tandem", type=Path, default=REPO / "build/tandem")
    ap.add_argument("--venv", type=Path, default=Path("/tmp/llamacpp-venv"))
    ap.add_argument("--work", type=Path, default=Path("/tmp/quantize_compare"))
    ap.add_argument("--sources", default="gemma-bf16,gemma-q4_k_m,stories260K")
    ap.add_argument("--types", default=",".join(TYPES))
    ap.add_argument("--text", type=Path, default=DEFAULT_TEXT)
    ap.add_argument("-c", "--ctx", type=int, default=512)
    ap.add_argument("--chunks", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--keep", action="store_true", help="keep the quantized files in --work")
    ap.add_argument("--json-out", type=Path)
    args = ap.parse_args()
    if args.worker:
        return worker(args)

    types = [t.strip().lower() for t in args.types.split(",") if t.strip()]
    for t in types:
        if t not in TYPES:
            raise SystemExit(f"unknown type {t}; known: {', '.join(TYPES)}")
    py = ensure_venv(args.venv)
    args.work.mkdir(parents=True, exist_ok=True)
    sources: list[tuple[str, Path, bool]] = []
    for s in args.sources.split(","):
        if s == "gemma-bf16":
            bf16 = args.work / "gemma-3-270m-bf16.gguf"
            if not bf16.exists():
                log(f"dequantizing {GEMMA_Q4KM.name} to BF16")
                r = tandem_quantize(args.tandem, GEMMA_Q4KM, bf16, "bf16", args.threads, True)
                if "error" in r:
                    raise SystemExit(r["error"])
            sources.append((s, bf16, False))
        elif s == "gemma-q4_k_m":
            sources.append((s, GEMMA_Q4KM, True))
        elif s == "stories260K":
            sources.append((s, STORIES, False))
        else:
            sources.append((Path(s).stem, Path(s), False))

    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    results = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
               "commit": commit, "machine": platform.processor() or platform.machine(),
               "cpu": next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")),
                           "?"),
               "nproc": os.cpu_count(), "text": str(args.text), "ctx": args.ctx, "chunks": args.chunks,
               "argv": sys.argv[1:], "rows": []}
    for name, src, requant in sources:
        log(f"source {name}: {src}")
        for t in types:
            tf, lf = args.work / f"{name}-{t}-tandem.gguf", args.work / f"{name}-{t}-llamacpp.gguf"
            row = {"source": name, "type": t}
            rt = tandem_quantize(args.tandem, src, tf, t, args.threads, requant)
            rl = run_worker(py, "quantize", "--input", str(src), "--output", str(lf), "--ftype", str(TYPES[t]),
                            "--allow-requantize", str(int(requant)), "--threads", str(args.threads))
            row["tandem_quantize_s"], row["llamacpp_quantize_s"] = rt.get("seconds"), rl.get("seconds")
            if "error" in rt or "error" in rl:
                row["error"] = rt.get("error") or rl.get("error")
                log(f"  {t}: {row['error'][-300:]}")
                results["rows"].append(row)
                continue
            row.update(compare_files(tf, lf))
            row["ppl_tandem_file"] = tandem_ppl(args.tandem, tf, args.text, args.ctx, args.chunks, args.threads)
            row["ppl_llamacpp_file"] = tandem_ppl(args.tandem, lf, args.text, args.ctx, args.chunks, args.threads)
            gen = ["generate", "--n-gen", str(args.n_gen), "--threads", str(args.threads)]
            gt = run_worker(py, *gen, "--input", str(tf))
            gl = run_worker(py, *gen, "--input", str(lf))
            if "error" in gt and "error" in gl:
                # Both crash: llama.cpp's repacking on tiny rows; again without it.
                gt = run_worker(py, *gen, "--no-repack", "--input", str(tf))
                gl = run_worker(py, *gen, "--no-repack", "--input", str(lf))
            row["llamacpp_generates_tandem_file"] = gt
            row["llamacpp_generates_own_file"] = gl
            row["same_generation"] = "text" in gt and gt.get("text") == gl.get("text")
            pt, pl = row["ppl_tandem_file"].get("ppl"), row["ppl_llamacpp_file"].get("ppl")
            log(f"  {t}: {row['file_mib']:.1f} MiB {row['bpw']:.2f} bpw, types equal: {not row['type_mismatches']}, "
                f"identical tensors {row['identical_tensors']}/{row['n_tensors']}, file identical: "
                f"{row['file_identical']}, PPL {pt} vs {pl}, llama.cpp generates: {gt.get('text', gt)!r}")
            results["rows"].append(row)
            if not args.keep:
                tf.unlink(missing_ok=True)
                lf.unlink(missing_ok=True)
    if args.json_out:
        args.json_out.write_text(json.dumps(results, indent=1))

    print(f"\n{results['date']}, {results['cpu']} ({results['nproc']} cores), commit {commit}; "
          f"`tandem perplexity -c {args.ctx} --chunks {args.chunks}` on {args.text}\n")
    for name, _, _ in sources:
        print(f"\n{name}:\n")
        print("| type | size MiB | bpw | tensor types equal | byte-identical tensors | file identical | "
              "PPL, Tandem's file | PPL, llama.cpp's file | llama.cpp generates from Tandem's file |")
        print("|---|---|---|---|---|---|---|---|---|")
        for r in results["rows"]:
            if r["source"] != name:
                continue
            if "error" in r:
                print(f"| {r['type']} | error: {r['error'][-120:]!r} |||||||")
                continue

            def ppl(p: dict) -> str:
                return f"{p['ppl']:.4f} ± {p['ppl_error']:.4f}" if "ppl" in p else "error"

            g = r["llamacpp_generates_tandem_file"]
            gen = (f"yes, {g['tokens']} tokens" + ("" if g["repack"] else " (repacking off*)") +
                   (", same text as from its own" if r["same_generation"] else ", text differs from its own")
                   ) if "text" in g else "NO"
            print(f"| {r['type'].upper()} | {r['file_mib']:.2f} | {r['bpw']:.2f} | "
                  f"{'yes' if not r['type_mismatches'] else 'NO: ' + '; '.join(r['type_mismatches'][:3])} | "
                  f"{r['identical_tensors']}/{r['n_tensors']} | {'yes' if r['file_identical'] else 'no'} | "
                  f"{ppl(r['ppl_tandem_file'])} | {ppl(r['ppl_llamacpp_file'])} | {gen} |")
    print("\n*: llama.cpp crashes with its weight repacking on, on its own file as on Tandem's, so both ran "
          "without it (llama_model_params.use_extra_bufts = false).")
    bad = [r for r in results["rows"] if "error" in r or r["type_mismatches"] or not r["same_order"]
           or "text" not in r["llamacpp_generates_tandem_file"]]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

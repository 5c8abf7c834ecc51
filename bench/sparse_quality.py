#!/usr/bin/env python3
"""What sparse attention (--sparse-attention BUDGET, Quest) costs in quality, on long real text.

1. Perplexity (`tandem perplexity`: chunks of C tokens, the second half of each scored, every
   row attended as decoding would attend it) over the license texts concatenated
   (bench/kv_quality.py's list), dense against each budget, with StreamingLLM's window
   (--kv-window B-4 --kv-sinks 4) and H2O (--kv-window B/2-4 --kv-sinks 4 --kv-heavy B/2) holding
   the same number of positions beside them.
2. Needle in a haystack: a sentence with a 5-digit number at 10/50/90% depth of L tokens of the
   same text, asked for at the end; greedy answers of dense attention and of each budget from one
   server (`tandem serve --sparse-attention MAX`, the request's `sparse_attention` field choosing
   the budget, 0 for dense; the prefix cache computes each haystack once). Reported: dense's own
   score, each budget's score, and its agreement with dense (the same digits).

  bench/sparse_quality.py --ppl-ctx 8192 --ppl-chunks 2 --niah-lengths 4096,8192,16384 --cases 10
  bench/sparse_quality.py --skip-ppl --niah-lengths 4096 --cases 3     # a quick look
"""

from __future__ import annotations

import argparse
import json
import random
import re
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))
from kv_quality import GEMMA, LICENSES, log  # noqa: E402

LICENSE_DIR = Path("/usr/share/common-licenses")


def licenses_text(work: Path) -> Path:
    out = work / "licenses.txt"
    out.write_text("\n\n".join((LICENSE_DIR / n).read_text(errors="replace") for n in LICENSES))
    return out


def ppl(args, text: Path, extra: list[str]) -> dict:
    cmd = [str(args.tandem), "perplexity", "-m", str(args.model), "-f", str(text), "-c", str(args.ppl_ctx),
           "--chunks", str(args.ppl_chunks), "-t", str(args.threads), "--json", *extra]
    t0 = time.time()
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(r.stderr[-800:])
    out = json.loads(r.stdout.strip().splitlines()[-1])
    out["seconds"] = time.time() - t0
    return out


def niah(args, text: Path) -> dict:
    import openai
    sys.path.insert(0, str(REPO / "tests/server"))
    from harness import Server  # noqa: E402

    budgets = [int(b) for b in args.budgets.split(",")]
    lengths = [int(n) for n in args.niah_lengths.split(",")]
    srv = Server(str(args.model), "--ctx-size", str(max(lengths) + 256), "--sparse-attention", str(max(budgets)),
                 "--kv-memory", "1G", threads=args.threads)
    results = []
    try:
        client = srv.client(timeout=3600)
        model = client.models.list().data[0].id

        def tok(s: str) -> list[int]:
            status, _, body = srv.request("POST", "/tokenize", {"prompt": s, "add_special_tokens": False})
            assert status == 200, body
            return json.loads(body)["tokens"]

        hay = tok(text.read_text())
        rng = random.Random(args.seed)
        for L in lengths:
            for i in range(args.cases):
                depth = (10, 50, 90)[i % 3]
                number = rng.randrange(10000, 100000)
                needle = tok(f" The secret number of the blue door is {number}. ")
                question = tok("\n\nQuestion: What is the secret number of the blue door?\n"
                               "Answer: The secret number of the blue door is")
                n_hay = L - len(needle) - len(question) - 1
                start = rng.randrange(0, len(hay) - n_hay)
                h = hay[start:start + n_hay]
                at = n_hay * depth // 100
                prompt = [2] + h[:at] + needle + h[at:] + question  # 2: Gemma's BOS
                row = {"length": L, "depth": depth, "number": number}
                for b in [0] + budgets:
                    t0 = time.time()
                    r = client.completions.create(model=model, prompt=prompt, max_tokens=8, temperature=0,
                                                  extra_body={"sparse_attention": b})
                    ans = r.choices[0].text
                    digits = "".join(re.findall(r"\d", ans))[:5]
                    row[f"b{b}"] = {"answer": ans, "digits": digits, "right": digits == str(number),
                                    "seconds": round(time.time() - t0, 1)}
                log(json.dumps(row))
                results.append(row)
    finally:
        srv.stop()
    summary = {"cases": len(results), "dense_right": sum(r["b0"]["right"] for r in results)}
    for b in budgets:
        summary[f"b{b}_right"] = sum(r[f"b{b}"]["right"] for r in results)
        summary[f"b{b}_agrees"] = sum(r[f"b{b}"]["digits"] == r["b0"]["digits"] for r in results)
    return {"summary": summary, "cases": results}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=GEMMA)
    ap.add_argument("--tandem", type=Path, default=REPO / "build/tandem")
    ap.add_argument("--work", type=Path, default=Path("/tmp/sparse_quality"))
    ap.add_argument("--budgets", default="1024,2048")
    ap.add_argument("--ppl-ctx", type=int, default=8192)
    ap.add_argument("--ppl-chunks", type=int, default=2)
    ap.add_argument("--skip-ppl", action="store_true")
    ap.add_argument("--skip-niah", action="store_true")
    ap.add_argument("--niah-lengths", default="4096,8192,16384")
    ap.add_argument("--cases", type=int, default=10, help="needles per length (depths 10/50/90% in turn)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json-out", type=Path)
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    text = licenses_text(args.work)
    out: dict = {}
    if not args.skip_ppl:
        rows = {"dense": ppl(args, text, [])}
        log(f"dense {rows['dense']}")
        for b in [int(x) for x in args.budgets.split(",")]:
            for name, extra in [(f"sparse {b}", ["--sparse-attention", str(b)]),
                                (f"window {b}", ["--kv-window", str(b - 4), "--kv-sinks", "4"]),
                                (f"h2o {b}", ["--kv-window", str(b // 2 - 4), "--kv-sinks", "4", "--kv-heavy", str(b // 2)])]:
                rows[name] = ppl(args, text, extra)
                rows[name]["vs_dense"] = rows[name]["ppl"] / rows["dense"]["ppl"]
                log(f"{name} {rows[name]}")
        out["ppl"] = rows
    if not args.skip_niah:
        out["niah"] = niah(args, text)
        log(json.dumps(out["niah"]["summary"]))
    print(json.dumps(out, indent=1))
    if args.json_out:
        args.json_out.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

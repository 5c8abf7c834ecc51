#!/usr/bin/env python3
"""Speculative decoding, Tandem against llama.cpp's own server, on prompts where the
answer is grounded in the input (editing given code, quoting or extracting from a
given passage, JSON extraction) and on open-ended prose, greedy.

Every configuration is a server on loopback (the same model file, threads and
context on both sides), all started at once; each prompt goes to every
configuration in turn (the order rotating), one request at a time, through the
official `openai` client, streamed; a prompt's decode rate is its tokens after the
first over the time from the first streamed token to the last. A set's rate is its
total decode tokens over its total decode time. Configurations:

  tandem            tandem serve
  tandem ngram      tandem serve --spec ngram          (prompt lookup, adaptive draft length)
  tandem draft      tandem serve --spec draft --draft-model FILE   (with --draft-model)
  llama             llama-server
  llama ngram-*     llama-server --spec-type ngram-simple / ngram-map-k (llama.cpp's prompt lookup kinds;
                    ngram-simple also with a 3-token lookup), the best of them counts
  llama draft       llama-server -md FILE               (with --draft-model)

Tandem's outputs with speculation must equal its outputs without, byte for byte (checked
here on every prompt). llama-server is built once from the llama.cpp sources inside the
llama-cpp-python sdist (bench/serve_compare.py's ensure_llama_server).

With --serving, also: 16 concurrent clients on the grounded prompts, Tandem with and
without speculation: total output tok/s and the single stream's inter-token latency.

  bench/spec_compare.py --json out.json
  bench/spec_compare.py --draft-model gemma-q4_0.gguf -m gemma-bf16.gguf --only tandem,llama
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
HOME = Path(os.environ.get("HOME", "/root"))
DEFAULT_MODEL = HOME / ".cache/tandem/models/gemma-3-270m-q4_k_m.gguf"

# --- prompts --------------------------------------------------------------------

CODE = {
    "squares": '''def squares_of_evens(numbers):
    result = []
    for n in numbers:
        if n % 2 == 0:
            result.append(n * n)
    return result
''',
    "inventory": '''class Inventory:
    def __init__(self):
        self.items = {}

    def add(self, name, count):
        if name in self.items:
            self.items[name] += count
        else:
            self.items[name] = count

    def remove(self, name, count):
        if self.items.get(name, 0) < count:
            raise ValueError("not enough " + name)
        self.items[name] -= count
''',
    "parse": '''int parse_port(const char* text) {
    int value = 0;
    for (const char* p = text; *p; ++p) {
        if (*p < '0' || *p > '9') return -1;
        value = value * 10 + (*p - '0');
        if (value > 65535) return -1;
    }
    return value;
}
''',
    "fetch": '''async function fetchUser(id) {
  const response = await fetch("/api/users/" + id);
  if (!response.ok) {
    throw new Error("request failed: " + response.status);
  }
  const data = await response.json();
  return { id: data.id, name: data.name, email: data.email };
}
''',
    "stats": '''def mean_and_spread(values):
    total = 0
    for v in values:
        total += v
    mean = total / len(values)
    spread = 0
    for v in values:
        spread += (v - mean) ** 2
    return mean, (spread / len(values)) ** 0.5
''',
}

PASSAGES = {
    "lighthouse": ("The lighthouse on Gull Point was built in 1871 from granite quarried on the island itself. "
                   "Its first keeper, Thomas Wren, kept a log of every ship that passed for thirty-two years. "
                   "In 1924 the oil lamp was replaced by an electric light, and in 1968 the station was automated. "
                   "Today the keeper's house is a small museum that opens from May to September."),
    "bakery": ("Maria Lopez opened her bakery on Elm Street in 2009 with two ovens and a loan from her brother. "
               "She bakes sourdough every morning at four, and her cinnamon rolls sell out before nine. "
               "In 2015 she hired her first two employees, and in 2021 she opened a second shop near the train "
               "station. The bakery donates its unsold bread to the shelter on Harbor Road every evening."),
    "volcano": ("Mount Arden is a dormant volcano about 2,400 meters high. Its last eruption, in 1783, buried "
                "the village of Keld under ash and forced four hundred people to move to the coast. Scientists "
                "from the university measure the temperature of its crater lake every month. The lake has "
                "warmed by two degrees since 1990, but the scientists say an eruption is not expected soon."),
    "meeting": ("Minutes of the meeting on 3 March: Anna Berg opened the meeting at ten. The budget for the new "
                "library wing was approved at 1.2 million euros. Peter Holm reported that the roof repairs will "
                "finish in April. The committee agreed to hold the next meeting on 7 April at the town hall. "
                "The meeting closed at eleven thirty."),
}

RECORDS = [
    "Customer: Julia Chen. Order number: 48213. Items: two blue notebooks and one black pen. Total: 14.50 dollars. "
    "Shipping address: 12 Lake Road, Springfield. Delivery: express.",
    "Patient: Omar Haddad, age 57. Visit date: 2026-03-14. Blood pressure: 135 over 85. Medication: lisinopril "
    "10 mg daily. Next appointment: 2026-06-14.",
    "Flight TK 1842 from Istanbul to Berlin departs at 09:45 from gate B12. Passenger: Lena Vogel, seat 14C, "
    "one checked bag of 21 kilograms.",
    "Job posting: Senior data engineer at Northwind Analytics in Toronto. Salary range 120,000 to 145,000 "
    "dollars. Requirements: Python, SQL, five years of experience. Applications close on 30 June.",
]


def grounded_prompts() -> list[tuple[str, str]]:
    out = []
    for name, code in CODE.items():
        out.append((f"code-copy-{name}", f"Copy the following code exactly, adding a comment line above the first "
                    f"line.\n\n{code}\nThe code with the comment:\n\n# "))
        out.append((f"code-edit-{name}", f"Here is some code:\n\n{code}\nHere is the same code, unchanged except "
                    f"that every variable is explained by a comment:\n\n"))
    for name, text in PASSAGES.items():
        out.append((f"quote-{name}", f"Passage: {text}\n\nRepeat the passage word for word.\n\nPassage: "))
        out.append((f"extract-{name}", f"Passage: {text}\n\nList every sentence of the passage that contains a "
                    f"number, one per line, exactly as written.\n\n1. "))
        out.append((f"summary-{name}", f"Passage: {text}\n\nSummary of the passage, using its own words:\n\n"))
    for i, rec in enumerate(RECORDS):
        out.append((f"json-{i}", f"Text: {rec}\n\nThe same information as a JSON object with one field per "
                    f"fact, values copied from the text:\n\n{{\n  \""))
    return out


PROSE = [
    ("prose-village", "Once upon a time, in a small village at the edge of a great forest, there lived"),
    ("prose-printing", "The invention of the printing press changed the way people"),
    ("prose-ocean", "Standing on the deck of the ship, she looked out at the ocean and thought about"),
    ("prose-city", "The city woke up slowly that morning. The first to stir were"),
    ("prose-letter", "Dear Grandmother,\n\nI am writing to tell you about my first week at"),
    ("prose-garden", "Every spring my father planted a garden behind the house. He grew"),
    ("prose-robot", "The robot had been built to sort letters, but one day it began to"),
    ("prose-winter", "Winter came early that year, and the river froze before"),
]

# --- servers -------------------------------------------------------------------------


def log(msg: str) -> None:
    print(f"[spec_compare] {msg}", file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProc:
    def __init__(self, cmd: list[str], port: int, name: str):
        self.port, self.name = port, name
        self.log_path = Path(f"/tmp/spec_compare_{name.replace(' ', '_')}.log")
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=open(self.log_path, "wb"),
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + 300
        import urllib.request
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"{name} exited:\n{self.log_path.read_text(errors='replace')[-3000:]}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.2)
        self.stop()
        raise SystemExit(f"{name} did not become healthy")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)


def tandem_cmd(args, port: int, spec: list[str]) -> list[str]:
    return [str(args.tandem), "serve", "-m", str(args.model), "--host", "127.0.0.1", "--port", str(port),
            "-t", str(args.threads), "-c", str(args.ctx), "--max-seqs", str(args.max_seqs), *spec]


def llama_cmd(args, port: int, spec: list[str]) -> list[str]:
    return [str(args.llama_server), "-m", str(args.model), "--host", "127.0.0.1", "--port", str(port),
            "-t", str(args.threads), "-c", str(args.ctx * args.max_seqs), "-np", str(args.max_seqs),
            "--no-webui", *spec]


# --- clients ---------------------------------------------------------------------------


async def one(client, model: str, prompt: str, max_tokens: int) -> dict:
    t0 = time.perf_counter()
    first = last = None
    text, n_chunks, usage = "", 0, None
    stream = await client.completions.create(
        model=model, prompt=prompt, max_tokens=max_tokens, temperature=0, stream=True,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
    async for ch in stream:
        if ch.usage:
            usage = ch.usage
        if ch.choices and ch.choices[0].text:
            now = time.perf_counter()
            first = first or now
            last = now
            text += ch.choices[0].text
            n_chunks += 1
    tokens = usage.completion_tokens if usage else n_chunks
    return {"text": text, "tokens": tokens, "ttft": (first or t0) - t0, "decode_s": (last or t0) - (first or t0),
            "chunks": n_chunks}


async def sequential(base: str, prompts: list[tuple[str, str]], max_tokens: int) -> list[dict]:
    import openai
    # Closed inside the loop that opened it (asyncio.run closes the loop after).
    async with openai.AsyncOpenAI(base_url=base, api_key="none", max_retries=0, timeout=600) as client:
        model = (await client.models.list()).data[0].id
        out = []
        for name, p in prompts:
            r = await one(client, model, p, max_tokens)
            r["name"] = name
            out.append(r)
        return out


async def concurrent(base: str, prompts: list[tuple[str, str]], max_tokens: int, clients: int, requests: int) -> dict:
    import openai
    async with openai.AsyncOpenAI(base_url=base, api_key="none", max_retries=0, timeout=900) as client:
        model = (await client.models.list()).data[0].id
        queue = list(range(requests))
        results = []

        async def worker():
            while queue:
                i = queue.pop()
                results.append(await one(client, model, prompts[i % len(prompts)][1], max_tokens))

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(clients)))
        wall = time.perf_counter() - t0
    return {"tok_s": sum(r["tokens"] for r in results) / wall, "wall_s": wall, "requests": len(results)}


def rate(rs: list[dict]) -> float:
    tokens = sum(max(r["tokens"] - 1, 0) for r in rs)
    secs = sum(r["decode_s"] for r in rs)
    return tokens / secs if secs > 0 else 0.0


# --- driver ------------------------------------------------------------------------------


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", type=Path, default=DEFAULT_MODEL)
    ap.add_argument("--draft-model", type=Path, help="a draft model for the draft configurations")
    ap.add_argument("--tandem", type=Path, default=REPO / "build" / "tandem")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ctx", type=int, default=2048)
    ap.add_argument("--max-seqs", type=int, default=1)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--only", default="tandem,llama", help="sides: tandem, llama")
    ap.add_argument("--serving", action="store_true", help="also 16 concurrent clients, Tandem with and without")
    ap.add_argument("--serving-rounds", type=int, default=2, help="alternating rounds of the serving comparison")
    ap.add_argument("--serving-only", action="store_true", help="only the serving comparison (implies --serving)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    args.serving |= args.serving_only
    sides = set(args.only.split(",")) if not args.serving_only else {"tandem"}
    if "llama" in sides:
        sys.path.insert(0, str(HERE))
        import serve_compare
        args.llama_server = serve_compare.ensure_llama_server(HERE / ".llama-server")

    sets = {"grounded": grounded_prompts(), "prose": PROSE}
    configs = []
    if "tandem" in sides:
        configs += [("tandem", "tandem", []), ("tandem ngram", "tandem", ["--spec", "ngram"])]
        if args.draft_model:
            configs.append(("tandem draft", "tandem", ["--spec", "draft", "--draft-model", str(args.draft_model)]))
    if "llama" in sides:
        configs += [("llama", "llama", []),
                    ("llama ngram-simple", "llama", ["--spec-type", "ngram-simple"]),
                    ("llama ngram-simple n=3", "llama", ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "3"]),
                    ("llama ngram-map-k", "llama", ["--spec-type", "ngram-map-k"])]
        if args.draft_model:
            configs.append(("llama draft", "llama", ["-md", str(args.draft_model)]))

    report = {"model": str(args.model), "draft_model": str(args.draft_model) if args.draft_model else None,
              "threads": args.threads, "max_tokens": args.max_tokens, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "results": {}}
    # Every server up at once (an idle one takes no CPU), then each prompt goes to
    # every configuration in turn, the order rotating from prompt to prompt: on a
    # shared machine, what the others do then weighs on every configuration alike.
    servers = {}
    if args.serving_only:
        configs = []
    try:
        for name, side, spec in configs:
            port = free_port()
            cmd = tandem_cmd(args, port, spec) if side == "tandem" else llama_cmd(args, port, spec)
            log(f"{name}: {' '.join(cmd)}")
            servers[name] = (ServerProc(cmd, port, name), f"http://127.0.0.1:{port}/v1")
            asyncio.run(sequential(servers[name][1], sets["grounded"][:2], 16))  # warm-up
        res = {name: {k: [] for k in sets} for name in servers}
        names = list(servers)
        for k, ps in sets.items():
            for i, prompt in enumerate(ps):
                for j in range(len(names)):
                    name = names[(i + j) % len(names)]
                    res[name][k] += asyncio.run(sequential(servers[name][1], [prompt], args.max_tokens))
        for name in names:
            report["results"][name] = {k: {"tok_s": rate(v), "per_prompt": v} for k, v in res[name].items()}
            log(f"{name}: " + ", ".join(f"{k} {rate(v):.1f} tok/s" for k, v in res[name].items()))
    finally:
        for srv, _ in servers.values():
            srv.stop()

    # Tandem's speculation must not change a byte.
    if "tandem" in sides and not args.serving_only:
        plain = report["results"]["tandem"]
        for name in [c[0] for c in configs if c[1] == "tandem" and c[0] != "tandem"]:
            for k in sets:
                for a, b in zip(plain[k]["per_prompt"], report["results"][name][k]["per_prompt"]):
                    if a["text"] != b["text"]:
                        raise SystemExit(f"{name}: the output of {a['name']} differs from plain decoding")
        log("tandem: every output with speculation equals plain decoding's")

    if args.serving and "tandem" in sides:
        # Both servers up; two rounds each, alternating, so the machine's moods fall on both.
        serving = {}
        procs = {}
        try:
            for name, spec in (("tandem", []), ("tandem ngram", ["--spec", "ngram"])):
                port = free_port()
                margs = argparse.Namespace(**{**vars(args), "max_seqs": 16})
                procs[name] = (ServerProc(tandem_cmd(margs, port, spec), port, name + " serving"),
                               f"http://127.0.0.1:{port}/v1")
            rounds = {name: [] for name in procs}
            for r in range(args.serving_rounds):
                for name in (list(procs) if r % 2 == 0 else list(procs)[::-1]):
                    base = procs[name][1]
                    single = asyncio.run(sequential(base, sets["grounded"][:6], args.max_tokens))
                    many = asyncio.run(concurrent(base, sets["grounded"], args.max_tokens, 16, 48))
                    itl = statistics.median(x["decode_s"] / max(x["tokens"] - 1, 1) for x in single)
                    rounds[name].append((many["tok_s"], 1000 * itl))
                    log(f"{name} serving round {r + 1}: 16 clients {many['tok_s']:.1f} tok/s, "
                        f"single stream ITL {1000 * itl:.2f} ms")
            for name, rs in rounds.items():
                serving[name] = {"tok_s_16": statistics.mean(x[0] for x in rs),
                                 "single_itl_ms": statistics.mean(x[1] for x in rs), "rounds": rs}
        finally:
            for srv, _ in procs.values():
                srv.stop()
        report["serving"] = serving

    # The table.
    lines = ["| configuration | grounded tok/s | prose tok/s |", "|---|---|---|"]
    for name in report["results"]:
        r = report["results"][name]
        lines.append(f"| {name} | {r['grounded']['tok_s']:.1f} | {r['prose']['tok_s']:.1f} |")
    res = report["results"]
    if "tandem" in res and "tandem ngram" in res:
        g = res["tandem ngram"]["grounded"]["tok_s"] / res["tandem"]["grounded"]["tok_s"]
        p = res["tandem ngram"]["prose"]["tok_s"] / res["tandem"]["prose"]["tok_s"]
        lines.append(f"\ntandem ngram / tandem: grounded {g:.2f}x, prose {p:.3f}x")
        llama_ng = [n for n in res if n.startswith("llama ngram")]
        if llama_ng:
            best = max(llama_ng, key=lambda n: res[n]["grounded"]["tok_s"])
            lines.append(f"tandem ngram / best llama.cpp lookup ({best}): grounded "
                         f"{res['tandem ngram']['grounded']['tok_s'] / res[best]['grounded']['tok_s']:.2f}x")
    if "serving" in report:
        s = report["serving"]
        lines.append(f"serving, 16 clients: {s['tandem']['tok_s_16']:.1f} -> {s['tandem ngram']['tok_s_16']:.1f} tok/s; "
                     f"single stream ITL {s['tandem']['single_itl_ms']:.2f} -> {s['tandem ngram']['single_itl_ms']:.2f} ms")
    print("\n".join(lines))
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

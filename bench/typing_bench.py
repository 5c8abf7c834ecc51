#!/usr/bin/env python3
"""Progressive prefill: a long message typed at a person's pace, prefilled in the
pauses (/v1/prefill under a session, as the web page does), then sent.

Reported: the time from Enter to the first streamed token (TTFT) against the same
message sent cold (no session, prefix cache of a fresh server), and against one
decode step (the answer's median inter-token time); meanwhile K other users decode
long answers, and their time per output token (p50, p99) is compared with the same
users alone and with the latency policy's bound (--step-factor times their own
decode step).

  bench/typing_bench.py --tokens 2000 --cps 5           # as the issue states it (about 25 minutes)
  bench/typing_bench.py --tokens 2000 --cps 100 --json out.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
MODEL = Path(os.environ.get("HOME", "/root")) / ".cache/tandem/models/gemma-3-270m-q4_k_m.gguf"

PARAGRAPHS = [
    "The old harbour town had grown around a single stone quay, where fishing boats unloaded their catch every "
    "morning before the sun rose over the cliffs. ",
    "Over the years the quay was lengthened twice, first for the steamships that carried coal along the coast and "
    "later for the ferries that brought visitors in the summer months. ",
    "The town council kept careful records of every change, and the archive in the basement of the town hall still "
    "holds the drawings of the engineers who designed the new walls. ",
    "Many families have lived here for generations, and their names appear again and again in the parish books, "
    "the ship registers and the lists of those who served in the lifeboat crew. ",
]


def text_of(n_chars: int) -> str:
    out, i = "", 0
    while len(out) < n_chars:
        out += PARAGRAPHS[i % len(PARAGRAPHS)]
        i += 1
    return out[:n_chars]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(args) -> tuple[subprocess.Popen, str]:
    port = free_port()
    cmd = [str(args.tandem), "serve", "-m", str(args.model), "--port", str(port), "-t", str(args.threads),
           "-c", str(args.ctx), "--max-seqs", "8"]
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(base + "/health", timeout=2):
                return p, base
        except OSError:
            time.sleep(0.2)
    raise SystemExit("the server did not start")


def stop(p: subprocess.Popen) -> None:
    os.killpg(p.pid, signal.SIGTERM)
    p.wait(30)


async def stream(client, model, messages, max_tokens, session=None):
    t0 = time.perf_counter()
    times = []
    timings = None
    extra = {"session": session} if session else {}
    s = await client.chat.completions.create(model=model, messages=messages, max_tokens=max_tokens, temperature=0,
                                             stream=True, extra_body={"ignore_eos": True, "timings": True, **extra})
    async for ch in s:
        if ch.choices and ch.choices[0].delta.content:
            times.append(time.perf_counter())
        timings = (ch.model_extra or {}).get("timings") or timings
    return {"ttft": times[0] - t0 if times else None,
            "itl": [b - a for a, b in zip(times, times[1:])], "timings": timings}


async def background(client, model, k, stop_event, max_tokens):
    tpots = []

    async def user(i):
        while not stop_event.is_set():
            r = await stream(client, model, [{"role": "user", "content": f"Tell a long story number {i}."}], max_tokens)
            tpots.extend(r["itl"])

    tasks = [asyncio.create_task(user(i)) for i in range(k)]
    await stop_event.wait()
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return tpots


def users_main(base, model, k, max_tokens, stop, out):
    import openai

    async def main():
        async with openai.AsyncOpenAI(base_url=base + "/v1", api_key="none", max_retries=0, timeout=900) as client:
            ev = asyncio.Event()

            async def watch():
                while not stop.is_set():
                    await asyncio.sleep(0.05)
                ev.set()

            watcher = asyncio.create_task(watch())
            tpots = await background(client, model, k, ev, max_tokens)
            await watcher
            return tpots

    out.put(asyncio.run(main()))


class OtherUsers:
    """K users streaming answers from a process of their own, as other people's
    clients would: parsing their streams must not delay the measured client."""

    def __init__(self, base, model, k, max_tokens):
        ctx = multiprocessing.get_context("spawn")
        self.stop, self.out = ctx.Event(), ctx.Queue()
        self.proc = ctx.Process(target=users_main, args=(base, model, k, max_tokens, self.stop, self.out))
        self.proc.start()

    def finish(self) -> list:
        self.stop.set()
        tpots = self.out.get(timeout=600)
        self.proc.join(60)
        return tpots


async def prefill(base, session, messages):
    loop = asyncio.get_running_loop()

    def post():
        req = urllib.request.Request(base + "/v1/prefill", data=json.dumps({"messages": messages, "session": session}).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=600) as r:
            return json.loads(r.read())

    return await loop.run_in_executor(None, post)


async def run(args) -> dict:
    import openai
    text = text_of(args.chars)
    proc, base = start(args)
    try:
        client = openai.AsyncOpenAI(base_url=base + "/v1", api_key="none", max_retries=0, timeout=900)
        model = (await client.models.list()).data[0].id
        msgs = lambda t: [{"role": "user", "content": t}]
        # The typing user's client streams once first (its first request pays
        # for imports and a connection, which a page open in a browser has paid).
        await stream(client, model, msgs("Hello."), 2)
        # The other users alone, for their own decode step.
        users = OtherUsers(base, model, args.users, 64)
        await asyncio.sleep(args.alone_s)
        alone = users.finish()
        # Typing, with a few edits, prefilled after every pause; the users decode meanwhile.
        users = OtherUsers(base, model, args.users, 64)
        session = "typing-bench"
        typed, prefills, edits = "", [], 0
        step = max(1, int(args.cps * args.pause_s))  # characters between pauses
        t_start = time.perf_counter()
        while len(typed) < len(text):
            nxt = text[len(typed):len(typed) + step]
            typed += nxt
            if len(typed) % (step * 40) < step and len(typed) > step * 2:
                # Now and then a typo, prefilled before it is corrected: the
                # next prefill rolls the session back to where they part.
                prefills.append(await prefill(base, session, msgs(typed[:-5] + "xxxxx")))
                edits += 1
            target = t_start + len(typed) / args.cps
            await asyncio.sleep(max(0.0, target - time.perf_counter()))
            prefills.append(await prefill(base, session, msgs(typed)))
        typing_s = time.perf_counter() - t_start
        warm = await stream(client, model, msgs(text), args.answer_tokens, session=session)
        busy = users.finish()
        # The same message cold, on a fresh server.
    finally:
        stop(proc)
    proc, base = start(args)
    try:
        client = openai.AsyncOpenAI(base_url=base + "/v1", api_key="none", max_retries=0, timeout=900)
        cold = await stream(client, model, msgs(text), args.answer_tokens)
    finally:
        stop(proc)
    step_s = statistics.median(warm["itl"])
    q = lambda v, p: sorted(v)[min(len(v) - 1, int(p * len(v)))]
    return {
        "chars": len(text), "prompt_tokens": prefills[-1]["prompt_tokens"], "cps": args.cps, "typing_s": typing_s,
        "prefills": len(prefills), "edits": edits,
        "computed_per_prefill_median": statistics.median(p["computed_tokens"] for p in prefills),
        "ttft_warm_ms": 1000 * warm["ttft"], "ttft_cold_ms": 1000 * cold["ttft"], "decode_step_ms": 1000 * step_s,
        # The server's own account of the message sent after typing: its
        # time to first token and the prompt tokens it computed.
        "server_ttft_warm_ms": (warm["timings"] or {}).get("ttft_ms"),
        "computed_at_enter": (warm["timings"] or {}).get("prompt_n"),
        "ttft_over_step": warm["ttft"] / step_s,
        "users": args.users, "users_tpot_alone_p50_ms": 1000 * q(alone, 0.5), "users_tpot_alone_p99_ms": 1000 * q(alone, 0.99),
        "users_tpot_typing_p50_ms": 1000 * q(busy, 0.5), "users_tpot_typing_p99_ms": 1000 * q(busy, 0.99),
        "bound_ms": 1000 * args.step_factor * q(alone, 0.5),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", type=Path, default=MODEL)
    ap.add_argument("--tandem", type=Path, default=REPO / "build" / "tandem")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--tokens", type=int, default=2000, help="about this many tokens of message")
    ap.add_argument("--cps", type=float, default=5.0, help="characters typed per second")
    ap.add_argument("--pause-s", type=float, default=2.0, help="a pause (and a prefill) every this much typing")
    ap.add_argument("--users", type=int, default=4)
    ap.add_argument("--alone-s", type=float, default=20.0)
    ap.add_argument("--answer-tokens", type=int, default=32)
    ap.add_argument("--step-factor", type=float, default=1.5, help="the server's --step-factor")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    args.chars = int(args.tokens * 4.4)
    r = asyncio.run(run(args))
    print(json.dumps(r, indent=1))
    if args.json:
        args.json.write_text(json.dumps(r, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

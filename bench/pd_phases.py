#!/usr/bin/env python3
"""Where the decode instance's slow steps come from, while prompts arrive (the setup of
bench/pd_bench.py's "pd" layout: a prefill instance on core 0, a decode instance on core 1).

Streams 4 chats on the decode instance; after a second alone, long prompts go through the
prefill/decode pair one after another. Every gap between a chat's tokens is labelled with the
phase the arriving prompt was in when the gap ended: "alone" (before the first prompt),
"prefilling" (the prefill instance computes it; nothing of it is on the decode instance yet),
"fetching" (the decode instance has the request: fetch, import, its tail), "decoding" (its tokens
stream). Prints each phase's gaps and which phases the worst 1% fell in.

    .venv/bin/python bench/pd_phases.py [--kv-fetch-share 0.1]
"""
import argparse
import http.client
import json
import random
import sys
import threading
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import pd_bench as B  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", default=str(Path.home() / ".cache/tandem/models/gemma-3-270m-q4_k_m.gguf"))
    ap.add_argument("--chat-tokens", type=int, default=768)
    ap.add_argument("--kv-fetch-share", default=None)
    args = ap.parse_args()
    rng = random.Random(3)
    p = B.Server(args.model, "0", 1, "--role", "prefill")
    d = B.Server(args.model, "1", 1, "--role", "decode",
                 *(["--kv-fetch-share", args.kv_fetch_share] if args.kv_fetch_share else []))
    events, gaps = [], []  # (time, phase) and (time, gap)

    def chat(i):
        body = {"prompt": f"Chat {i}: tell me a story.", "max_tokens": args.chat_tokens, "temperature": 0,
                "stream": True, "ignore_eos": True}
        c = http.client.HTTPConnection("127.0.0.1", d.port, timeout=600)
        c.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
        last = None
        for raw in c.getresponse():
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            now = time.perf_counter()
            if last is not None:
                gaps.append((now, now - last))
            last = now

    try:
        ts = [threading.Thread(target=chat, args=(i,)) for i in range(4)]
        for t in ts:
            t.start()
        time.sleep(1.0)
        while any(t.is_alive() for t in ts):
            prompt = B.long_prompt(1480, rng)
            events.append((time.perf_counter(), "prefilling"))
            kt = p.post("/v1/completions", {"prompt": prompt, "max_tokens": 1, "temperature": 0,
                                            "kv_transfer_params": {"do_remote_decode": True}})["kv_transfer_params"]
            events.append((time.perf_counter(), "fetching"))
            body = {"prompt": prompt, "max_tokens": 16, "temperature": 0, "stream": True, "kv_transfer_params": kt}
            c = http.client.HTTPConnection("127.0.0.1", d.port, timeout=600)
            c.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
            first = True
            for raw in c.getresponse():
                line = raw.decode().strip()
                if first and line.startswith("data: ") and line != "data: [DONE]":
                    events.append((time.perf_counter(), "decoding"))
                    first = False
        for t in ts:
            t.join()
    finally:
        p.stop()
        d.stop()

    def phase(t):
        last = "alone"
        for et, w in events:
            if et <= t:
                last = w
        return last

    print(f"# {open('/proc/cpuinfo').read().split('model name')[1].split(':')[1].splitlines()[0].strip()}")
    print("| phase | gaps | p50 (ms) | p90 | p99 | of the worst 1% of all gaps |")
    print("|---|---|---|---|---|---|")
    worst = Counter(phase(t) for t, _ in sorted(gaps, key=lambda x: -x[1])[:len(gaps) // 100 + 1])
    for ph in ("alone", "prefilling", "fetching", "decoding"):
        xs = sorted(x for t, x in gaps if phase(t) == ph)
        if xs:
            print(f"| {ph} | {len(xs)} | {B.pctl(xs, .5):.1f} | {B.pctl(xs, .9):.1f} | {B.pctl(xs, .99):.1f} | "
                  f"{worst.get(ph, 0)} |")


if __name__ == "__main__":
    main()

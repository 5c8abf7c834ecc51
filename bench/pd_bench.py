#!/usr/bin/env python3
"""Prefill/decode disaggregation on two cores, against the colocated server.

Layout "pd": a prefill instance on core 0 and a decode instance on core 1
(`taskset`, one thread each); each long prompt goes as vllm-router's
prefill/decode mode sends it (the prefill request with max_tokens 1 and
kv_transfer_params, then the request with the prefill's answer to the decode
instance), done here by the script so that no router process shares the two
cores. Layout "colocated": one `--role both` server on both cores (two threads).

In each layout: `--chats` streams decode `--chat-tokens` tokens each, first
alone, then while long prompts (`--prompt-tokens`, new text each time, so no
prefix hits) arrive one after another with max_tokens `--prompt-max-tokens`.
Prints the chats' TPOT p50/p99 alone and under the prompts, their ratio, the
prompts' TTFT and the tokens per second of both kinds. Then the transfer cost:
ms and MB per 1,000 prompt tokens for each --kv-type, next to the prefill
time it saves (the same prompt computed cold on one core).

    .venv/bin/python bench/pd_bench.py [-m MODEL] [--rounds 3] [--kv-types f16,q8_0]
"""
import argparse
import http.client
import json
import os
import random
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CLI = os.environ.get("TANDEM_CLI") or str(REPO / "build" / "tandem")
WORDS = ("river mountain garden window story music market winter island forest silver engine letter "
         "journey harbor candle bridge meadow thunder lantern orchard compass velvet canyon").split()


class Server:
    def __init__(self, model, cores, threads, *args):
        self.log = tempfile.NamedTemporaryFile(prefix="pd-bench-", suffix=".log", delete=False)
        cmd = ["taskset", "-c", cores, CLI, "serve", "-m", model, "--host", "127.0.0.1", "--port", "0", "-t",
               str(threads), *args]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=self.log, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            m = re.search(r"on http://127\.0\.0\.1:(\d+)", Path(self.log.name).read_text(errors="replace"))
            if m:
                self.port = int(m.group(1))
                return
            if self.proc.poll() is not None:
                sys.exit(f"tandem serve exited:\n{Path(self.log.name).read_text()}")
            time.sleep(0.1)
        sys.exit("tandem serve did not start")

    def post(self, path, body, timeout=600):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        c.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        r = c.getresponse()
        data = r.read()
        if r.status != 200:
            raise RuntimeError(f"{path}: {r.status} {data[:300]!r}")
        return json.loads(data)

    def metrics(self):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        c.request("GET", "/metrics")
        out = {}
        for line in c.getresponse().read().decode().splitlines():
            if line and not line.startswith("#"):
                k, _, v = line.rpartition(" ")
                try:
                    out[k] = float(v)
                except ValueError:
                    pass
        return out

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        Path(self.log.name).unlink(missing_ok=True)


def long_prompt(n_words, rng):
    return "Here is a list of words: " + " ".join(rng.choice(WORDS) for _ in range(n_words)) + ". Summarize it."


def stream_chat(server, prompt, tokens, gaps, kt=None):
    """Streams a completion; appends the gaps between tokens (s) to `gaps`."""
    body = {"prompt": prompt, "max_tokens": tokens, "temperature": 0, "stream": True, "ignore_eos": True}
    c = http.client.HTTPConnection("127.0.0.1", server.port, timeout=600)
    c.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    last = None
    for raw in r:
        line = raw.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        now = time.perf_counter()
        if last is not None:
            gaps.append(now - last)
        last = now


def pd_request(prefill, decode, prompt, max_tokens):
    """What vllm-router's PD mode sends; returns (ttft s, tokens). The first
    token counted is the decode instance's, the one the router streams to the
    client: prefill, fetch and the first decode step."""
    t0 = time.perf_counter()
    kt = prefill.post("/v1/completions", {
        "prompt": prompt, "max_tokens": 1, "temperature": 0,
        "kv_transfer_params": {"do_remote_decode": True}})["kv_transfer_params"]
    return one_request(decode, prompt, max_tokens, t0, {"kv_transfer_params": kt})


def one_request(server, prompt, max_tokens, t0=None, extra=None):
    t0 = time.perf_counter() if t0 is None else t0
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True, **(extra or {})}
    c = http.client.HTTPConnection("127.0.0.1", server.port, timeout=600)
    c.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    ttft, n = None, 0
    for raw in c.getresponse():
        line = raw.decode().strip()
        if line.startswith("data: ") and line != "data: [DONE]":
            n += 1
            if ttft is None:
                ttft = time.perf_counter() - t0
    return ttft, n


def pctl(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] * 1000 if xs else float("nan")


def run_layout(name, chat_server, send_prompt, args, rng):
    """(alone gaps, loaded gaps, prompt ttfts, tokens in the loaded phase, seconds)."""
    def chats(gaps):
        ts = [threading.Thread(target=stream_chat, args=(chat_server, f"Chat {i}: tell me a story about a "
                                                         f"{rng.choice(WORDS)}.", args.chat_tokens, gaps))
              for i in range(args.chats)]
        for t in ts:
            t.start()
        return ts

    alone = []
    for t in chats(alone):
        t.join()
    loaded, ttfts, prompt_tokens = [], [], [0]
    t0 = time.perf_counter()
    ts = chats(loaded)
    while any(t.is_alive() for t in ts):
        ttft, n = send_prompt(long_prompt(args.prompt_words, rng))
        ttfts.append(ttft)
        prompt_tokens[0] += n
    for t in ts:
        t.join()
    secs = time.perf_counter() - t0
    gen = len(loaded) + args.chats + prompt_tokens[0]
    return alone, loaded, ttfts, gen, secs


def transfer_cost(args, kv_type, rng):
    """(ms per 1k tokens fetch, MB per 1k tokens, ms per 1k tokens prefill saved)."""
    p = Server(args.model, "0", 1, "--role", "prefill", "--kv-type", kv_type)
    d = Server(args.model, "1", 1, "--role", "decode", "--kv-type", kv_type)
    rows = []
    try:
        for _ in range(args.rounds):
            prompt = long_prompt(args.prompt_words, rng)
            t0 = time.perf_counter()
            r = p.post("/v1/completions", {"prompt": prompt, "max_tokens": 1, "temperature": 0,
                                           "kv_transfer_params": {"do_remote_decode": True}})
            prefill_s = time.perf_counter() - t0
            n = r["usage"]["prompt_tokens"]
            before = d.metrics()
            d.post("/v1/completions", {"prompt": prompt, "max_tokens": 1, "temperature": 0,
                                       "kv_transfer_params": r["kv_transfer_params"]})
            after = d.metrics()
            fetch_s = after["tandem_kv_transfer_fetch_seconds_total"] - before["tandem_kv_transfer_fetch_seconds_total"]
            mb = (after["tandem_kv_transfer_received_bytes_total"] -
                  before["tandem_kv_transfer_received_bytes_total"]) / 1e6
            import_s = (after["tandem_kv_transfer_import_seconds_total"] -
                        before["tandem_kv_transfer_import_seconds_total"])
            rows.append((fetch_s * 1e6 / n, import_s * 1e6 / n, mb * 1000 / n, prefill_s * 1e6 / n, n))
    finally:
        p.stop()
        d.stop()
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", default=str(Path.home() / ".cache/tandem/models/gemma-3-270m-q4_k_m.gguf"))
    ap.add_argument("--rounds", type=int, default=3, help="each layout this many times, alternating")
    ap.add_argument("--chats", type=int, default=4)
    ap.add_argument("--chat-tokens", type=int, default=768, help="long enough for several prompts to arrive")
    ap.add_argument("--prompt-words", type=int, default=1480, help="~1.5k tokens of Gemma 3's vocabulary")
    ap.add_argument("--prompt-max-tokens", type=int, default=16)
    ap.add_argument("--kv-types", default="f16,q8_0")
    ap.add_argument("--skip-layouts", action="store_true", help="only the transfer cost")
    ap.add_argument("--fetch-share", default=None, help="the decode instance's --kv-fetch-share")
    ap.add_argument("--layouts", default="pd,colocated", help="which layouts to run")
    args = ap.parse_args()
    rng = random.Random(7)
    print(f"# {open('/proc/cpuinfo').read().split('model name')[1].split(':')[1].splitlines()[0].strip()}; "
          f"load before: {os.getloadavg()[0]:.1f}")
    if not args.skip_layouts:
        res = {name: [] for name in args.layouts.split(",")}
        for r in range(args.rounds):
            for name in res:
                if name == "pd":
                    p = Server(args.model, "0", 1, "--role", "prefill")
                    d = Server(args.model, "1", 1, "--role", "decode",
                               *(["--kv-fetch-share", args.fetch_share] if args.fetch_share else []))
                    servers, chat_server = (p, d), d
                    send = lambda prompt: pd_request(p, d, prompt, args.prompt_max_tokens)  # noqa: E731
                else:
                    b = Server(args.model, "0,1", 2)
                    servers, chat_server = (b,), b
                    send = lambda prompt: one_request(b, prompt, args.prompt_max_tokens)  # noqa: E731
                try:
                    res[name].append(run_layout(name, chat_server, send, args, rng))
                finally:
                    for s in servers:
                        s.stop()
        print("| layout | chats' TPOT p50 alone (ms) | p99 alone | p50 with prompts | p99 with prompts | "
              "p99 ratio | prompts' TTFT median (ms) | prompts done | tokens/s out |")
        print("|---|---|---|---|---|---|---|---|---|")
        for name, runs in res.items():
            for alone, loaded, ttfts, gen, secs in runs:
                print(f"| {name} | {pctl(alone, .5):.1f} | {pctl(alone, .99):.1f} | {pctl(loaded, .5):.1f} | "
                      f"{pctl(loaded, .99):.1f} | {pctl(loaded, .99) / pctl(alone, .99):.2f}x | "
                      f"{statistics.median(ttfts) * 1000 if ttfts else float('nan'):.0f} | {len(ttfts)} | "
                      f"{gen / secs:.1f} |")
            if len(runs) > 1:  # every round's gaps together: the p99 of several thousand gaps
                alone = [g for r in runs for g in r[0]]
                loaded = [g for r in runs for g in r[1]]
                ttfts = [t for r in runs for t in r[2]]
                print(f"| {name}, {len(runs)} rounds pooled | {pctl(alone, .5):.1f} | {pctl(alone, .99):.1f} | "
                      f"{pctl(loaded, .5):.1f} | {pctl(loaded, .99):.1f} | "
                      f"**{pctl(loaded, .99) / pctl(alone, .99):.2f}x** | "
                      f"{statistics.median(ttfts) * 1000 if ttfts else float('nan'):.0f} | {len(ttfts)} | "
                      f"{sum(r[3] for r in runs) / sum(r[4] for r in runs):.1f} |")
    print()
    print("| KV type | prompt tokens | fetch ms / 1k tokens | then into the pool (engine thread) | MB / 1k tokens | "
          "prefill ms / 1k tokens (saved) |")
    print("|---|---|---|---|---|---|")
    for kv in filter(None, args.kv_types.split(",")):
        for ms, imp, mb, pre, n in transfer_cost(args, kv, rng):
            print(f"| {kv} | {n} | {ms:.1f} | {imp:.1f} | {mb:.2f} | {pre:.0f} |")
    print(f"# load after: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()

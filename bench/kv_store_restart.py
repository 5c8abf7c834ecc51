#!/usr/bin/env python3
"""A long prompt's first token after a restart on the same --kv-store: the
prompt served once by a fresh server (cold: its blocks computed and written),
the server stopped and started again on the folder, the same prompt again
(its blocks read back). Also, for scale, the same prompt on a server without
a store. Each round uses a fresh folder; TTFT is measured by the client, from
sending the streamed request to the first text. Prints medians and ranges.

    .venv/bin/python bench/kv_store_restart.py [-m MODEL] [--tokens 1700] [--rounds 3] [-t THREADS]
"""
import argparse
import http.client
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CLI = os.environ.get("TANDEM_CLI", str(REPO / "build" / "tandem"))
DEFAULT_MODEL = str(Path.home() / ".cache" / "tandem" / "models" / "gemma-3-270m-q4_k_m.gguf")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, model, threads, *args):
        self.port = free_port()
        self.log = tempfile.NamedTemporaryFile(prefix="kv-store-bench-", suffix=".log", delete=False)
        self.proc = subprocess.Popen([CLI, "serve", "-m", model, "--port", str(self.port), "-t", str(threads),
                                      "--ctx-size", "4096", "--model-alias", "m", *args],
                                     stdout=subprocess.DEVNULL, stderr=self.log, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                sys.exit(f"server exited with {self.proc.returncode}: {Path(self.log.name).read_text()}")
            try:
                c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=2)
                c.request("GET", "/health")
                if c.getresponse().status == 200:
                    return
            except OSError:
                pass
            time.sleep(0.1)
        sys.exit("server did not start")

    def metric(self, name):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        c.request("GET", "/metrics")
        for line in c.getresponse().read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
        return 0.0

    def cpu_s(self):
        """CPU seconds the server has used (user + system, every thread)."""
        f = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=60)
        os.unlink(self.log.name)


def first_token(port, prompt, max_tokens, server=None):
    """(TTFT seconds, the whole text, usage) of one streamed greedy completion;
    with `server`, also the CPU seconds it used until the first token."""
    body = json.dumps({"model": "m", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True,
                       "stream_options": {"include_usage": True}})
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    cpu0 = server.cpu_s() if server else 0
    cpu = None
    t0 = time.perf_counter()
    c.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    r = c.getresponse()
    ttft, text, usage = None, "", None
    for raw in r:
        line = raw.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        ev = json.loads(line[6:])
        if ev.get("usage"):
            usage = ev["usage"]
        for ch in ev.get("choices", []):
            if ch.get("text") and ttft is None:
                ttft = time.perf_counter() - t0
                cpu = server.cpu_s() - cpu0 if server else None
            text += ch.get("text", "")
    if server:
        first_token.cpu = cpu
    return ttft, text, usage


# The peer: llama.cpp (llama-cpp-python) saving its state after the prompt
# and, in a new process, loading it before the same prompt (what
# llama-server's slot files do). Prints the TTFT of both runs in seconds.
PEER = r"""
import pickle, sys, time
from llama_cpp import Llama
model, prompt, state, phase, threads = sys.argv[1], open(sys.argv[2]).read(), sys.argv[3], sys.argv[4], int(sys.argv[5])
llm = Llama(model_path=model, n_ctx=4096, n_threads=threads, n_batch=512, verbose=False)
t0 = time.perf_counter()
if phase == "load":
    with open(state, "rb") as f:
        llm.load_state(pickle.load(f))
out = llm.create_completion(prompt, max_tokens=1, temperature=0)
t = time.perf_counter() - t0
if phase == "save":
    with open(state, "wb") as f:
        pickle.dump(llm.save_state(), f)
print(t, out["choices"][0]["text"].encode().hex())
"""


def peer(python, model, prompt, threads):
    with tempfile.TemporaryDirectory() as d:
        pf, sf = Path(d) / "prompt.txt", Path(d) / "state.pkl"
        pf.write_text(prompt)
        res = []
        for phase in ("save", "load"):
            out = subprocess.run([python, "-c", PEER, model, str(pf), str(sf), phase, str(threads)],
                                 capture_output=True, text=True, check=True).stdout.split()
            res.append((float(out[0]), out[1]))
        return res


def make_prompt(tokens):
    # About 1.3 tokens a word on Gemma 3's vocabulary; the server reports the count.
    words = ("The river carried the small boat past fields of barley, old stone bridges and the mill "
             "where the miller's daughter counted sacks of flour each morning before dawn. ").split()
    out = []
    while len(out) < tokens * 0.87:
        out.extend(words)
    return " ".join(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("-m", "--model", default=DEFAULT_MODEL)
    ap.add_argument("--tokens", type=int, default=1700)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--peer", default="", help="a Python with llama-cpp-python: also time llama.cpp saving and "
                    "loading its state, alternating with Tandem")
    a = ap.parse_args()
    prompt = make_prompt(a.tokens)
    cold, warm, plain, capture, read, peer_cold, peer_warm = [], [], [], [], [], [], []
    cpu_plain, cpu_warm = [], []
    n_prompt = None
    for r in range(a.rounds):
        folder = tempfile.mkdtemp(prefix="kv-store-bench-")
        try:
            s = Server(a.model, a.threads)
            t, text_plain, usage = first_token(s.port, prompt, a.max_tokens, s)
            plain.append(t)
            cpu_plain.append(first_token.cpu)
            s.stop()

            s = Server(a.model, a.threads, "--kv-store", folder)
            t, text_cold, usage = first_token(s.port, prompt, a.max_tokens)
            n_prompt = usage["prompt_tokens"]
            cold.append(t)
            deadline = time.monotonic() + 60
            while s.metric("tandem_kv_store_blocks_written_total") < n_prompt // 16 and time.monotonic() < deadline:
                time.sleep(0.05)
            capture.append(s.metric("tandem_kv_store_capture_seconds_total"))
            s.stop()

            s = Server(a.model, a.threads, "--kv-store", folder)
            t, text_warm, usage = first_token(s.port, prompt, a.max_tokens, s)
            warm.append(t)
            cpu_warm.append(first_token.cpu)
            read.append(s.metric("tandem_kv_store_read_seconds_total"))
            cached = usage["prompt_tokens_details"]["cached_tokens"]
            s.stop()
            same = text_warm == text_cold == text_plain
            print(f"round {r + 1}: plain {plain[-1] * 1e3:.0f} ms, store cold {cold[-1] * 1e3:.0f} ms, "
                  f"after restart {warm[-1] * 1e3:.0f} ms (CPU {cpu_plain[-1] * 1e3:.0f} and {cpu_warm[-1] * 1e3:.0f} ms; {cached} of {n_prompt} tokens from the store, "
                  f"read {read[-1] * 1e3:.1f} ms; capture on the engine thread {capture[-1] * 1e3:.1f} ms); "
                  f"output identical: {same}", flush=True)
            if not same:
                sys.exit("outputs differ")
            if a.peer:
                (pc, tc), (pw, tw) = peer(a.peer, a.model, prompt, a.threads)
                peer_cold.append(pc)
                peer_warm.append(pw)
                print(f"  llama.cpp: cold {pc * 1e3:.0f} ms, state loaded {pw * 1e3:.0f} ms, same first token: "
                      f"{tc == tw}", flush=True)
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    def row(name, v):
        ms = [x * 1e3 for x in v]
        print(f"| {name} | {statistics.median(ms):.0f} | {min(ms):.0f}-{max(ms):.0f} |")

    print(f"\n{n_prompt}-token prompt, {a.rounds} rounds, TTFT (ms):\n")
    print("| server | median | range |\n|---|---|---|")
    row("no store", plain)
    row("--kv-store, first run (blocks written)", cold)
    row("--kv-store, after a restart", warm)
    row("  of which reading the store", read)
    row("  copying blocks out (engine thread, first run)", capture)
    if peer_cold:
        row("llama.cpp, cold (then save_state)", peer_cold)
        row("llama.cpp, load_state then the prompt", peer_warm)
    print("\nCPU time the server used until the first token (ms, every thread):\n")
    print("| server | median | range |\n|---|---|---|")
    row("no store", cpu_plain)
    row("--kv-store, after a restart", cpu_warm)


if __name__ == "__main__":
    main()

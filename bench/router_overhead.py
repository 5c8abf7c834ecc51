#!/usr/bin/env python3
"""What vllm-router adds to each request: the same small completions sent
straight to a `tandem serve` replica and through vllm-router in front of it,
alternating, one at a time. Prints a table of latencies (ms).

    .venv/bin/python bench/router_overhead.py [-m MODEL] [-n 200] [--policy cache_aware] [--max-tokens 1]
"""
import argparse
import http.client
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_health(port, proc, what, timeout=120):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"{what} exited with {proc.returncode}")
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            c.request("GET", "/health")
            if c.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.1)
    sys.exit(f"{what} did not answer /health")


def timed(conn, body):
    t0 = time.perf_counter()
    conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    r = conn.getresponse()
    r.read()
    assert r.status == 200, r.status
    return (time.perf_counter() - t0) * 1000


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", default=str(REPO.parent / "shared" / "models" / "gguf" / "stories260K.gguf"))
    ap.add_argument("-n", type=int, default=200, help="requests each way")
    ap.add_argument("--policy", default="cache_aware")
    ap.add_argument("--max-tokens", type=int, default=1)
    ap.add_argument("--tandem", default=os.environ.get("TANDEM_CLI", str(REPO / "build" / "tandem")))
    ap.add_argument("--router", default=os.environ.get("VLLM_ROUTER", str(REPO / ".venv" / "bin" / "vllm-router")))
    a = ap.parse_args()

    log = tempfile.TemporaryFile()
    serve = subprocess.Popen([a.tandem, "serve", "-m", a.model, "--port", "0", "-t", "1"], stderr=subprocess.PIPE,
                             text=True)
    line = serve.stderr.readline()
    m = re.search(r"on http://127\.0\.0\.1:(\d+)", line)
    if not m:
        sys.exit(f"tandem serve did not start: {line}")
    port = int(m.group(1))
    rport = free_port()
    router = subprocess.Popen([a.router, "--host", "127.0.0.1", "--port", str(rport), "--worker-urls",
                               f"http://127.0.0.1:{port}", "--policy", a.policy, "--prometheus-port",
                               str(free_port()), "--log-level", "warning"], stdout=log, stderr=log)
    try:
        wait_health(port, serve, "tandem serve")
        wait_health(rport, router, "vllm-router")
        body = json.dumps({"prompt": "Once upon a time", "max_tokens": a.max_tokens, "temperature": 0})
        direct = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        routed = http.client.HTTPConnection("127.0.0.1", rport, timeout=60)
        for _ in range(10):  # warm-up: connections, caches
            timed(direct, body)
            timed(routed, body)
        d, r = [], []
        for _ in range(a.n):  # alternating, so both see the same machine
            d.append(timed(direct, body))
            r.append(timed(routed, body))
        q = lambda xs, p: statistics.quantiles(xs, n=100)[p - 1]
        print(f"{a.n} requests each way, max_tokens {a.max_tokens}, policy {a.policy}, keep-alive connections")
        print(f"{'path':<22} {'median ms':>10} {'p90 ms':>10} {'p99 ms':>10}")
        print(f"{'tandem serve':<22} {statistics.median(d):>10.2f} {q(d, 90):>10.2f} {q(d, 99):>10.2f}")
        print(f"{'vllm-router -> tandem':<22} {statistics.median(r):>10.2f} {q(r, 90):>10.2f} {q(r, 99):>10.2f}")
        diffs = [y - x for x, y in zip(d, r)]
        print(f"{'router adds':<22} {statistics.median(diffs):>10.2f} {q(diffs, 90):>10.2f} {q(diffs, 99):>10.2f}")
    finally:
        router.send_signal(signal.SIGINT)
        serve.send_signal(signal.SIGTERM)
        router.wait(timeout=15)
        serve.wait(timeout=15)


if __name__ == "__main__":
    main()

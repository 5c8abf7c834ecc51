"""Helpers for driving `tandem serve` with real clients over loopback.

Servers are started from the built CLI (env TANDEM_CLI, default build/tandem)
on port 0; the port is read from the server's startup line. All traffic goes to
127.0.0.1 and every wait is bounded.
"""
import http.client
import json
import os
import re
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import openai
import pytest

REPO = Path(__file__).resolve().parents[2]
CLI = os.environ.get("TANDEM_CLI") or str(REPO / "build" / "tandem")
STORIES = str(REPO.parent / "shared" / "models" / "gguf" / "stories260K.gguf")
STARTUP_TIMEOUT_S = 120


def gemma_path():
    p = os.environ.get("TANDEM_GEMMA_MODEL")
    if p:
        return p
    p = Path.home() / ".cache" / "tandem" / "models" / "gemma-3-270m-q4_k_m.gguf"
    return str(p) if p.exists() else None


def require_gemma():
    """gemma_path(), else the test is skipped (failed on CI, where setup installs it)."""
    path = gemma_path()
    if path is None:
        if os.environ.get("CI") == "true":
            pytest.fail("Gemma 3 270M is not installed (scripts/setup.sh)")
        pytest.skip("Gemma 3 270M is not installed; run scripts/setup.sh")
    return path


class Server:
    """One `tandem serve` process on a free loopback port."""

    def __init__(self, model, *args, threads=1, port=0):
        if not Path(CLI).exists():
            pytest.fail(f"tandem CLI not found at {CLI} (build it or set TANDEM_CLI)")
        self.log = tempfile.NamedTemporaryFile(prefix="tandem-serve-", suffix=".log", delete=False)
        self._final_log = None
        cmd = [CLI, "serve", "-m", model, "--host", "127.0.0.1", "--port", str(port), "-t", str(threads), *args]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=self.log, stdin=subprocess.DEVNULL)
        self.port = self._wait_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self._wait_health()

    def log_text(self):
        if self._final_log is not None:
            return self._final_log
        return Path(self.log.name).read_text(errors="replace")

    def failure_log(self, size=8000):
        """The part of the log that explains a failure: a sanitizer's report, else the end."""
        t = self.log_text()
        for marker in ("WARNING: ThreadSanitizer", "ERROR: AddressSanitizer", "runtime error:"):
            i = t.find(marker)
            if i >= 0:
                return t[i:i + size]
        return t[-size:]

    def _release_log(self):
        """Once the process is gone, keep its log in memory and delete the file."""
        if self._final_log is None:
            self._final_log = self.log_text()
            self.log.close()
            Path(self.log.name).unlink(missing_ok=True)

    def _wait_port(self):
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while time.monotonic() < deadline:
            m = re.search(r"on http://127\.0\.0\.1:(\d+)", self.log_text())
            if m:
                return int(m.group(1))
            if self.proc.poll() is not None:
                self._release_log()
                pytest.fail(f"server exited with {self.proc.returncode}:\n{self.log_text()}")
            time.sleep(0.05)
        self.kill()
        pytest.fail(f"server did not start within {STARTUP_TIMEOUT_S} s:\n{self.log_text()}")

    def _wait_health(self):
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                status, _, _ = self.request("GET", "/health", timeout=2)
                if status == 200:
                    return
            except OSError:
                pass
            time.sleep(0.05)
        self.kill()
        pytest.fail("server never answered /health")

    def request(self, method, path, body=None, headers=None, timeout=60):
        """One raw HTTP request; returns (status, headers, body bytes)."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            h = dict(headers or {})
            data = None
            if body is not None:
                data = body if isinstance(body, (bytes, str)) else json.dumps(body)
                h.setdefault("Content-Type", "application/json")
            conn.request(method, path, body=data, headers=h)
            r = conn.getresponse()
            return r.status, dict(r.getheaders()), r.read()
        finally:
            conn.close()

    def client(self, api_key="unused", timeout=120):
        # No retries: a 429 or 5xx must surface, not be retried away.
        return openai.OpenAI(base_url=self.base + "/v1", api_key=api_key, timeout=timeout, max_retries=0)

    def metrics(self, headers=None):
        status, _, body = self.request("GET", "/metrics", headers=headers)
        assert status == 200, body
        return body.decode()

    def stop(self, timeout=30):
        """SIGTERM, then the exit status (a graceful shutdown exits 0)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.kill()
                pytest.fail(f"server ignored SIGTERM for {timeout} s:\n{self.log_text()}")
        self._release_log()
        return self.proc.returncode

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self._release_log()


def free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(model, *args, threads=1):
    return Server(model, *args, threads=threads)


def run_cli(*args, timeout=120):
    r = subprocess.run([CLI, *args], capture_output=True, timeout=timeout)
    assert r.returncode == 0, r.stderr.decode(errors="replace")
    return r.stdout.decode()


def parse_metrics(text):
    """{sample name with labels: value} via prometheus_client's parser."""
    from prometheus_client.parser import text_string_to_metric_families

    out = {}
    families = {}
    for fam in text_string_to_metric_families(text):
        families[fam.name] = fam.type
        for s in fam.samples:
            key = s.name + ("{" + ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items())) + "}"
                            if s.labels else "")
            out[key] = s.value
    return out, families


def wait_metrics(server, pred, timeout=15):
    """Polls /metrics until pred(samples) holds; returns the samples."""
    deadline = time.monotonic() + timeout
    samples = None
    while time.monotonic() < deadline:
        samples, _ = parse_metrics(server.metrics())
        if pred(samples):
            return samples
        time.sleep(0.05)
    raise AssertionError(f"metrics condition not met within {timeout} s: {samples}")

"""Replicas behind vllm-router on loopback: answers equal one server's, the
prefix cache keeps working across the cluster (cache_aware on the prompts'
text, kv_aware on the replicas' KV events), a replica that dies is routed
around and rejoins, and scripts/cluster.sh starts and stops a whole cluster."""
import json
import os
import re
import signal
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from harness import REPO, STORIES, Server, free_port, parse_metrics, require_gemma

ROUTER = os.environ.get("VLLM_ROUTER") or str(REPO / ".venv" / "bin" / "vllm-router")
ARTIFACTS = REPO / "build" / "test-artifacts"


@pytest.fixture(scope="module", autouse=True)
def need_router():
    if not Path(ROUTER).exists():
        if os.environ.get("CI") == "true":
            pytest.fail(f"vllm-router is not installed at {ROUTER} (scripts/setup.sh)")
        pytest.skip(f"vllm-router is not installed at {ROUTER}; run scripts/setup.sh")


class Router:
    """vllm-router in front of `urls`, checking health every second."""

    def __init__(self, urls, policy, *extra):
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log = open(os.devnull, "w") if os.environ.get("TANDEM_ROUTER_LOG") is None else open(
            os.environ["TANDEM_ROUTER_LOG"], "a")
        cmd = [ROUTER, "--host", "127.0.0.1", "--port", str(self.port), "--worker-urls", *urls,
               "--policy", policy, "--prometheus-port", str(free_port()), "--health-check-interval-secs", "1",
               "--health-failure-threshold", "1", "--health-success-threshold", "1", "--log-level", "warning",
               *extra]
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=self.log, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"vllm-router exited with {self.proc.returncode}"
            try:
                if self.get("/health")[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.1)
        self.stop()
        pytest.fail("vllm-router never answered /health")

    def get(self, path):
        import http.client
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        try:
            conn.request("GET", path)
            r = conn.getresponse()
            return r.status, r.read()
        finally:
            conn.close()

    def complete(self, prompt, max_tokens=12, timeout=120):
        """(status, text) of a greedy completion through the router."""
        import http.client
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            conn.request("POST", "/v1/completions",
                         json.dumps({"model": "stories260K.gguf", "prompt": prompt, "max_tokens": max_tokens,
                                     "temperature": 0}), {"Content-Type": "application/json"})
            r = conn.getresponse()
            body = r.read()
            return r.status, json.loads(body)["choices"][0]["text"] if r.status == 200 else body
        finally:
            conn.close()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.log.close()


# --- the workload: 24 conversations over 4 shared system prompts, 3 turns each

SYSTEMS = [
    "You are a storyteller for small children. Your stories are short, kind and happy, about animals, "
    "parks, toys and friends, and every story ends well for everyone in it.",
    "You tell bedtime stories. The stories are slow and calm, set in a quiet house at night, with a cat, "
    "a dog and a little boy who cannot sleep until the moon comes out.",
    "You write stories for a school book. Each story teaches something simple: sharing toys, saying sorry, "
    "helping mom in the kitchen, or being brave at the doctor.",
    "You are a friendly robot who tells stories about the sea. There are fish, boats, big waves, a lighthouse "
    "and a girl named Sue who loves to swim with her dad in the summer.",
]
ASKS = ["a red ball", "a big tree", "a lost shoe", "a funny hat", "a small bird", "a rainy day"]
TURNS = ["Tell me a story about {}.", "What happened next?", "How did it end?"]


def conversations():
    return [(SYSTEMS[k % 4], ASKS[k // 4]) for k in range(24)]


def run_workload(complete, clients=4):
    """Every conversation's answers, turn by turn; conversations run `clients` at a time."""
    def one(conv):
        system, ask = conv
        history, answers = system, []
        for turn in TURNS:
            prompt = f"{history}\nUser: {turn.format(ask)}\nAssistant:"
            status, text = complete(prompt)
            assert status == 200, text
            answers.append(text)
            history = prompt + text
        return answers

    with ThreadPoolExecutor(clients) as pool:
        return list(pool.map(one, conversations()))


def hit_ratio(servers):
    hits = queries = 0
    for s in servers:
        m, _ = parse_metrics(s.metrics())
        hits += m["tandem_prefix_cache_hit_tokens_total"]
        queries += m["tandem_prefix_cache_queried_tokens_total"]
    return hits / queries


def replicas(n, *args, ports=None):
    return [Server(STORIES, *args, port=(ports[i] if ports else 0)) for i in range(n)]


def direct_complete(server):
    def complete(prompt):
        status, _, body = server.request("POST", "/v1/completions",
                                         {"prompt": prompt, "max_tokens": 12, "temperature": 0})
        return status, json.loads(body)["choices"][0]["text"] if status == 200 else body
    return complete


def test_cluster_matches_one_server_and_keeps_its_cache():
    single = Server(STORIES)
    try:
        want = run_workload(direct_complete(single))
        single_ratio = hit_ratio([single])
    finally:
        assert single.stop() == 0, single.failure_log()
    report = {"single_server": single_ratio}
    for policy in ["cache_aware", "kv_aware", "round_robin"]:
        kv = ["--kv-events", "tcp://127.0.0.1:*"] if policy == "kv_aware" else []
        reps = replicas(3, *kv)
        extra = []
        if policy == "kv_aware":
            for r in reps:
                ep = re.search(r"KV events on (tcp://[0-9.:]+)", r.log_text()).group(1)
                extra += ["--kv-event-source", f"{r.base}={ep}"]
            extra += ["--kv-event-model", "stories260K.gguf"]
        router = Router([r.base for r in reps], policy, *extra)
        try:
            got = run_workload(router.complete)
            assert got == want, f"{policy}: answers differ from one server's"
            report[policy] = hit_ratio(reps)
            report[policy + "_requests_per_replica"] = [
                parse_metrics(r.metrics())[0]["tandem_requests_finished_total"] for r in reps]
        finally:
            router.stop()
            for r in reps:
                assert r.stop() == 0, r.failure_log()
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / "cluster_hit_ratio.json").write_text(json.dumps(report, indent=2))
    print("prefix-cache hit ratio:", report)
    # The bar is cache_aware's; kv_aware and round_robin are reported
    # (kv_aware hears of a turn's blocks a moment after its answer, so a
    # quick next turn can miss them).
    assert report["cache_aware"] >= 0.9 * single_ratio, report


def test_a_dead_replica_is_routed_around_and_rejoins():
    ports = [free_port() for _ in range(3)]
    reps = replicas(3, ports=ports)
    router = Router([r.base for r in reps], "round_robin")
    stop = threading.Event()
    results = []  # (start time, end time, status)
    lock = threading.Lock()

    def client(k):
        i = 0
        while not stop.is_set():
            t0 = time.monotonic()
            try:
                status, _ = router.complete(f"Once upon a time, client {k} asked for story {i}:", max_tokens=8,
                                            timeout=60)
            except OSError:
                status = -1
            with lock:
                results.append((t0, time.monotonic(), status))
            i += 1

    threads = [threading.Thread(target=client, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    try:
        def wait_requests(n, timeout=60):
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                with lock:
                    if len(results) >= n:
                        return
                time.sleep(0.05)
            raise AssertionError("the clients stalled")

        wait_requests(20)
        reps[1].kill()  # SIGKILL: whatever it was running is lost
        killed_at = time.monotonic()
        with lock:
            base = len(results)
        wait_requests(base + 30)
        # Back on the same port; the router's health check lets it in again.
        reps[1] = Server(STORIES, port=ports[1])
        deadline = time.monotonic() + 60
        while parse_metrics(reps[1].metrics())[0]["tandem_requests_finished_total"] < 3:
            assert time.monotonic() < deadline, "the restarted replica never got requests"
            time.sleep(0.1)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=120)
        router.stop()
        for r in reps:
            r.stop()
    failed = [(t0, t1, s) for t0, t1, s in results if s != 200]
    # Only requests already running when the replica died may fail: at most
    # one per client, each started before the kill.
    assert len(failed) <= 3, failed
    assert all(t0 <= killed_at for t0, _, _ in failed), failed
    ok_after = [s for t0, _, s in results if t0 > killed_at + 0.5]
    assert ok_after and all(s == 200 for s in ok_after)


@pytest.mark.parametrize("policy", ["cache_aware"])
def test_cluster_script_serves_completions_and_chat(policy):
    """scripts/cluster.sh as a user runs it: the openai client, chat streaming
    included, through the router; Ctrl-C stops every process it started."""
    import openai
    model = require_gemma()
    env = dict(os.environ, TANDEM_CLI=os.environ.get("TANDEM_CLI", str(REPO / "build" / "tandem")),
               VLLM_ROUTER=ROUTER)
    # Ctrl-C as a terminal delivers it: a suite started in the background
    # (nohup, `&` without job control) hands its children SIGINT ignored,
    # and a shell cannot trap a signal it was started ignoring.
    proc = subprocess.Popen([str(REPO / "scripts" / "cluster.sh"), "-m", model, "--replicas", "2", "--policy",
                             policy, "--", "-t", "1", "--ctx-size", "1024"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env, text=True, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        line = proc.stdout.readline()  # blocks until the cluster is up (or the script ends)
        m = re.match(r"router: (http://127\.0\.0\.1:\d+)$", line.strip())
        assert m, f"no router line: {line!r}\n{proc.stderr.read() if proc.poll() is not None else ''}"
        client = openai.OpenAI(base_url=m.group(1) + "/v1", api_key="unused", timeout=120, max_retries=0)
        model_id = client.models.list().data[0].id
        done = client.completions.create(model=model_id, prompt="The capital of France is", max_tokens=8,
                                         temperature=0)
        assert done.choices[0].text.strip()
        stream = client.chat.completions.create(model=model_id, messages=[{"role": "user", "content": "Say hi."}],
                                                max_tokens=16, temperature=0, stream=True)
        text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        assert text.strip()
        stderr_lines = []
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGINT)  # the script alone: it must stop what it started
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            raise
        stderr_lines = proc.stderr.read()
    assert proc.returncode == 0, stderr_lines
    replicas_seen = re.findall(r"replica \d at (http://127\.0\.0\.1:\d+)", stderr_lines)
    assert len(replicas_seen) == 2, stderr_lines
    # Everything it started is gone: the replicas' ports refuse connections.
    import socket
    for url in replicas_seen:
        port = int(url.rsplit(":", 1)[1])
        with socket.socket() as s:
            assert s.connect_ex(("127.0.0.1", port)) != 0, f"{url} still answers"

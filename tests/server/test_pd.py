"""Prefill and decode instances (`tandem serve --role prefill|decode`): a
prompt's KV blocks computed on one, fetched over TCP by the other. Through
vllm-router's prefill/decode mode the answers equal one instance's, token for
token and logprob for logprob (completions, streaming, chat); blocks of
another model, KV type or block size are refused by name; a peer that dies
mid-transfer fails only its request, and every pinned block is let go."""
import json
import os
import socket
import struct
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from harness import CLI, REPO, STORIES, Server, free_port, parse_metrics, require_gemma, run_cli, wait_metrics

ROUTER = os.environ.get("VLLM_ROUTER") or str(REPO / ".venv" / "bin" / "vllm-router")
PROMPTS = ["Once upon a time, there was a little girl named Lily. She loved to play outside in the park with",
           "The cat sat on the mat and looked at the big red ball. It wanted to",
           "Tom had a toy car. He liked to drive it around the house and"]


def sample(samples, name):
    return samples.get(name, 0.0)


class PdRouter:
    """vllm-router in prefill/decode mode in front of one prefill and one decode instance."""

    def __init__(self, prefill, decode, model="stories260K.gguf"):
        if not Path(ROUTER).exists():
            pytest.skip(f"vllm-router is not installed at {ROUTER}")
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [ROUTER, "--host", "127.0.0.1", "--port", str(self.port), "--vllm-pd-disaggregation", "--prefill",
             prefill.base, "--decode", decode.base, "--prometheus-port", str(free_port()), "--log-level", "warning"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, "vllm-router exited"
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    pass
                # Ready once it answers a request end to end.
                self.client().completions.create(model=model, prompt="Hi", max_tokens=1, temperature=0)
                return
            except Exception:
                time.sleep(0.2)
        self.stop()
        pytest.fail("vllm-router in PD mode never answered")

    def client(self):
        import openai
        return openai.OpenAI(base_url=self.base + "/v1", api_key="unused", timeout=120, max_retries=0)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture(scope="module")
def stories_pd():
    servers = [Server(STORIES), Server(STORIES, "--role", "prefill", "--kv-port", "0"),
               Server(STORIES, "--role", "decode")]
    try:
        router = PdRouter(servers[1], servers[2])
    except BaseException:
        for s in servers:
            s.kill()
        raise
    yield (*servers, router)
    router.stop()
    for s in servers:
        s.stop()


def f32(xs):
    """Logprobs as the float32 the server computed: vllm-router re-serializes the JSON, and its
    float parsing may land a double one unit off, which the float32 rounding takes back."""
    return [struct.unpack("f", struct.pack("f", x))[0] for x in xs]


def completion(client, prompt, **kw):
    r = client.completions.create(model="stories260K.gguf", prompt=prompt, max_tokens=24, temperature=0, logprobs=2,
                                  **kw)
    c = r.choices[0]
    return c.text, c.logprobs.tokens, f32(c.logprobs.token_logprobs), r.usage


def streamed(client, prompt):
    out = []
    for ch in client.completions.create(model="stories260K.gguf", prompt=prompt, max_tokens=24, temperature=0,
                                        stream=True):
        if ch.choices:
            out.append(ch.choices[0].text)
    return "".join(out)


def test_router_pd_equals_one_instance(stories_pd):
    ref, prefill, decode, router = stories_pd
    before, _ = parse_metrics(decode.metrics())
    full = 0
    for p in PROMPTS:
        want = completion(ref.client(), p)
        got = completion(router.client(), p)
        assert got[:3] == want[:3], p
        assert got[3].prompt_tokens == want[3].prompt_tokens
        full += want[3].prompt_tokens // 16
    after, _ = parse_metrics(decode.metrics())
    # The decode instance computed only the tails: every full block came from the prefill
    # instance and was a prefix-cache hit (the router reports the prefill's usage, so the
    # decode instance's own counters say it).
    assert sample(after, "tandem_kv_transfer_received_blocks_total") - sample(
        before, "tandem_kv_transfer_received_blocks_total") == full
    assert sample(after, "tandem_prefix_cache_hit_tokens_total") - sample(
        before, "tandem_prefix_cache_hit_tokens_total") >= full * 16 - len(PROMPTS)
    # Every pinned block was fetched and let go.
    wait_metrics(prefill, lambda s: s.get("tandem_kv_transfer_pinned_blocks") == 0)


def test_direct_pd_equals_one_instance_exactly(stories_pd):
    """The router's two requests made directly: logprobs bit for bit, as the server printed them."""
    ref, prefill, decode, _ = stories_pd
    p = PROMPTS[2] + " the garden"
    body = {"prompt": p, "max_tokens": 16, "temperature": 0, "logprobs": 3}
    status, _, want = ref.request("POST", "/v1/completions", body)
    assert status == 200, want
    kt = prefill_params(prefill, p)
    status, _, got = decode.request("POST", "/v1/completions", {**body, "kv_transfer_params": kt})
    assert status == 200, got
    w, g = json.loads(want)["choices"][0], json.loads(got)["choices"][0]
    assert g["text"] == w["text"] and g["logprobs"] == w["logprobs"]


def test_router_pd_streaming(stories_pd):
    ref, _, _, router = stories_pd
    p = PROMPTS[0] + " her friends"
    assert streamed(router.client(), p) == streamed(ref.client(), p)


def test_cached_blocks_are_not_sent_again(stories_pd):
    _, prefill, decode, router = stories_pd
    p = PROMPTS[1] + " jump over the fence"
    completion(router.client(), p)
    before, _ = parse_metrics(decode.metrics())
    completion(router.client(), p)
    after, _ = parse_metrics(decode.metrics())
    assert sample(after, "tandem_kv_transfer_received_blocks_total") == sample(
        before, "tandem_kv_transfer_received_blocks_total")
    assert sample(after, "tandem_kv_transfer_skipped_blocks_total") > sample(
        before, "tandem_kv_transfer_skipped_blocks_total")
    wait_metrics(prefill, lambda s: s.get("tandem_kv_transfer_pinned_blocks") == 0)


def test_decode_batch_invariance(stories_pd):
    ref, _, _, router = stories_pd
    prompts = [p + " " + w for p in PROMPTS for w in ("red", "blue")]
    want = [completion(ref.client(), p)[:3] for p in prompts]
    with ThreadPoolExecutor(len(prompts)) as ex:
        got = list(ex.map(lambda p: completion(router.client(), p)[:3], prompts))
    assert got == want


def prefill_params(prefill, prompt):
    """The kv_transfer_params a prefill instance answers, as the router would ask."""
    status, _, body = prefill.request("POST", "/v1/completions", {
        "prompt": prompt, "max_tokens": 1, "temperature": 0,
        "kv_transfer_params": {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
                               "remote_block_ids": None, "remote_host": None, "remote_port": None}})
    assert status == 200, body
    kt = json.loads(body)["kv_transfer_params"]
    assert kt["do_remote_prefill"] is True and kt["remote_block_ids"], kt
    return kt


def decode_with(decode, prompt, kt):
    return decode.request("POST", "/v1/completions", {"prompt": prompt, "max_tokens": 8,
                                                      "temperature": 0, "kv_transfer_params": kt})


def idle(server):
    """The engine holds no request and no block."""
    return wait_metrics(server, lambda s: s.get("tandem_requests_running") == 0
                        and s.get("tandem_requests_waiting") == 0 and s.get("tandem_kv_blocks_used") == 0)


@pytest.mark.parametrize("flags,what", [(("--block-size", "32"), "(block size): blocks of 32 tokens"),
                                        (("--kv-type", "f32"), "(KV type): K f32"),
                                        ("synth", "(model)")])
def test_decode_refuses_foreign_blocks(tmp_path, flags, what):
    model = STORIES
    if flags == "synth":
        # Same shape, other weights: blocks of the same size from another model.
        a, b = tmp_path / "a.gguf", tmp_path / "b.gguf"
        for path, seed in ((a, 1), (b, 2)):
            run_cli("synth", "-o", str(path), "--vocab-from", STORIES, "--seed", str(seed))
        model, flags = str(a), ()
        prefill = Server(str(b), "--role", "prefill")
    else:
        prefill = Server(STORIES, "--role", "prefill", *flags)
    decode = Server(model, "--role", "decode")
    try:
        prompt = PROMPTS[0] * 2
        kt = prefill_params(prefill, prompt)
        status, _, body = decode_with(decode, prompt, kt)
        assert status == 400, body
        msg = json.loads(body)["error"]["message"]
        assert "KV transfer" in msg and what in msg, msg
        idle(decode)
        wait_metrics(prefill, lambda s: s.get("tandem_kv_transfer_pinned_blocks") == 0)
    finally:
        prefill.stop()
        decode.stop()


def test_prefill_killed_fails_only_its_request():
    prefill = Server(STORIES, "--role", "prefill")
    decode = Server(STORIES, "--role", "decode")
    try:
        prompt = PROMPTS[2] * 2
        kt = prefill_params(prefill, prompt)
        prefill.kill()
        t0 = time.monotonic()
        status, _, body = decode_with(decode, prompt, kt)
        assert status == 502, body
        assert "KV transfer" in json.loads(body)["error"]["message"]
        assert time.monotonic() - t0 < 20
        idle(decode)
        # The decode instance goes on serving.
        status, _, body = decode.request("POST", "/v1/completions", {"prompt": prompt, "max_tokens": 4})
        assert status == 200, body
    finally:
        prefill.kill()
        decode.stop()


def test_prefill_dying_mid_transfer():
    """A peer that sends half a block and hangs up: the fetch fails at once, nothing is kept."""
    decode = Server(STORIES, "--role", "decode", "--kv-fetch-timeout", "5")
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(1)

    def half_a_block():
        conn, _ = lsock.accept()
        with conn:
            conn.recv(65536)
            conn.sendall(struct.pack("<BQ", 0, 4000) + b"TKVB" + b"\0" * 100)
    th = threading.Thread(target=half_a_block, daemon=True)
    th.start()
    try:
        prompt = PROMPTS[0] * 2
        kt = {"do_remote_prefill": True, "do_remote_decode": False, "remote_engine_id": "x",
              "remote_block_ids": [1, 2, 3], "remote_host": "127.0.0.1", "remote_port": lsock.getsockname()[1]}
        status, _, body = decode_with(decode, prompt, kt)
        assert status == 502, body
        assert "closed" in json.loads(body)["error"]["message"]
        samples = idle(decode)
        assert samples["tandem_kv_transfer_failures_total"] >= 1
        assert samples["tandem_kv_transfer_received_blocks_total"] == 0
    finally:
        lsock.close()
        decode.stop()


def test_decode_dying_mid_transfer_frees_the_blocks():
    """A fetch that hangs up unread, and blocks never fetched: the prefill side lets go of all of them."""
    prefill = Server(STORIES, "--role", "prefill", "--kv-transfer-timeout", "1")
    try:
        port = int(prefill.log_text().split("KV transfer on tcp://127.0.0.1:")[1].split()[0])
        kt = prefill_params(prefill, PROMPTS[0] * 3)
        ids = kt["remote_block_ids"]
        wait_metrics(prefill, lambda s: s.get("tandem_kv_transfer_pinned_blocks") == len(ids))
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            s.sendall(b"TKVF" + struct.pack("<III", 1, len(ids), 0) + struct.pack(f"<{len(ids)}Q", *ids))
            s.recv(10)  # the first bytes, then gone
        wait_metrics(prefill, lambda s: s.get("tandem_kv_transfer_pinned_blocks") == 0)
        # Unfetched blocks go after --kv-transfer-timeout.
        prefill_params(prefill, PROMPTS[1] * 3)
        samples = wait_metrics(prefill, lambda s: s.get("tandem_kv_transfer_pinned_blocks") == 0, timeout=10)
        assert samples["tandem_kv_transfer_expired_blocks_total"] > 0
        assert samples["tandem_kv_transfer_pinned_bytes"] == 0
        idle(prefill)
    finally:
        prefill.stop()


def test_gemma_pd_chat_and_completion():
    gemma = require_gemma()
    ref = Server(gemma, threads=2)
    prefill = Server(gemma, "--role", "prefill", threads=1)
    decode = Server(gemma, "--role", "decode", threads=1)
    name = Path(gemma).name
    try:
        router = PdRouter(prefill, decode, name)
    except BaseException:
        for s in (ref, prefill, decode):
            s.kill()
        raise
    try:
        msgs = [{"role": "user", "content": "Name three colours of the rainbow and say one thing about each."}]
        kw = dict(model=name, messages=msgs, max_tokens=20, temperature=0, logprobs=True)
        want = ref.client().chat.completions.create(**kw)
        got = router.client().chat.completions.create(**kw)
        assert got.choices[0].message.content == want.choices[0].message.content
        assert f32([t.logprob for t in got.choices[0].logprobs.content]) == f32(
            [t.logprob for t in want.choices[0].logprobs.content])
        stream = "".join(c.choices[0].delta.content or "" for c in router.client().chat.completions.create(
            model=name, messages=msgs, max_tokens=20, temperature=0, stream=True) if c.choices)
        assert stream == want.choices[0].message.content
        p = "The history of the printing press begins in"
        w = ref.client().completions.create(model=name, prompt=p, max_tokens=16, temperature=0)
        g = router.client().completions.create(model=name, prompt=p, max_tokens=16, temperature=0)
        assert g.choices[0].text == w.choices[0].text
        assert parse_metrics(decode.metrics())[0]["tandem_kv_transfer_received_blocks_total"] > 0
    finally:
        router.stop()
        for s in (ref, prefill, decode):
            s.stop()


def test_cluster_script_prefill_decode(stories_pd):
    """scripts/cluster.sh --prefill 1 --decode 1: greedy answers as one instance's; Ctrl-C stops it all."""
    import re
    import signal
    import openai
    ref = stories_pd[0]
    env = dict(os.environ, TANDEM_CLI=CLI, VLLM_ROUTER=ROUTER)
    proc = subprocess.Popen([str(REPO / "scripts" / "cluster.sh"), "-m", STORIES, "--prefill", "1", "--decode", "1",
                             "--", "-t", "1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True,
                            start_new_session=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        line = proc.stdout.readline()
        m = re.match(r"router: (http://127\.0\.0\.1:\d+)$", line.strip())
        assert m, f"no router line: {line!r}"
        client = openai.OpenAI(base_url=m.group(1) + "/v1", api_key="unused", timeout=120, max_retries=0)
        assert completion(client, PROMPTS[1])[:3] == completion(ref.client(), PROMPTS[1])[:3]
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            raise
    err = proc.stderr.read()
    assert proc.returncode == 0, err
    urls = re.findall(r"replica \d at (http://127\.0\.0\.1:\d+)", err)
    assert len(urls) == 2, err
    for url in urls:
        with socket.socket() as s:
            assert s.connect_ex(("127.0.0.1", int(url.rsplit(":", 1)[1]))) != 0, f"{url} still answers"


@pytest.mark.parametrize("peer,what", [("silent", "timed out"), ("huge", "at most")])
def test_fetch_bounds_what_the_wire_says(peer, what):
    """A peer that never answers times out (--kv-fetch-timeout); one that announces a block of
    2^60 bytes is refused before anything is allocated."""
    decode = Server(STORIES, "--role", "decode", "--kv-fetch-timeout", "1")
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(1)
    done = threading.Event()

    def answer():
        conn, _ = lsock.accept()
        with conn:
            conn.recv(65536)
            if peer == "huge":
                conn.sendall(struct.pack("<BQ", 0, 1 << 60))
            done.wait(10)
    threading.Thread(target=answer, daemon=True).start()
    try:
        prompt = PROMPTS[0] * 2
        kt = {"do_remote_prefill": True, "remote_block_ids": [1, 2], "remote_host": "127.0.0.1",
              "remote_port": lsock.getsockname()[1]}
        t0 = time.monotonic()
        status, _, body = decode_with(decode, prompt, kt)
        assert status == 502, body
        assert what in json.loads(body)["error"]["message"]
        assert time.monotonic() - t0 < 10
        idle(decode)
    finally:
        done.set()
        lsock.close()
        decode.stop()


def test_transferred_blocks_are_announced_as_kv_events():
    """A decode instance's KV events name the blocks it fetched, under the hashes (llm-d's, with
    their tokens) that an instance computing the prompt itself would publish: a router that
    places requests by KV events sees the transferred prefix as cached there."""
    from test_kv_events import Subscriber, llmd_hashes, tokens_of
    import re
    prefill = Server(STORIES, "--role", "prefill", "--kv-port", "0")
    decode = Server(STORIES, "--role", "decode", "--kv-events", "tcp://127.0.0.1:*", "--kv-events-replay",
                    "tcp://127.0.0.1:*")
    m = re.search(r"KV events on (tcp://[0-9.:]+), replay on (tcp://[0-9.:]+)", decode.log_text())
    sub = Subscriber(m.group(1), m.group(2), "array-map")
    try:
        p = PROMPTS[0] + " her dog and her cat"
        toks = tokens_of(decode, p)
        hashes = llmd_hashes(toks)
        assert len(hashes) >= 2
        status, _, body = decode_with(decode, p, prefill_params(prefill, p))
        assert status == 200, body
        received, _ = parse_metrics(decode.metrics())
        assert sample(received, "tandem_kv_transfer_imported_blocks_total") == len(hashes)
        sub.drain(lambda s: all(h in s.held for h in hashes))
        for i, h in enumerate(hashes):
            assert sub.chain_tokens(h) == toks[:(i + 1) * 16]
    finally:
        sub.close()
        prefill.stop()
        decode.stop()

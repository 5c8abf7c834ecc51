"""Progressive prefill (/v1/prefill and sessions), per-request timings, and the
live timeline (/v1/timeline), against a stories260K server."""
import http.client
import json
import socket
import threading
import time

from harness import STORIES, parse_metrics, start_server, wait_metrics

TEXT = ("Once upon a time, there was a little girl named Lily. She loved to play outside in the park with her "
        "friends. One day, she saw a big red ball under a tree")


def prefill(srv, body):
    status, _, raw = srv.request("POST", "/v1/prefill", body=body)
    return status, json.loads(raw)


def complete(srv, prompt, **kw):
    body = {"prompt": prompt, "max_tokens": 16, "temperature": 0, **kw}
    status, _, raw = srv.request("POST", "/v1/completions", body=body)
    assert status == 200, raw
    return json.loads(raw)


def test_prefill_then_request_resumes_to_the_token(stories):
    # Typed in three pauses, each prefill computing only what is new.
    typed = [TEXT[:40], TEXT[:90], TEXT]
    seen = []
    for t in typed:
        status, j = prefill(stories, {"prompt": t, "session": "typing-1"})
        assert status == 200, j
        assert j["object"] == "prefill" and j["session"] == "typing-1"
        assert j["computed_tokens"] + j["cached_tokens"] == j["prompt_tokens"]
        seen.append(j)
    assert seen[1]["cached_tokens"] > 0 and seen[2]["cached_tokens"] >= seen[1]["prompt_tokens"] - 2
    # The request: all but its last token come from the session, not only whole blocks.
    r = complete(stories, TEXT + " and", session="typing-1", timings=True)
    t = r["timings"]
    assert t["prompt_n"] <= 2, t
    assert t["cache_n"] == r["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert r["usage"]["prompt_tokens_details"]["cached_tokens"] % 16 != 0
    # And it says what a request without any of this says.
    fresh = complete(stories, TEXT + " and")
    assert r["choices"][0]["text"] == fresh["choices"][0]["text"]
    for key in ("queued_ms", "prompt_ms", "ttft_ms", "predicted_n", "predicted_per_second", "draft_n"):
        assert key in t
    assert "timings" not in fresh  # opt-in
    # The text exactly as prefilled (Enter after the last pause): the first
    # token comes from the logits the prefill kept, no prompt token computed.
    status, j = prefill(stories, {"prompt": TEXT + " and", "session": "typing-1"})
    assert status == 200 and j["computed_tokens"] <= 1, j  # its last token, after the answer above
    r = complete(stories, TEXT + " and", session="typing-1", timings=True)
    assert r["timings"]["prompt_n"] == 0 and r["timings"]["cache_n"] == r["usage"]["prompt_tokens"], r["timings"]
    assert r["choices"][0]["text"] == fresh["choices"][0]["text"]


def test_prefill_of_a_conversation_and_edits(stories):
    # Chat needs a chat format (stories has none): refused clearly.
    status, j = prefill(stories, {"messages": [{"role": "user", "content": "hi"}]})
    assert status == 400 and "chat" in j["error"]["message"]
    # Without a session a name is made up and returned.
    status, j = prefill(stories, {"prompt": TEXT})
    assert status == 200 and j["session"].startswith("sess-")
    # An edit in the middle: the session rolls back to where the texts part.
    status, a = prefill(stories, {"prompt": TEXT, "session": "edit"})
    edited = TEXT[:70] + "a small blue car near the gate"
    status, b = prefill(stories, {"prompt": edited, "session": "edit"})
    assert status == 200 and 0 < b["cached_tokens"] < a["prompt_tokens"]
    assert complete(stories, edited, session="edit")["choices"][0]["text"] == complete(stories, edited)["choices"][0]["text"]
    # An unknown session is a plain request; a prompt past the context is a 400.
    assert complete(stories, TEXT, session="never-seen")["choices"]
    status, j = prefill(stories, {"prompt": "word " * 5000, "session": "long"})
    assert status == 400 and j["error"]["code"] == "context_length_exceeded"
    status, j = prefill(stories, {"prompt": TEXT, "session": ""})
    assert status == 400 and j["error"]["param"] == "session"
    # max_tokens 0 on completions: a warm-up, as llama.cpp's clients send one.
    warm = complete(stories, TEXT + " again", max_tokens=0)
    assert warm["choices"][0]["text"] == "" and warm["usage"]["completion_tokens"] == 0


def test_sessions_survive_eviction_and_disconnects():
    # A pool of 8 blocks: other requests take the session's cached blocks.
    srv = start_server(STORIES, "--kv-tokens", "128", "--ctx-size", "128")
    try:
        status, _ = prefill(srv, {"prompt": TEXT[:100], "session": "s"})
        assert status == 200
        for other in ("The little dog ran to the park and played all day with his friends in the sun",
                      "Tom and Sue went to the beach to build a big castle of sand near the water"):
            complete(srv, other, max_tokens=40)
        assert complete(srv, TEXT[:100] + " and", session="s")["choices"][0]["text"] == \
            complete(srv, TEXT[:100] + " and")["choices"][0]["text"]
        # A client that leaves mid-prefill: nothing is kept, nothing leaks.
        before, _ = parse_metrics(srv.metrics())
        c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=10)
        c.request("POST", "/v1/prefill", body=json.dumps({"prompt": TEXT[:120], "session": "gone"}),
                  headers={"Content-Type": "application/json"})
        c.sock.shutdown(socket.SHUT_RDWR)
        c.close()
        # Idle gauges can be read before the request reaches the engine (a slow
        # worker), so wait for the end state itself: no request in the engine
        # and at most the session's pinned block more than before (the prefill
        # may finish before the hang-up is seen). A leak fails the wait.
        wait_metrics(srv, lambda m: m["tandem_requests_running"] == 0 and m["tandem_requests_waiting"] == 0 and
                     m["tandem_kv_blocks_used"] <= before["tandem_kv_blocks_used"] + 1)
    finally:
        assert srv.stop() == 0


def test_timeline_streams_every_step(stories):
    steps, ready = [], threading.Event()

    def watch():
        c = http.client.HTTPConnection("127.0.0.1", stories.port, timeout=30)
        c.request("GET", "/v1/timeline")
        r = c.getresponse()
        assert r.status == 200 and r.getheader("Content-Type").startswith("text/event-stream")
        ready.set()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            line = r.fp.readline()
            if line.startswith(b"data: "):
                steps.append(json.loads(line[6:]))
                if any(f for s in steps for f in s["finished"]):
                    break
        c.close()

    t = threading.Thread(target=watch)
    t.start()
    assert ready.wait(10)
    r = complete(stories, TEXT, max_tokens=12, timings=True)
    t.join(40)
    assert steps, "no step came"
    ids = {p[0] for s in steps for p in s["parts"]}
    assert len(ids) == 1
    (rid,) = ids
    assert any(s["arrived"] and s["arrived"][0][0] == rid for s in steps)
    assert any(f[0] == rid and f[1] == "length" for s in steps for f in s["finished"])
    prompt_rows = sum(p[2] for s in steps for p in s["parts"])
    decode_rows = sum(p[3] for s in steps for p in s["parts"])
    assert prompt_rows == r["usage"]["prompt_tokens"] - r["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert decode_rows == 11  # the first of the 12 tokens comes from the prefill
    for s in steps:
        assert s["t1"] >= s["t0"] and s["phase"] in ("prefill", "decode", "mixed") and s["rows"] > 0

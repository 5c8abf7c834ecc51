"""Hostile requests, each small to send and costly to serve, and the prefix
cache as a side channel between clients: every bound answers 400 naming what
it bounds, before the costly part, and is a `tandem serve` flag; cache_salt
and --cache-per-key keep one client's cached prompt and /v1/prefill session
out of another's reach."""
import json
import time

import pytest

from harness import STORIES, start_server

TEXT = ("Once upon a time, there was a little girl named Lily. She loved to play outside in the park with her "
        "friends. One day, she saw a big red ball under a tree")


def post(srv, path, body, headers=None):
    t0 = time.monotonic()
    status, _, raw = srv.request("POST", path, body=body, headers=headers)
    return status, json.loads(raw), time.monotonic() - t0


def refused(srv, path, body, param, words, headers=None):
    status, j, took = post(srv, path, body, headers)
    assert status == 400, (status, j)
    assert j["error"]["param"] == param, j
    for w in words:
        assert w in j["error"]["message"], j
    return took


def ref_levels(levels, width=64):
    """$defs levels of `width` properties, each a $ref to the next level: expanded, width**levels nodes."""
    defs = {}
    for lv in range(levels):
        nxt = {"$ref": f"#/$defs/L{lv + 1}"} if lv + 1 < levels else {"type": "integer"}
        defs[f"L{lv}"] = {"type": "object", "properties": {f"p{i}": nxt for i in range(width)}}
    return {"$defs": defs, "$ref": "#/$defs/L0"}


def rss_kb(pid, field):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise AssertionError(field)


def test_ref_schemas_compile_once_per_definition():
    srv = start_server(STORIES)
    try:
        idle = rss_kb(srv.proc.pid, "VmRSS")
        for levels in (4, 5):  # 64**4 and 64**5 nodes expanded: gigabytes, and minutes
            schema = ref_levels(levels)
            body = {"prompt": "x", "max_tokens": 4, "temperature": 0,
                    "response_format": {"type": "json_schema", "json_schema": {"name": "t", "schema": schema}}}
            status, j, _ = post(srv, "/v1/completions", body)
            assert status == 200, j
            text = j["choices"][0]["text"].strip()  # the model may pad with whitespace first
            assert not text or text[0] == "{", j
        # The compiled table is a few hundred nodes: the server grew by far less than 64 MiB.
        assert rss_kb(srv.proc.pid, "VmHWM") < idle + 64 * 1024
        # A definition that refers back to itself is refused, not expanded to the depth limit.
        schema = {"$defs": {"A": {"type": "object", "properties": {"b": {"$ref": "#/$defs/B"}}},
                            "B": {"type": "object", "properties": {"a": {"$ref": "#/$defs/A"}}}},
                  "$ref": "#/$defs/A"}
        refused(srv, "/v1/completions", {"prompt": "x", "response_format": {
            "type": "json_schema", "json_schema": {"schema": schema}}}, "response_format", ["recursive"])
    finally:
        assert srv.stop() == 0


def test_tokenize_and_detokenize_bound_their_input(stories):
    status, j, _ = post(stories, "/tokenize", {"prompt": "Once upon a time"})
    assert status == 200 and j["count"] > 0, j
    ctx = j["max_model_len"]
    # 16 MB of text: refused before the tokenizer sees it.
    took = refused(stories, "/tokenize", {"prompt": "a" * (16 << 20)}, "prompt", ["/tokenize takes at most"])
    assert took < 10, took  # the body's transfer and parse; tokenizing it took far longer
    refused(stories, "/tokenize", {"content": "b " * (4 << 20)}, "prompt", ["at most"])
    refused(stories, "/detokenize", {"tokens": [1] * (ctx + 1)}, "tokens", [f"at most {ctx}"])
    status, j, _ = post(stories, "/detokenize", {"tokens": [1] * ctx})
    assert status == 200, j


def test_logprobs_a_request_may_produce_are_bounded(stories):
    # 109 bytes that asked for a 68 MB response: 64 choices x 2040 tokens x 21 entries.
    body = {"prompt": ["Once"] * 4, "n": 16, "max_tokens": 2040, "logprobs": 20}
    refused(stories, "/v1/completions", body, "logprobs", ["64 choices x 2040 tokens x (1 + 20 logprobs)",
                                                           "2741760", "at most 1048576"])
    # echo adds each prompt's tokens (chat counts as completions do: tests/server_schema_test.cpp).
    refused(stories, "/v1/completions", {"prompt": "Once", "n": 16, "max_tokens": 3200, "logprobs": 20,
                                         "echo": True}, "logprobs", ["16 choices x 3202 tokens"])
    status, j, _ = post(stories, "/v1/completions", {"prompt": "Once", "max_tokens": 3, "logprobs": 20, "n": 2})
    assert status == 200 and len(j["choices"][0]["logprobs"]["top_logprobs"][0]) == 20, j


def test_stop_strings_are_bounded(stories):
    refused(stories, "/v1/completions", {"prompt": "x", "stop": ["a", "b", "c", "d", "e"]}, "stop",
            ["'stop' has 5 strings; at most 4"])
    refused(stories, "/v1/completions", {"prompt": "x", "stop": ["a", "x" * 30000]}, "stop",
            ["string 1 has 30000 bytes; at most 256"])
    refused(stories, "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "stop": "y" * 257},
            "stop", ["257 bytes"])
    status, j, _ = post(stories, "/v1/completions", {"prompt": "x", "max_tokens": 2, "stop": ["a", "b", "c", "d" * 256]})
    assert status == 200, j


def test_chat_messages_are_counted_before_templating(stories):
    # 100,000 one-character messages took 8 s of templating before the context check.
    msgs = [{"role": "user", "content": "a"}] * 100000
    took = refused(stories, "/v1/chat/completions", {"messages": msgs}, "messages",
                   ["100000 messages; at most 2048"])
    assert took < 10, took
    refused(stories, "/v1/chat/completions/render", {"messages": msgs}, "messages", ["at most 2048"])


def test_request_limits_are_flags():
    srv = start_server(STORIES, "--max-stop", "8", "--max-stop-length", "1000", "--max-messages", "3",
                       "--max-logprob-entries", "100", "--max-tokenize", "5")
    try:
        status, j, _ = post(srv, "/v1/completions", {"prompt": "x", "max_tokens": 1, "stop": ["s"] * 8 + ["y" * 999]})
        assert status == 400 and "9 strings; at most 8" in j["error"]["message"], j
        status, j, _ = post(srv, "/v1/completions", {"prompt": "x", "max_tokens": 1, "stop": ["s"] * 7 + ["y" * 999]})
        assert status == 200, j
        msgs = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
        refused(srv, "/v1/chat/completions", {"messages": msgs * 2}, "messages", ["4 messages; at most 3"])
        refused(srv, "/v1/completions", {"prompt": "x", "max_tokens": 10, "logprobs": 10}, "logprobs",
                ["1 choices x 10 tokens x (1 + 10 logprobs) asks for 110", "at most 100"])
        status, j, _ = post(srv, "/v1/completions", {"prompt": "x", "max_tokens": 9, "logprobs": 9})
        assert status == 200, j
        status, j, _ = post(srv, "/detokenize", {"tokens": [1] * 5})
        assert status == 200, j
        refused(srv, "/detokenize", {"tokens": [1] * 6}, "tokens", ["at most 5"])
    finally:
        assert srv.stop() == 0


# --- the prefix cache as a side channel ----------------------------------------------


def cached(srv, body, headers=None):
    status, j, _ = post(srv, "/v1/completions", {"max_tokens": 1, "temperature": 0, **body}, headers)
    assert status == 200, j
    return j["usage"]["prompt_tokens_details"]["cached_tokens"]


def test_cache_salt_keys_the_prefix_cache(stories):
    prompt = "The salt test. " + TEXT  # a text no other test of the shared server sends
    assert cached(stories, {"prompt": prompt, "cache_salt": "tenant-a"}) == 0
    assert cached(stories, {"prompt": prompt, "cache_salt": "tenant-a"}) > 0
    # Another salt, or none, finds nothing of it.
    assert cached(stories, {"prompt": prompt, "cache_salt": "tenant-b"}) == 0
    assert cached(stories, {"prompt": prompt}) == 0
    assert cached(stories, {"prompt": prompt}) > 0  # the unsalted prefix is shared among the unsalted
    for bad in ("", 7, "s" * 257):
        refused(stories, "/v1/completions", {"prompt": "x", "cache_salt": bad}, "cache_salt", ["cache_salt"])


def test_sessions_belong_to_their_salt(stories):
    text = "The session test. " + TEXT
    status, j, _ = post(stories, "/v1/prefill", {"prompt": text, "session": "shared-name", "cache_salt": "owner"})
    assert status == 200 and j["session"] == "shared-name" and j["cached_tokens"] == 0, j
    # Another client naming the session reads none of it, and cannot overwrite it.
    status, j, _ = post(stories, "/v1/prefill", {"prompt": text, "session": "shared-name", "cache_salt": "intruder"})
    assert status == 200 and j["session"] == "shared-name" and j["cached_tokens"] == 0, j
    status, j, _ = post(stories, "/v1/prefill", {"prompt": text + " x", "session": "shared-name"})
    assert status == 200 and j["cached_tokens"] == 0, j
    status, j, _ = post(stories, "/v1/prefill", {"prompt": text, "session": "shared-name", "cache_salt": "owner"})
    assert status == 200 and j["cached_tokens"] >= j["prompt_tokens"] - 1, j


def test_cache_per_key():
    srv = start_server(STORIES, "--api-key", "key-one", "--api-key", "key-two", "--cache-per-key")
    one, two = {"Authorization": "Bearer key-one"}, {"Authorization": "Bearer key-two"}
    try:
        assert cached(srv, {"prompt": TEXT}, one) == 0
        assert cached(srv, {"prompt": TEXT}, two) == 0
        assert cached(srv, {"prompt": TEXT}, one) > 0
        assert cached(srv, {"prompt": TEXT, "cache_salt": "s"}, one) == 0  # a salt splits a key's scope further
        other = "Another day. " + TEXT
        status, j, _ = post(srv, "/v1/prefill", {"prompt": other, "session": "s1"}, one)
        assert status == 200, j
        status, j, _ = post(srv, "/v1/prefill", {"prompt": other, "session": "s1"}, two)
        assert status == 200 and j["cached_tokens"] == 0, j
        status, j, _ = post(srv, "/v1/prefill", {"prompt": other, "session": "s1"}, one)
        assert status == 200 and j["cached_tokens"] >= j["prompt_tokens"] - 1, j
        status, _, _ = srv.request("POST", "/v1/completions", body={"prompt": "x"},
                                   headers={"Authorization": "Bearer key-three"})
        assert status == 401
    finally:
        assert srv.stop() == 0


def test_cache_per_key_needs_a_key():
    import subprocess

    from harness import CLI
    r = subprocess.run([CLI, "serve", "-m", STORIES, "--port", "0", "--cache-per-key"], capture_output=True,
                       timeout=60)
    assert r.returncode != 0 and b"--cache-per-key needs --api-key" in r.stderr, r.stderr

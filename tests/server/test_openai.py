"""`tandem serve` driven by the official openai client (and raw HTTP where a
client would hide what is tested: disconnects, malformed bodies, headers)."""
import concurrent.futures as cf
import http.client
import json
import math
import socket
import subprocess
import threading
import time

import openai
import pytest

from harness import CLI, REPO, STORIES, gemma_path, parse_metrics, run_cli, start_server, wait_metrics

PROMPT = "Once upon a time"


def stories_model_id(server):
    return server.client().models.list().data[0].id


def cli_greedy(prompt, n, model=STORIES, threads="1"):
    return run_cli("run", "-m", model, "-p", prompt, "-n", str(n), "--temp", "0", "-t", threads)


def tokenize(text, model=STORIES):
    return [int(t) for t in run_cli("tokenize", "-m", model, text).split()]


# --- basic routes -----------------------------------------------------------


def test_health_and_models(stories):
    status, headers, body = stories.request("GET", "/health")
    assert status == 200 and json.loads(body) == {"status": "ok"}
    models = stories.client().models.list()
    assert [m.id for m in models.data] == ["stories260K.gguf"]
    assert stories.client().models.retrieve("stories260K.gguf").id == "stories260K.gguf"
    status, _, body = stories.request("GET", "/v1/models/no-such-model")
    assert status == 404 and json.loads(body)["error"]["code"] == "model_not_found"


# --- completions ------------------------------------------------------------


def test_completion_greedy_equals_cli(stories):
    c = stories.client()
    want = cli_greedy(PROMPT, 48)
    r = c.completions.create(model="stories260K.gguf", prompt=PROMPT, max_tokens=48, temperature=0)
    assert r.object == "text_completion"
    assert r.choices[0].text == want
    assert r.choices[0].finish_reason in ("length", "stop")
    # The same through the stream.
    chunks = list(c.completions.create(model="stories260K.gguf", prompt=PROMPT, max_tokens=48, temperature=0,
                                       stream=True))
    assert "".join(ch.choices[0].text for ch in chunks if ch.choices) == want
    assert chunks[-1].choices[0].finish_reason == r.choices[0].finish_reason
    assert all(ch.id == chunks[0].id for ch in chunks)


def test_model_name_forms_accepted(stories):
    c = stories.client()
    for name in ("stories260K.gguf", "stories260K", STORIES):
        r = c.completions.create(model=name, prompt=PROMPT, max_tokens=2, temperature=0)
        assert r.model == "stories260K.gguf"


def test_stream_usage_and_finish(stories):
    c = stories.client()
    chunks = list(c.completions.create(model="stories260K", prompt=PROMPT, max_tokens=10,
                                       temperature=0, stream=True, stream_options={"include_usage": True},
                                       extra_body={"ignore_eos": True}))
    assert chunks[-1].choices == []
    usage = chunks[-1].usage
    assert usage.completion_tokens == 10
    assert usage.prompt_tokens == len(tokenize(PROMPT))
    assert usage.total_tokens == usage.prompt_tokens + 10
    assert all(ch.usage is None for ch in chunks[:-1])
    finals = [ch for ch in chunks if ch.choices and ch.choices[0].finish_reason]
    assert len(finals) == 1 and finals[0].choices[0].finish_reason == "length"


def test_usage_counts(stories):
    c = stories.client()
    ids = tokenize("The little dog ran to the park")
    r = c.completions.create(model="stories260K", prompt="The little dog ran to the park", max_tokens=7,
                             temperature=0, extra_body={"ignore_eos": True})
    assert r.usage.prompt_tokens == len(ids)
    assert r.usage.completion_tokens == 7
    assert r.usage.total_tokens == len(ids) + 7
    assert r.choices[0].finish_reason == "length"
    # A prompt of token ids is taken as is (no BOS added).
    r = c.completions.create(model="stories260K", prompt=ids, max_tokens=3, temperature=0)
    assert r.usage.prompt_tokens == len(ids)


def test_prefix_cache_reports_cached_tokens(stories):
    c = stories.client()
    prompt = "Tom and Sue went to the big park with their mom. They saw a tall tree and a red slide. " * 3
    first = c.completions.create(model="stories260K", prompt=prompt, max_tokens=2, temperature=0)
    before, _ = parse_metrics(stories.metrics())
    second = c.completions.create(model="stories260K", prompt=prompt, max_tokens=2, temperature=0)
    after, _ = parse_metrics(stories.metrics())
    cached = second.usage.prompt_tokens_details.cached_tokens
    # Every full block of the shared prompt is reused (all but the last, partial one at most).
    assert cached >= second.usage.prompt_tokens - 16 and cached < second.usage.prompt_tokens
    assert first.choices[0].text == second.choices[0].text
    assert after["tandem_prefix_cache_hit_tokens_total"] - before["tandem_prefix_cache_hit_tokens_total"] >= cached


def test_n_choices_with_seed(stories):
    c = stories.client()
    kw = dict(model="stories260K", prompt=PROMPT, max_tokens=24, temperature=1.0, n=3, seed=1234, logprobs=0)
    a = c.completions.create(**kw)
    assert sorted(ch.index for ch in a.choices) == [0, 1, 2]
    assert all(ch.text for ch in a.choices)
    # Usage counts every choice's tokens, the prompt once.
    assert a.usage.completion_tokens == sum(len(ch.logprobs.tokens) for ch in a.choices)
    assert a.usage.prompt_tokens == len(tokenize(PROMPT))
    # Same seed, same answers; choices differ from each other.
    b = c.completions.create(**kw)
    assert [ch.text for ch in a.choices] == [ch.text for ch in b.choices]
    assert len({ch.text for ch in a.choices}) > 1
    # Streaming carries the choice index on every chunk.
    texts = ["", "", ""]
    for ch in c.completions.create(**kw, stream=True):
        for choice in ch.choices:
            texts[choice.index] += choice.text
    assert texts == [ch.text for ch in a.choices]


def test_several_prompts_in_one_request(stories):
    c = stories.client()
    prompts = ["Once upon a time", "The little dog", "Sue had a red ball and"]
    kw = dict(model="stories260K", max_tokens=6, temperature=0, extra_body={"ignore_eos": True})
    alone = [c.completions.create(prompt=p, **kw) for p in prompts]
    both = c.completions.create(prompt=prompts, **kw)
    # Choice k answers prompt k, as the same request alone would; usage sums the prompts.
    assert [ch.index for ch in both.choices] == [0, 1, 2]
    assert [ch.text for ch in both.choices] == [a.choices[0].text for a in alone]
    assert both.usage.prompt_tokens == sum(a.usage.prompt_tokens for a in alone)
    assert both.usage.completion_tokens == 18
    # Token-id prompts and n: prompt k's choices are k*n .. k*n+n-1, streamed with those indexes.
    ids = [tokenize(p) for p in prompts[:2]]
    kw = dict(model="stories260K", prompt=ids, max_tokens=8, temperature=1.0, n=2, seed=7)
    r = c.completions.create(**kw)
    assert [ch.index for ch in r.choices] == [0, 1, 2, 3]
    assert r.usage.prompt_tokens == len(ids[0]) + len(ids[1])
    texts = [""] * 4
    for chunk in c.completions.create(**kw, stream=True):
        for choice in chunk.choices:
            texts[choice.index] += choice.text
    assert texts == [ch.text for ch in r.choices]
    # One bad prompt refuses the whole request, naming it.
    got, err = error_of(stories, "/v1/completions", {"prompt": [[5], [1, 99999]]})
    assert got == 400 and "prompt[1]" in err["message"], err
    # Nothing is left running: every KV block is back.
    m = wait_metrics(stories, lambda m: m["tandem_requests_running"] == 0 and m["tandem_kv_blocks_used"] == 0)
    assert m["tandem_kv_blocks_free"] == m["tandem_kv_blocks_total"]


def test_stop_strings(stories):
    c = stories.client()
    full = c.completions.create(model="stories260K", prompt=PROMPT, max_tokens=60, temperature=0,
                                extra_body={"ignore_eos": True}).choices[0].text
    words = full.split()
    stop = words[len(words) // 2]
    want = full[: full.index(stop)]
    for stream in (False, True):
        kw = dict(model="stories260K", prompt=PROMPT, max_tokens=60, temperature=0, stop=[stop, "\u2603"],
                  extra_body={"ignore_eos": True})
        if stream:
            chunks = list(c.completions.create(**kw, stream=True))
            text = "".join(ch.choices[0].text for ch in chunks if ch.choices)
            reason = [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1]
        else:
            r = c.completions.create(**kw)
            text, reason = r.choices[0].text, r.choices[0].finish_reason
        assert text == want
        assert reason == "stop"
    # A single string works too.
    r = c.completions.create(model="stories260K", prompt=PROMPT, max_tokens=60, temperature=0, stop=stop,
                             extra_body={"ignore_eos": True})
    assert r.choices[0].text == want


def test_logprobs(stories):
    c = stories.client()
    r = c.completions.create(model="stories260K", prompt=PROMPT, max_tokens=12, temperature=0, logprobs=3,
                             extra_body={"ignore_eos": True})
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 12
    assert "".join(lp.tokens) == r.choices[0].text
    for chosen, top in zip(lp.token_logprobs, lp.top_logprobs):
        assert chosen <= 0 and math.isfinite(chosen)
        assert 1 <= len(top) <= 3 and all(v <= 0 for v in top.values())
        # Greedy picks the most likely token.
        assert chosen == pytest.approx(max(top.values()), abs=1e-5)
    assert lp.text_offset == sorted(lp.text_offset)
    # Streaming: one logprob per token across the chunks.
    n = 0
    for ch in c.completions.create(model="stories260K", prompt=PROMPT, max_tokens=12, temperature=0, logprobs=0,
                                   stream=True, extra_body={"ignore_eos": True}):
        if ch.choices and ch.choices[0].logprobs:
            n += len(ch.choices[0].logprobs.token_logprobs)
            assert all(v <= 0 for v in ch.choices[0].logprobs.token_logprobs)
    assert n == 12


def test_echo_scores_the_prompt(stories):
    """echo + max_tokens 0 + logprobs, as lm-eval-harness scores text: llama.cpp's
    prompt logprobs (scripts/gen_prompt_logprob_refs.py; its KV cache is f32, the
    server's f16), and the same numbers the server gives while generating."""
    c = stories.client()
    refs = json.loads((REPO / "tests/data/llamacpp/prompt_logprobs_stories260k.json").read_text())
    for case in refs["cases"]:
        ids = case["prompt_ids"]
        r = c.completions.create(model="stories260K", prompt=ids, echo=True, max_tokens=0, logprobs=1)
        ch = r.choices[0]
        assert ch.finish_reason == "length" and r.usage.completion_tokens == 0
        lp = ch.logprobs
        assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(ids)
        assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
        # f16 K/V against f32: measured within 0.006 (the engine test, f32 K/V: 4e-6).
        for got, want in zip(lp.token_logprobs[1:], case["logprobs"]):
            assert got == pytest.approx(want, abs=0.02)
        assert "".join(lp.tokens[1:]).lstrip() == case["prompt"]
    # Generation's logprobs are the scores of the text it wrote: echo them back.
    gen = c.completions.create(model="stories260K", prompt=PROMPT, max_tokens=10, temperature=0, logprobs=0,
                               echo=True, extra_body={"ignore_eos": True})
    g = gen.choices[0]
    assert g.text.startswith(PROMPT) and len(g.logprobs.tokens) == len(tokenize(PROMPT)) + 10
    scored = c.completions.create(model="stories260K", prompt=g.text, echo=True, max_tokens=0, logprobs=0)
    s = scored.choices[0]
    assert s.text == g.text
    assert s.logprobs.tokens == g.logprobs.tokens
    assert s.logprobs.token_logprobs[1:] == pytest.approx(g.logprobs.token_logprobs[1:], abs=1e-5)
    # text_offset points into the text returned: BOS spells nothing, the first word starts at 0
    # (not after the tokenizer's prefix space), and each visible token's text is where its offset says.
    offs = g.logprobs.text_offset
    assert offs[:2] == [0, 0] and offs == sorted(offs)
    for tok_text, off in zip(g.logprobs.tokens[1:], offs[1:]):
        piece = tok_text if off > 0 else tok_text.lstrip()
        assert g.text[off:off + len(piece)] == piece, (tok_text, off, g.text)
    # Streaming and n = 2: each choice's first chunk carries the prompt.
    first = {}
    for chunk in c.completions.create(model="stories260K", prompt=PROMPT, max_tokens=3, temperature=0, n=2,
                                      echo=True, logprobs=0, stream=True):
        for ch in chunk.choices:
            first.setdefault(ch.index, ch)
    assert sorted(first) == [0, 1]
    for ch in first.values():
        assert ch.text.startswith(PROMPT) and ch.logprobs.token_logprobs[0] is None
    # max_tokens 0 without echo: a cache warm-up, nothing generated.
    warm = c.completions.create(model="stories260K", prompt=PROMPT + " in a far land", max_tokens=0)
    assert warm.choices[0].text == "" and warm.usage.completion_tokens == 0
    # Refused: echo in chat.
    with pytest.raises(openai.BadRequestError, match="echo"):
        c.chat.completions.create(model="stories260K", messages=[{"role": "user", "content": "hi"}],
                                  extra_body={"echo": True})


def test_logit_bias(stories):
    c = stories.client()
    kw = dict(model="stories260K", prompt=PROMPT, max_tokens=6, temperature=0, logprobs=1,
              extra_body={"ignore_eos": True})
    plain = c.completions.create(**kw).choices[0]
    # +100 on one token: greedy picks it every time (logprobs stay the model's own).
    the = tokenize("the")[-1]  # " the" (SentencePiece adds the space)
    forced = c.completions.create(logit_bias={str(the): 100}, **kw).choices[0]
    assert forced.text == " the" * 6
    assert all(v < 0 for v in forced.logprobs.token_logprobs)
    # -100 on the token greedy chose first: the second best comes instead.
    first = plain.logprobs.tokens[0]
    banned = c.completions.create(logit_bias={str(tokenize(first)[-1]): -100}, **kw).choices[0]
    assert banned.logprobs.tokens[0] != first
    # Ids outside the vocabulary are a 400.
    with pytest.raises(openai.BadRequestError, match="outside the vocabulary"):
        c.completions.create(logit_bias={"999999": 1}, **kw)


def test_tokenize_and_detokenize(stories):
    """vLLM's and llama.cpp's forms of POST /tokenize and /detokenize."""
    def post(path, body):
        status, _, raw = stories.request("POST", path, body=body)
        return status, json.loads(raw)

    ids = tokenize(PROMPT)  # the CLI: BOS first
    status, r = post("/tokenize", {"model": "stories260K", "prompt": PROMPT})
    assert status == 200 and r["tokens"] == ids and r["count"] == len(ids) and r["max_model_len"] > 0
    assert post("/tokenize", {"prompt": PROMPT, "add_special_tokens": False})[1]["tokens"] == ids[1:]
    assert post("/tokenize", {"content": PROMPT})[1]["tokens"] == ids[1:]  # llama.cpp: no BOS unless asked
    assert post("/tokenize", {"content": PROMPT, "add_special": True})[1]["tokens"] == ids
    status, r = post("/detokenize", {"tokens": ids[1:]})
    assert status == 200 and r["prompt"] == r["content"] == PROMPT
    for path, body, param in [("/tokenize", {}, "prompt"), ("/tokenize", {"prompt": 3}, "prompt"),
                              ("/detokenize", {"tokens": "x"}, "tokens"), ("/detokenize", {"tokens": [-1]}, "tokens"),
                              ("/detokenize", {"tokens": [10 ** 6]}, "tokens"),
                              ("/tokenize", {"prompt": "x", "model": "nope"}, "model")]:
        status, err = error_of(stories, path, body)
        assert status in (400, 404) and err["param"] == param, (path, body, err)
    assert stories.request("GET", "/tokenize")[0] == 405


def test_sixteen_concurrent_streams(stories):
    c = stories.client()

    def one(i):
        text, reason = "", None
        for ch in c.completions.create(model="stories260K", prompt=f"{PROMPT} there was a {i}", max_tokens=32,
                                       temperature=0.8, seed=i, stream=True):
            if ch.choices:
                text += ch.choices[0].text
                reason = ch.choices[0].finish_reason or reason
        return text, reason

    with cf.ThreadPoolExecutor(16) as pool:
        results = list(pool.map(one, range(16), timeout=180))
    assert len(results) == 16
    for text, reason in results:
        assert reason in ("stop", "length")
        assert text or reason == "stop"


# --- disconnects, errors, metrics --------------------------------------------


@pytest.mark.parametrize("prompt,n", [(PROMPT, 16), ([PROMPT, "The dog", "A big red", "Sue"], 4)],
                         ids=["one-prompt", "four-prompts"])
def test_client_disconnect_cancels_and_frees_blocks(stories, prompt, n):
    before, _ = parse_metrics(stories.metrics())
    body = {"model": "stories260K", "prompt": prompt, "max_tokens": 2000, "n": n, "temperature": 1.0,
            "stream": True, "ignore_eos": True}
    conn = http.client.HTTPConnection("127.0.0.1", stories.port, timeout=30)
    conn.request("POST", "/v1/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
    sock = conn.sock
    resp = conn.getresponse()
    assert resp.status == 200
    assert resp.getheader("Content-Type").startswith("text/event-stream")
    first = resp.read(5)  # the start of the first event: generation is under way
    assert first in (b"data:", b": kee"), first
    sock.shutdown(socket.SHUT_RDWR)  # the client goes away mid-stream
    sock.close()
    resp.close()

    after = wait_metrics(stories, lambda m: m["tandem_requests_cancelled_total"] > before[
        "tandem_requests_cancelled_total"] and m["tandem_requests_running"] == 0 and m["tandem_kv_blocks_used"] == 0)
    # Cancelled early: far fewer than the 32000 tokens asked for were generated.
    generated = after["tandem_generation_tokens_total"] - before["tandem_generation_tokens_total"]
    assert generated < 16 * 2000 // 2
    assert after["tandem_kv_blocks_used"] == 0
    assert after["tandem_kv_blocks_free"] == after["tandem_kv_blocks_total"] > 0
    # The server is still fine.
    assert stories.client().completions.create(model="stories260K", prompt=PROMPT, max_tokens=2).choices


def error_of(server, path, body, headers=None):
    status, _, raw = server.request("POST", path, body=body, headers=headers)
    err = json.loads(raw)["error"]
    assert set(err) >= {"message", "type", "param", "code"}
    return status, err


def test_bad_requests(stories):
    C = "/v1/completions"
    cases = [
        (C, b'{"prompt": "x",', 400, None),
        (C, b'[1,2]', 400, None),
        (C, {"model": "stories260K"}, 400, "prompt"),
        (C, {"prompt": 5}, 400, "prompt"),
        (C, {"prompt": "x", "max_tokens": -1}, 400, "max_tokens"),
        (C, {"prompt": "x", "max_tokens": "ten"}, 400, "max_tokens"),
        (C, {"prompt": "x", "temperature": 3}, 400, "temperature"),
        (C, {"prompt": "x", "top_p": 0}, 400, "top_p"),
        (C, {"prompt": "x", "n": 17}, 400, "n"),
        (C, {"prompt": "x", "stop": 3}, 400, "stop"),
        (C, {"prompt": [1, 99999]}, 400, "prompt"),
        ("/v1/chat/completions", {"messages": "hi"}, 400, "messages"),
    ]
    for path, body, status, param in cases:
        got, err = error_of(stories, path, body)
        assert got == status, (body, err)
        assert err["type"] == "invalid_request_error"
        if param:
            assert err["param"] == param, (body, err)

    # Unknown model: 404.
    got, err = error_of(stories, C, {"model": "gpt-4", "prompt": "x"})
    assert got == 404 and err["code"] == "model_not_found"
    with pytest.raises(openai.NotFoundError):
        stories.client().completions.create(model="gpt-4", prompt="x")
    # Through the client, a bad value is a BadRequestError.
    with pytest.raises(openai.BadRequestError):
        stories.client().completions.create(model="stories260K", prompt="x", temperature=2.5)
    # Unknown route: 404 with an error object.
    status, _, raw = stories.request("GET", "/v1/nothing")
    assert status == 404 and "error" in json.loads(raw)
    # Chat on a model without a chat format.
    got, err = error_of(stories, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]})
    assert got == 400 and "chat" in err["message"]


def test_request_bodies_as_curl_sends_them(stories):
    # curl -d labels a body application/x-www-form-urlencoded; it is still JSON,
    # at any size up to the limit (httplib alone refused such bodies over 8 KiB).
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    body = json.dumps({"prompt": PROMPT, "max_tokens": 3, "temperature": 0}) + " " * 20000
    status, _, raw = stories.request("POST", "/v1/completions", body=body, headers=form)
    assert status == 200, raw
    assert json.loads(raw)["usage"]["completion_tokens"] == 3
    # Over the 64 MiB limit: 413 with a message that says so.
    got, err = error_of(stories, "/v1/completions", b" " * ((64 << 20) + 1))
    assert got == 413 and "64 MiB" in err["message"], err
    # Multipart forms: 415; GET on a POST route: 405 naming the method.
    got, err = error_of(stories, "/v1/completions", b"--x\r\n\r\n--x--\r\n",
                        headers={"Content-Type": "multipart/form-data; boundary=x"})
    assert got == 415 and "JSON" in err["message"], err
    status, headers, raw = stories.request("GET", "/v1/chat/completions")
    assert status == 405 and headers.get("Allow") == "POST" and "POST" in json.loads(raw)["error"]["message"]
    # The server serves on afterwards.
    assert stories.request("GET", "/health")[0] == 200


def test_prompt_longer_than_context(stories):
    ctx = stories.client().models.list().data[0].model_extra.get("max_model_len")
    assert ctx and ctx > 0
    got, err = error_of(stories, "/v1/completions", {"prompt": [5] * (ctx + 10), "max_tokens": 4})
    assert got == 400
    assert err["code"] == "context_length_exceeded"
    assert str(ctx) in err["message"] and str(ctx + 10) in err["message"]


def test_metrics_format(stories):
    before, _ = parse_metrics(stories.metrics())
    r = stories.client().completions.create(model="stories260K", prompt=PROMPT, max_tokens=5, temperature=0,
                                            extra_body={"ignore_eos": True})
    text = stories.metrics()
    samples, families = parse_metrics(text)
    for name in ("tandem_time_to_first_token_seconds", "tandem_inter_token_latency_seconds",
                 "tandem_e2e_request_latency_seconds"):
        assert families[name] == "histogram"
        buckets = sorted(((float(k.split('le="')[1].rstrip('"}')), v) for k, v in samples.items()
                          if k.startswith(name + "_bucket")))
        assert buckets[-1][0] == math.inf
        counts = [v for _, v in buckets]
        assert counts == sorted(counts), f"{name} buckets not cumulative"
        assert counts[-1] == samples[name + "_count"]
        assert samples[name + "_sum"] >= 0
    for name in ("tandem_prompt_tokens", "tandem_generation_tokens", "tandem_requests_finished",
                 "tandem_preemptions", "tandem_prefix_cache_hit_tokens", "tandem_prefix_cache_queried_tokens"):
        assert families[name] == "counter", name
    for name in ("tandem_requests_running", "tandem_requests_waiting", "tandem_requests_swapped",
                 "tandem_kv_blocks_used", "tandem_kv_blocks_free", "tandem_prefix_cache_hit_ratio"):
        assert families[name] == "gauge", name
    assert 0 <= samples["tandem_prefix_cache_hit_ratio"] <= 1
    assert samples["tandem_generation_tokens_total"] - before["tandem_generation_tokens_total"] >= 5
    assert samples["tandem_prompt_tokens_total"] - before["tandem_prompt_tokens_total"] >= r.usage.prompt_tokens
    assert samples["tandem_requests_finished_total"] > before["tandem_requests_finished_total"]
    assert samples["tandem_time_to_first_token_seconds_count"] > before["tandem_time_to_first_token_seconds_count"]
    # Steps by phase add up to the step count; this request ran at least its prompt and 4 decode rows.
    phases = ("decode", "prefill", "mixed")
    assert families["tandem_engine_phase_steps"] == "counter"
    assert sum(samples[f'tandem_engine_phase_steps_total{{phase="{p}"}}'] for p in phases) == \
        samples["tandem_engine_steps_total"]
    rows_key = 'tandem_engine_phase_rows_total{{phase="{}"}}'.format
    rows = sum(samples[rows_key(p)] - before[rows_key(p)] for p in phases)
    assert rows >= r.usage.prompt_tokens + 4
    assert samples['tandem_engine_phase_seconds_total{phase="decode"}'] > 0


# --- servers of their own -----------------------------------------------------


def test_api_key():
    srv = start_server(STORIES, "--api-key", "sekrit")
    try:
        assert srv.request("GET", "/health")[0] == 200
        for method, path in (("GET", "/v1/models"), ("GET", "/metrics"), ("POST", "/v1/completions")):
            body = {"prompt": "x", "max_tokens": 1} if method == "POST" else None
            status, _, raw = srv.request(method, path, body=body)
            assert status == 401, path
            assert json.loads(raw)["error"]["code"] == "invalid_api_key"
            status, _, _ = srv.request(method, path, body=body, headers={"Authorization": "Bearer wrong"})
            assert status == 401, path
            status, _, _ = srv.request(method, path, body=body, headers={"Authorization": "Bearer sekrit"})
            assert status == 200, path
        with pytest.raises(openai.AuthenticationError):
            srv.client(api_key="nope").models.list()
        r = srv.client(api_key="sekrit").completions.create(model="stories260K", prompt=PROMPT, max_tokens=3)
        assert r.choices
    finally:
        assert srv.stop() == 0


def test_overload_gets_429_not_a_hang():
    srv = start_server(STORIES, "--max-seqs", "1", "--max-waiting", "1")
    try:
        body = {"model": "stories260K", "prompt": PROMPT, "max_tokens": 2000, "ignore_eos": True}
        go = threading.Barrier(16)

        def raw(_):
            go.wait(timeout=30)
            status, _, raw_body = srv.request("POST", "/v1/completions", body=body, timeout=120)
            return status, json.loads(raw_body)

        def via_client(_):
            go.wait(timeout=30)
            try:
                r = srv.client().completions.create(model="stories260K", prompt=PROMPT, max_tokens=2000,
                                                    extra_body={"ignore_eos": True})
                return 200, r.usage.completion_tokens
            except openai.RateLimitError as e:
                return 429, e.body

        t0 = time.monotonic()
        with cf.ThreadPoolExecutor(16) as pool:
            raw_futs = [pool.submit(raw, i) for i in range(12)]
            client_futs = [pool.submit(via_client, i) for i in range(4)]
            results = [f.result(timeout=240) for f in raw_futs]
            client_results = [f.result(timeout=240) for f in client_futs]
        assert time.monotonic() - t0 < 240
        statuses = [s for s, _ in results] + [s for s, _ in client_results]
        assert set(statuses) <= {200, 429}, statuses
        assert statuses.count(200) >= 1, statuses
        # At most one runs and one waits at a time, and each takes a while:
        # most of a simultaneous burst of 16 must be turned away.
        assert statuses.count(429) >= 8, statuses
        for status, j in results:
            if status == 429:
                assert j["error"]["message"] and j["error"]["type"]
            else:
                assert j["usage"]["completion_tokens"] == 2000
        samples, _ = parse_metrics(srv.metrics())
        assert samples["tandem_requests_rejected_total"] == statuses.count(429)
        # Three prompts where one may run and one wait: the third is refused, the whole request
        # gets the 429, and the two already submitted are cancelled, not left to run. (Waited
        # for: the engine takes the cancellations at its next step, whenever that comes.)
        status, headers, raw_body = srv.request("POST", "/v1/completions", body={**body, "prompt": [PROMPT] * 3})
        assert status == 429, raw_body
        assert headers.get("Retry-After") == "1"
        cancelled = samples["tandem_requests_cancelled_total"]
        after = wait_metrics(srv, lambda m: m["tandem_requests_cancelled_total"] >= cancelled + 2
                             and m["tandem_requests_running"] == 0 and m["tandem_requests_waiting"] == 0
                             and m["tandem_kv_blocks_used"] == 0)
        assert after["tandem_requests_cancelled_total"] == cancelled + 2
    finally:
        assert srv.stop() == 0


def test_port_in_use_is_an_error(stories):
    r = subprocess.run([CLI, "serve", "-m", STORIES, "--host", "127.0.0.1", "--port", str(stories.port), "-t", "1"],
                       capture_output=True, timeout=60, stdin=subprocess.DEVNULL)
    assert r.returncode != 0
    assert b"cannot listen" in r.stderr


def test_bad_flags_are_refused():
    for flags, msg in ((["--policy", "fastest"], b"--policy"), (["--kv-memory", "12Q"], b"--kv-memory"),
                       (["--port", "70000"], b"--port"), (["--swap-space", "-1G"], b"--swap-space")):
        r = subprocess.run([CLI, "serve", "-m", STORIES, "--host", "127.0.0.1", *flags], capture_output=True,
                           timeout=60, stdin=subprocess.DEVNULL)
        assert r.returncode != 0, flags
        assert msg in r.stderr, (flags, r.stderr)


@pytest.mark.parametrize("swap", [None, "64M"], ids=["recompute", "swap"])
def test_preemption_with_a_small_kv_pool(swap):
    # 16 blocks of 16 tokens for 6 requests that each grow to ~200 tokens:
    # the scheduler must preempt, and everything must still finish and free.
    # With --swap-space the preempted K/V waits in host memory instead of being recomputed.
    extra = ["--swap-space", swap] if swap else []
    srv = start_server(STORIES, "--kv-tokens", "256", "--ctx-size", "256", "--no-prefix-cache", *extra)
    try:
        bodies = [{"model": "stories260K", "prompt": f"{PROMPT} {i}", "max_tokens": 190, "temperature": 0,
                   "ignore_eos": True} for i in range(6)]
        alone = [json.loads(srv.request("POST", "/v1/completions", body=b)[2])["choices"][0]["text"] for b in bodies]
        with cf.ThreadPoolExecutor(6) as pool:
            together = list(pool.map(lambda b: srv.request("POST", "/v1/completions", body=b, timeout=180), bodies,
                                     timeout=240))
        for (status, _, raw), want in zip(together, alone):
            assert status == 200, raw
            j = json.loads(raw)
            assert j["usage"]["completion_tokens"] == 190
            assert j["choices"][0]["text"] == want  # recompute after preemption gives the same tokens
        samples = wait_metrics(srv, lambda m: m["tandem_requests_running"] == 0)
        assert samples["tandem_preemptions_total"] > 0
        if swap:
            assert samples["tandem_swap_outs_total"] == samples["tandem_preemptions_total"]
        else:
            assert samples["tandem_swap_outs_total"] == 0
        assert samples["tandem_requests_swapped"] == 0
        assert samples["tandem_kv_blocks_used"] == 0
        assert samples["tandem_kv_blocks_free"] == samples["tandem_kv_blocks_total"] == 16
    finally:
        assert srv.stop() == 0


def test_sigterm_during_a_stream_shuts_down():
    srv = start_server(STORIES)
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=30)
    body = {"prompt": PROMPT, "max_tokens": 2000, "n": 16, "stream": True, "ignore_eos": True}
    conn.request("POST", "/v1/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200
    assert resp.read(5) == b"data:"
    t0 = time.monotonic()
    assert srv.stop(timeout=20) == 0
    assert time.monotonic() - t0 < 20
    conn.close()


# --- chat (Gemma 3 270M) -------------------------------------------------------


def test_chat(gemma):
    c = gemma.client()
    msgs = [{"role": "user", "content": "Name three colors."}]
    want = run_cli("run", "-m", gemma_path(), "--chat", msgs[0]["content"], "-n", "16", "--temp", "0",
                   "-t", "2", "-c", "1024")
    assert want.endswith("\n")
    want = want[:-1]
    r = c.chat.completions.create(model="gemma-test", messages=msgs, max_tokens=16, temperature=0)
    assert r.object == "chat.completion"
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content == want
    assert r.usage.completion_tokens <= 16 and r.usage.prompt_tokens > 5
    chunks = list(c.chat.completions.create(model="gemma-test", messages=msgs, max_tokens=16, temperature=0,
                                            stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == want
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")


def test_chat_logprobs_and_system(gemma):
    c = gemma.client()
    r = c.chat.completions.create(model="gemma-test", max_tokens=6, temperature=0, logprobs=True, top_logprobs=2,
                                  messages=[{"role": "system", "content": "Answer in one word."},
                                            {"role": "user", "content": "What is the color of the sky?"}])
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens
    for t in content:
        assert t.logprob <= 0 and 1 <= len(t.top_logprobs) <= 2
        assert all(0 <= b <= 255 for b in t.bytes)
        assert t.logprob == pytest.approx(max(a.logprob for a in t.top_logprobs), abs=1e-5)  # greedy
    if r.choices[0].finish_reason == "length":
        assert b"".join(bytes(t.bytes) for t in content).decode() == r.choices[0].message.content


def test_gemma_json_object(gemma):
    """response_format json_object / json_schema: the output is one JSON object (fitting the schema)
    and ends with it (without it the model goes on to the next few-shot line), greedy, sampled,
    streamed; chat takes it too."""
    c = gemma.client()
    prompt = ('Person: Ada, 36, London\nJSON: {"name": "Ada", "age": 36, "city": "London"}\n'
              'Person: Bob, 41, Paris\nJSON:')
    fmt = {"type": "json_object"}
    free = c.completions.create(model="gemma-test", prompt=prompt, max_tokens=30, temperature=0).choices[0].text
    assert "\n" in free.strip()  # the premise: unconstrained, it does not stop at the object
    r = c.completions.create(model="gemma-test", prompt=prompt, max_tokens=60, temperature=0,
                             extra_body={"response_format": fmt})
    ch = r.choices[0]
    assert ch.finish_reason == "stop" and json.loads(ch.text) == {"name": "Bob", "age": 41, "city": "Paris"}
    streamed = "".join(chunk.choices[0].text for chunk in c.completions.create(
        model="gemma-test", prompt=prompt, max_tokens=60, temperature=0, stream=True,
        extra_body={"response_format": fmt}) if chunk.choices)
    assert streamed == ch.text
    r = c.completions.create(model="gemma-test", prompt=prompt, max_tokens=60, temperature=1.0, seed=3, n=4,
                             extra_body={"response_format": fmt})
    for ch in r.choices:
        assert ch.finish_reason == "stop" and isinstance(json.loads(ch.text), dict), ch.text
    msgs = [{"role": "user", "content": "Describe a cat as JSON."}]
    r = c.chat.completions.create(model="gemma-test", messages=msgs, max_tokens=24, temperature=0,
                                  response_format=fmt)
    assert r.choices[0].message.content.lstrip().startswith("{")
    # json_schema: the object fits the schema; here the model's own answer already does.
    person = {"type": "object", "additionalProperties": False, "required": ["name", "age", "city"],
              "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                             "city": {"$ref": "#/$defs/City"}},
              "$defs": {"City": {"enum": ["Paris", "London", "Oslo"]}}}
    schema_fmt = {"type": "json_schema", "json_schema": {"name": "person", "strict": True, "schema": person}}
    r = c.completions.create(model="gemma-test", prompt=prompt, max_tokens=60, temperature=0,
                             extra_body={"response_format": schema_fmt})
    assert r.choices[0].finish_reason == "stop"
    assert json.loads(r.choices[0].text) == {"name": "Bob", "age": 41, "city": "Paris"}
    # A schema the model would not follow on its own: every sampled object still fits it.
    pet = {"type": "object", "required": ["kind", "legs"],
           "properties": {"kind": {"enum": ["cat", "bird"]}, "legs": {"type": "integer"},
                          "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 2}}}
    r = c.completions.create(model="gemma-test", prompt=prompt, max_tokens=80, temperature=1.0, seed=5, n=3,
                             extra_body={"response_format": {"type": "json_schema",
                                                             "json_schema": {"name": "pet", "schema": pet}}})
    for ch in r.choices:
        if ch.finish_reason != "stop":
            continue
        obj = json.loads(ch.text)
        assert set(obj) <= {"kind", "legs", "tags"} and {"kind", "legs"} <= set(obj), ch.text
        assert obj["kind"] in ("cat", "bird") and isinstance(obj["legs"], int), ch.text
        assert len(obj.get("tags", [])) <= 2 and all(isinstance(t, str) for t in obj.get("tags", [])), ch.text
    with pytest.raises(openai.BadRequestError, match="pattern"):
        c.chat.completions.create(model="gemma-test", messages=msgs, max_tokens=4, response_format={
            "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "string", "pattern": "a"}}})


def test_render_gives_the_token_ids_a_request_runs(stories, gemma):
    """/v1/completions/render and /v1/chat/completions/render, as vLLM answers
    them: the ids are those the request itself would run."""
    status, _, body = stories.request("POST", "/v1/completions/render",
                                      {"prompt": ["Once upon a time", "The end"], "max_tokens": 7,
                                       "temperature": 0.5, "stream": True})
    assert status == 200, body
    out = json.loads(body)
    assert isinstance(out, list) and len(out) == 2
    status, _, tok = stories.request("POST", "/tokenize", {"prompt": "Once upon a time"})
    assert out[0]["token_ids"] == json.loads(tok)["tokens"]
    status, _, body = stories.request("POST", "/v1/completions/render", {"prompt": [1, 2, 3]})
    assert json.loads(body)[0]["token_ids"] == [1, 2, 3]
    assert out[0]["request_id"].startswith("cmpl-") and out[0]["request_id"] != out[1]["request_id"]
    assert out[0]["sampling_params"]["max_tokens"] == 7 and out[0]["sampling_params"]["temperature"] == 0.5
    assert out[0]["stream"] is True and out[0]["model"]
    # Errors are the request's own: a wrong model, a prompt out of the vocabulary.
    status, _, body = stories.request("POST", "/v1/completions/render", {"model": "nope", "prompt": "x"})
    assert status == 404 and json.loads(body)["error"]["code"] == "model_not_found"
    status, _, body = stories.request("POST", "/v1/completions/render", {"prompt": [[10 ** 6]]})
    assert status == 400
    # Chat: one entry, the conversation as the chat template renders it.
    messages = [{"role": "user", "content": "Hello!"}]
    status, _, body = gemma.request("POST", "/v1/chat/completions/render", {"messages": messages})
    assert status == 200, body
    chat = json.loads(body)
    assert isinstance(chat, dict) and chat["request_id"].startswith("chatcmpl-")
    r = gemma.client().chat.completions.create(model="gemma-test", messages=messages, max_tokens=1)
    assert len(chat["token_ids"]) == r.usage.prompt_tokens

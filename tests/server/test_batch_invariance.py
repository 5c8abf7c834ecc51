"""Batch invariance: a request's greedy output does not depend on what else is
in the batch. 32 requests with different prompts and lengths, first one at a
time, then all at once: byte-identical text."""
import concurrent.futures as cf
import threading

import pytest

from harness import STORIES, parse_metrics, start_server

SUBJECTS = ["a little girl named Lily", "a big brown dog", "a tiny red bird", "a boy named Tom", "an old cat",
            "a happy frog", "a small blue car", "a kind old man"]
PLACES = ["in the park", "near the sea", "in a big house", "under a tree"]


def requests_32():
    out = []
    for i in range(32):
        prompt = f"Once upon a time, there was {SUBJECTS[i % 8]} who lived {PLACES[i % 4]}."
        prompt += " One day," * (i % 5)  # prompt lengths vary too
        out.append({"model": "stories260K", "prompt": prompt, "max_tokens": 8 + (i * 7) % 57, "temperature": 0,
                    "ignore_eos": i % 3 == 0})
    return out


def text_of(srv, body):
    import json

    status, _, raw = srv.request("POST", "/v1/completions", body=body, timeout=180)
    assert status == 200, raw
    return json.loads(raw)["choices"][0]["text"]


def stream_text(srv, body):
    client = srv.client()
    kw = {k: v for k, v in body.items() if k != "ignore_eos"}
    text = ""
    for ch in client.completions.create(**kw, stream=True, extra_body={"ignore_eos": body["ignore_eos"]}):
        if ch.choices:
            text += ch.choices[0].text
    return text


@pytest.mark.parametrize("spec", [[], ["--spec", "ngram", "--draft-max", "6", "--draft-fixed"]],
                         ids=["plain", "speculative"])
def test_32_concurrent_greedy_equal_one_at_a_time(spec):
    # A server of its own, without the prefix cache, so the concurrent run
    # recomputes every prompt inside mixed batches instead of reusing blocks.
    # With speculation the batched run verifies drafts; "alone" opts out of it
    # per request, so the two sides also compare speculation with plain decoding.
    srv = start_server(STORIES, "--no-prefix-cache", *spec)
    try:
        reqs = requests_32()
        alone = [text_of(srv, {**r, "speculative": False}) for r in reqs]
        assert len(set(alone)) > 16  # the prompts really differ
        go = threading.Barrier(32)

        def together(i):
            go.wait(timeout=60)
            # Half stream, half do not: both paths must give the same bytes.
            return stream_text(srv, reqs[i]) if i % 2 else text_of(srv, reqs[i])

        with cf.ThreadPoolExecutor(32) as pool:
            batched = list(pool.map(together, range(32), timeout=300))
        for i, (a, b) in enumerate(zip(alone, batched)):
            assert a == b, f"request {i} differs in a batch:\nalone:   {a!r}\nbatched: {b!r}"
        samples, _ = parse_metrics(srv.metrics())
        if spec:
            assert samples["tandem_spec_drafted_tokens_total"] > 0
            assert 0 < samples["tandem_spec_accepted_tokens_total"] <= samples["tandem_spec_drafted_tokens_total"]
            assert samples["tandem_spec_step_tokens_total"] > samples["tandem_spec_steps_total"]
        else:
            assert samples["tandem_spec_drafted_tokens_total"] == 0
    finally:
        assert srv.stop() == 0

"""Sparse attention on the server: the request's `sparse_attention` field (0: dense, a
budget where the server runs --sparse-attention), its 400s, the blocks read against held
in /metrics, and budgets refused at start-up with the reason."""
import subprocess

import openai
import pytest

from harness import CLI, STORIES, parse_metrics, start_server

PROMPT = "Lily and Tom went to the park. They saw a big dog."


def complete(client, model, **extra):
    r = client.completions.create(model=model, prompt=PROMPT, max_tokens=200, temperature=0,
                                  extra_body={"ignore_eos": True, **extra})
    assert r.usage.completion_tokens == 200
    return r.choices[0].text


def test_request_budget_dense_and_metrics():
    dense_srv = start_server(STORIES)
    try:
        client = dense_srv.client()
        model = client.models.list().data[0].id
        dense = complete(client, model)
        # A budget on a server without --sparse-attention is refused, naming the field.
        with pytest.raises(openai.BadRequestError, match="sparse_attention.*--sparse-attention"):
            complete(client, model, sparse_attention=96)
    finally:
        assert dense_srv.stop() == 0
    srv = start_server(STORIES, "--sparse-attention", "96")
    try:
        client = srv.client()
        assert complete(client, model, sparse_attention=0) == dense
        samples, _ = parse_metrics(srv.metrics())
        assert samples["tandem_sparse_attention_blocks_read_total"] == 0
        sparse = complete(client, model)
        samples, _ = parse_metrics(srv.metrics())
        read = samples["tandem_sparse_attention_blocks_read_total"]
        held = samples["tandem_sparse_attention_blocks_held_total"]
        assert 0 < read < held
        assert sparse != dense  # 96 positions of ~215: the selection changed what was read
        assert complete(client, model, sparse_attention=512) == dense  # the whole context fits
        with pytest.raises(openai.BadRequestError, match="multiple of the block size"):
            complete(client, model, sparse_attention=100)
        with pytest.raises(openai.BadRequestError, match="below its sinks"):
            complete(client, model, sparse_attention=64)
    finally:
        assert srv.stop() == 0


@pytest.mark.parametrize("args,says", [
    (["--sparse-attention", "100"], "not a positive multiple of the block size 16"),
    (["--sparse-attention", "48"], "below its sinks (16) plus its recent window (64)"),
    (["--sparse-attention", "96", "--kv-window", "64"], "cannot be combined with a streaming window"),
])
def test_bad_budgets_stop_at_start_up(args, says):
    r = subprocess.run([CLI, "serve", "-m", STORIES, "--port", "0", "-t", "1", *args], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode != 0
    assert says in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and "terminate called" not in r.stderr

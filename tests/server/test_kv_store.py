"""serve --kv-store: a restarted server, and another server sharing the
folder, read a prompt's blocks back (cached_tokens and the store's metrics
show it) and answer exactly as before; a damaged file is refused with a
warning and recomputed. stories260K, greedy, through the openai client."""
from pathlib import Path

from harness import STORIES, Server, parse_metrics, wait_metrics

BLOCK = 16
PROMPT = ("Once upon a time there was a little girl named Lily. She loved to play outside in the park "
          "with her friends. One day she saw a big red ball under a tree and ran to get it. ") * 2


def complete(srv):
    r = srv.client().completions.create(model="stories260K.gguf", prompt=PROMPT, max_tokens=16, temperature=0)
    return r.choices[0].text, r.usage


def written(srv, n):
    return wait_metrics(srv, lambda s: s.get("tandem_kv_store_blocks_written_total", 0) >= n)


def test_restart_reads_the_prompt_back(tmp_path):
    store = str(tmp_path / "kv")
    a = Server(STORIES, "--kv-store", store)
    try:
        text, usage = complete(a)
        full = usage.prompt_tokens // BLOCK
        assert usage.prompt_tokens_details.cached_tokens == 0
        written(a, full)
    finally:
        assert a.stop() == 0
    assert len(list(Path(store).glob("*.kvb"))) >= full

    b = Server(STORIES, "--kv-store", store)
    try:
        again, usage2 = complete(b)
        assert again == text
        assert usage2.prompt_tokens_details.cached_tokens == min(full * BLOCK, usage2.prompt_tokens - 1)
        m, _ = parse_metrics(b.metrics())
        assert m["tandem_kv_store_blocks_read_total"] == full
        assert m["tandem_kv_store_read_failures_total"] == 0
        assert m["tandem_kv_store_bytes_read_total"] > 0

        # A damaged file: refused with a warning, recomputed, the same answer.
        first = sorted(Path(store).glob("*.kvb"), key=lambda p: p.stat().st_mtime)
        for p in first:
            data = bytearray(p.read_bytes())
            data[len(data) // 2] ^= 0xFF
            p.write_bytes(bytes(data))
    finally:
        assert b.stop() == 0

    c = Server(STORIES, "--kv-store", store)
    try:
        again, usage3 = complete(c)
        assert again == text
        assert usage3.prompt_tokens_details.cached_tokens == 0
        m, _ = parse_metrics(c.metrics())
        assert m["tandem_kv_store_read_failures_total"] == 1
    finally:
        assert c.stop() == 0
    assert "warning: kv-store:" in c.log_text() and "(checksum)" in c.log_text(), c.log_text()


def test_instances_share_the_folder(tmp_path):
    store = str(tmp_path / "kv")
    a = Server(STORIES, "--kv-store", store)
    b = Server(STORIES, "--kv-store", store)
    try:
        text, usage = complete(a)
        written(a, usage.prompt_tokens // BLOCK)
        again, usage2 = complete(b)
        assert again == text
        assert usage2.prompt_tokens_details.cached_tokens >= (usage.prompt_tokens // BLOCK) * BLOCK - 1
    finally:
        assert a.stop() == 0
        assert b.stop() == 0

"""KV cache types on the server: the start-up log and /metrics say the type and the
tokens the pool holds, a compressed pool holds more tokens in the same memory and
serves requests, and a type the model or the flags cannot take stops the server
at start-up with the reason."""
import subprocess

import pytest

from harness import CLI, STORIES, parse_metrics, require_gemma, start_server, wait_metrics


def test_quantized_pool_holds_more_tokens_and_serves():
    path = require_gemma()
    held = {}
    for kv in ("f16", "q8_0", "q4_0"):
        srv = start_server(path, "--ctx-size", "256", "--kv-memory", "16M", "--kv-type", kv, threads=2)
        try:
            samples, _ = parse_metrics(srv.metrics())
            info = [k for k in samples if k.startswith("vllm:cache_config_info")]
            assert len(info) == 1 and f'cache_dtype="{kv}"' in info[0], info
            held[kv] = samples["tandem_kv_tokens_total"]
            # Gemma 3 270M's pages: 3 global layers, and 5 groups of 3 sliding-window layers.
            assert held[kv] * 6 == samples["tandem_kv_blocks_total"] * 16
            client = srv.client()
            r = client.completions.create(model=client.models.list().data[0].id, prompt="The GNU General Public License is",
                                                max_tokens=12, temperature=0)
            assert r.usage.completion_tokens == 12 and r.choices[0].text.strip()
        finally:
            assert srv.stop() == 0
        assert f"KV cache {kv}, {int(held[kv])} tokens" in srv.log_text()
        assert "(sliding-window layers keep 512 positions)" in srv.log_text()
    # 34 and 18 bytes per 32 elements against 64.
    assert held["q8_0"] >= 1.85 * held["f16"]
    assert held["q4_0"] >= 3.5 * held["f16"]


@pytest.mark.parametrize("args,says", [
    (["--kv-type", "q5_1"], "q5_1"),
    (["--cache-type-v", "int8"], "--cache-type-v"),
    (["--kv-rotation", "sometimes"], "--kv-rotation"),
    (["--kv-smoothing", "maybe"], "--kv-smoothing"),
    (["--cache-type-k", "q8_0"], "8 elements"),  # stories260K's heads are too small for 32-blocks
    (["--kv-window", "4", "--kv-sinks", "8"], "smaller than its sinks"),
    (["--ctx-size", "128", "--kv-window", "200"], "needs a context of at least 220"),
    (["--kv-heavy", "32"], "--kv-heavy 32 needs a streaming window"),
    (["--kv-window", "32", "--kv-heavy", "20"], "not a multiple of the block size (16)"),
    (["--kv-window", "32", "--kv-heavy", "32", "--spec", "ngram"], "does not combine with speculative decoding"),
])
def test_bad_cache_types_stop_at_start_up(args, says):
    r = subprocess.run([CLI, "serve", "-m", STORIES, "--port", "0", "-t", "1", *args], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode != 0
    assert says in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and "terminate called" not in r.stderr


@pytest.mark.parametrize("heavy", [[], ["--kv-heavy", "32"]], ids=["window", "heavy-hitters"])
def test_streaming_window_generates_past_the_context(heavy):
    # stories260K, a context of 128: a window of 32 after 4 sinks keeps going
    # (with heavy hitters: 32 more positions kept between).
    srv = start_server(STORIES, "--ctx-size", "128", "--kv-window", "32", "--kv-sinks", "4", "--cache-type-k", "f32",
                       *heavy)
    try:
        client = srv.client()
        r = client.completions.create(model=client.models.list().data[0].id, prompt="Once upon a time",
                                      max_tokens=400, temperature=0, extra_body={"ignore_eos": True})
        assert r.usage.completion_tokens == 400 and r.choices[0].finish_reason == "length"
        # A prompt longer than the context slides through the window too.
        long = " ".join(["Once upon a time there was a little dog."] * 40)
        r = client.completions.create(model=client.models.list().data[0].id, prompt=long, max_tokens=20,
                                      temperature=0, extra_body={"ignore_eos": True})
        assert r.usage.prompt_tokens > 128 and r.usage.completion_tokens == 20
        # The blocks go back at the end of the step that sent the last token,
        # which may follow the response.
        wait_metrics(srv, lambda m: m["tandem_kv_blocks_used"] == 0)
    finally:
        assert srv.stop() == 0

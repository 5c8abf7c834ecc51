"""tandem.LLM against the CLI, llama.cpp's scores and itself: greedy output,
batch invariance, streaming, logprobs, chat, errors, the GIL, Ctrl-C."""
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from conftest import CLI, REPO, STORIES, gemma_path
from tandem import LLM, SamplingParams

PROMPTS = ["Once upon a time", "The little dog", "Lily and Tom went to the park. They saw",
           "One day, a big bird", "Sam had a red ball", "The sun was hot and"]


def cli_run(model, *args):
    out = subprocess.run([CLI, "run", "-m", model, "-t", "1", "--temp", "0", *args],
                         capture_output=True, timeout=120)
    assert out.returncode == 0, out.stderr.decode()
    return out.stdout.decode()


def test_greedy_equals_tandem_run(stories):
    sp = SamplingParams(temperature=0, max_tokens=40)
    outs = stories.generate(PROMPTS[:3], sp)
    for prompt, o in zip(PROMPTS[:3], outs):
        assert o.prompt == prompt and o.finished
        assert o.prompt_token_ids == stories.get_tokenizer().encode(prompt)
        c = o.outputs[0]
        assert c.text == cli_run(STORIES, "-p", prompt, "-n", "40")
        assert c.finish_reason in ("stop", "length") and 0 < len(c.token_ids) <= 40
        assert stories.get_tokenizer().decode(c.token_ids).strip() == c.text.strip()
        m = o.metrics
        assert m.prompt_tokens == len(o.prompt_token_ids) and m.generated_tokens == len(c.token_ids)
        assert m.prefill_s > 0 and m.ttft_s >= m.prefill_s and m.decode_s >= 0


def test_batch_equals_each_prompt_alone(stories):
    """One batch of prompts of different lengths, sampled with seeds, gives
    each prompt's tokens exactly as it gets alone."""
    params = [SamplingParams(temperature=0.9, seed=100 + i, max_tokens=24 + 3 * i, ignore_eos=True)
              for i in range(len(PROMPTS))]
    batch = stories.generate(PROMPTS, params)
    assert [o.prompt for o in batch] == PROMPTS
    for prompt, p, o in zip(PROMPTS, params, batch):
        alone = stories.generate(prompt, p)[0]
        assert o.outputs[0].token_ids == alone.outputs[0].token_ids
        assert o.outputs[0].text == alone.outputs[0].text
        assert len(o.outputs[0].token_ids) == p.max_tokens and o.outputs[0].finish_reason == "length"


def test_token_id_prompts_and_n(stories):
    ids = stories.get_tokenizer().encode("Once upon a time")
    a = stories.generate({"prompt_token_ids": ids}, SamplingParams(temperature=0, max_tokens=12))[0]
    b = stories.generate("Once upon a time", SamplingParams(temperature=0, max_tokens=12))[0]
    c = stories.generate(prompt_token_ids=[ids], sampling_params=SamplingParams(temperature=0, max_tokens=12))[0]
    assert a.prompt is None and a.prompt_token_ids == ids
    assert a.outputs[0].token_ids == b.outputs[0].token_ids == c.outputs[0].token_ids
    two = stories.generate("Once upon a time", SamplingParams(n=2, temperature=1.0, seed=7, max_tokens=16,
                                                             ignore_eos=True))[0]
    assert [c.index for c in two.outputs] == [0, 1]
    assert all(len(c.token_ids) == 16 and c.text for c in two.outputs)


def test_stream_reassembles_to_generate(stories):
    params = [SamplingParams(temperature=0, max_tokens=30), SamplingParams(temperature=0.8, seed=3, max_tokens=20)]
    whole = stories.generate(PROMPTS[:2], params)
    text = {0: [], 1: []}
    ids = {0: [], 1: []}
    finished = {}
    for piece in stories.stream(PROMPTS[:2], params):
        i = int(piece.request_id) - int(whole[0].request_id) - 2  # stream's ids follow generate's
        assert i in (0, 1) and piece.prompt == PROMPTS[i]
        text[i].append(piece.outputs[0].text)
        ids[i].extend(piece.outputs[0].token_ids)
        if piece.finished:
            finished[i] = piece
    for i in (0, 1):
        assert "".join(text[i]) == whole[i].outputs[0].text
        assert ids[i] == whole[i].outputs[0].token_ids
        assert finished[i].outputs[0].finish_reason == whole[i].outputs[0].finish_reason
        assert finished[i].metrics.generated_tokens == len(ids[i])
    # Leaving a stream early cancels the rest; the engine goes on.
    for piece in stories.stream(PROMPTS[0], SamplingParams(max_tokens=200, ignore_eos=True)):
        break
    m = stories.engine_metrics()
    assert m["running"] == 0 and m["waiting"] == 0


def test_scores_match_llama_cpp(stories_f32):
    """Prompt log-probabilities (score, and prompt_logprobs) against
    llama.cpp's (scripts/gen_prompt_logprob_refs.py, KV f32)."""
    refs = json.loads((REPO / "tests/data/llamacpp/prompt_logprobs_stories260k.json").read_text())
    scores = stories_f32.score([c["prompt"] for c in refs["cases"]])
    for case, s in zip(refs["cases"], scores):
        assert s.prompt_token_ids == case["prompt_ids"]
        assert s.token_logprobs[0] is None
        assert s.token_logprobs[1:] == pytest.approx(case["logprobs"], abs=1e-3)
        assert s.logprob == pytest.approx(sum(case["logprobs"]), abs=1e-2)
    o = stories_f32.generate(refs["cases"][0]["prompt"], SamplingParams(max_tokens=1, prompt_logprobs=2))[0]
    assert o.prompt_logprobs[0] is None and len(o.prompt_logprobs) == len(o.prompt_token_ids)
    for tok, pos, want in zip(o.prompt_token_ids[1:], o.prompt_logprobs[1:], refs["cases"][0]["logprobs"]):
        assert pos[tok].logprob == pytest.approx(want, abs=1e-3)
        ranked = sorted((lp for lp in pos.values() if lp.rank is not None), key=lambda lp: lp.rank)
        assert [lp.rank for lp in ranked] == [1, 2] and ranked[0].logprob >= ranked[1].logprob


def test_generation_logprobs_are_the_scores_of_its_text(stories_f32):
    g = stories_f32.generate(PROMPTS[0], SamplingParams(temperature=0, max_tokens=12, logprobs=2,
                                                        ignore_eos=True))[0].outputs[0]
    assert len(g.logprobs) == 12
    for tok, pos in zip(g.token_ids, g.logprobs):
        assert pos[tok].rank == 1  # greedy: the chosen token is the most likely
        assert len([lp for lp in pos.values() if lp.rank]) == 2
    assert g.cumulative_logprob == pytest.approx(sum(pos[t].logprob for t, pos in zip(g.token_ids, g.logprobs)))
    ids = stories_f32.get_tokenizer().encode(PROMPTS[0]) + g.token_ids
    s = stories_f32.score([ids])[0]
    assert s.token_logprobs[-12:] == pytest.approx([pos[t].logprob for t, pos in zip(g.token_ids, g.logprobs)],
                                                   abs=1e-4)


def test_errors_are_python_exceptions(stories, tmp_path):
    with pytest.raises(OSError, match="no_such_model.gguf"):
        LLM(model=str(tmp_path / "no_such_model.gguf"))
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\x03\x00\x00\x00" + b"\xff" * 64)
    with pytest.raises(ValueError, match="bad.gguf|tensor|count|GGUF"):
        LLM(model=str(bad))
    with pytest.raises(ValueError, match="unknown engine option: thread_count"):
        LLM(model=STORIES, thread_count=2)
    with pytest.raises(ValueError, match="kv_cache_dtype|q3_0"):
        LLM(model=STORIES, kv_cache_dtype="q3_0")
    with pytest.raises(ValueError, match="leaves no room in the context"):
        stories.generate("Once upon a time " * 600, SamplingParams(max_tokens=4))
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams(temperature=-1)
    with pytest.raises(ValueError, match="top_p must be in"):
        stories.generate("Once", SamplingParams(top_p=1.5))
    with pytest.raises(ValueError, match="prompt 1: prompt token id 100000 is outside the vocabulary"):
        stories.generate([[1, 403], [1, 100000]], SamplingParams(max_tokens=2))
    with pytest.raises(ValueError, match="min_tokens"):
        SamplingParams(min_tokens=3)
    with pytest.raises(NotImplementedError, match="chat"):
        stories.chat([{"role": "user", "content": "Hello"}])
    # None of that left anything in the engine.
    m = stories.engine_metrics()
    assert m["running"] == 0 and m["waiting"] == 0
    assert stories.generate("Once", SamplingParams(temperature=0, max_tokens=4))[0].outputs[0].token_ids


def test_gil_released_while_generating(stories):
    """With the interpreter's thread switching all but off, another thread
    runs during generate only if the engine steps with the GIL released."""
    ticks = [0]
    stop = threading.Event()

    def tick():
        while not stop.is_set():
            ticks[0] += 1
            time.sleep(0.0005)

    old = sys.getswitchinterval()
    sys.setswitchinterval(100.0)
    t = threading.Thread(target=tick)
    try:
        t.start()
        time.sleep(0.01)
        before = ticks[0]
        stories.generate(PROMPTS * 4, SamplingParams(max_tokens=96, ignore_eos=True, seed=1))
        during = ticks[0] - before
    finally:
        stop.set()
        t.join()
        sys.setswitchinterval(old)
    assert during >= 20, during


CTRL_C_CHILD = textwrap.dedent("""
    import sys, threading, time
    from tandem import LLM, SamplingParams
    llm = LLM(model=sys.argv[1], threads=1)
    def announce():
        while llm.engine_metrics()["running"] == 0:
            time.sleep(0.002)
        print("running", flush=True)
    threading.Thread(target=announce, daemon=True).start()
    try:
        llm.generate(["Once upon a time"] * 48, SamplingParams(max_tokens=None, ignore_eos=True, seed=1))
        print("finished", flush=True)
    except KeyboardInterrupt:
        m = llm.engine_metrics()
        print("interrupted", m["running"], m["waiting"], m["requests_cancelled"], m["kv_blocks_used"], flush=True)
    out = llm.generate("Once upon a time", SamplingParams(temperature=0, max_tokens=20))
    print("after", repr(out[0].outputs[0].text), flush=True)
""")


def test_ctrl_c_cancels_and_leaves_the_engine_usable(stories):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    proc = subprocess.Popen([sys.executable, "-c", CTRL_C_CHILD, STORIES], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout.readline().strip() == "running"
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    lines = out.splitlines()
    words = lines[0].split()
    assert words[0] == "interrupted", out
    # Nothing left running or waiting, the requests cancelled, their KV blocks free.
    assert words[1:3] == ["0", "0"] and int(words[3]) > 0 and words[4] == "0", out
    expect = stories.generate("Once upon a time", SamplingParams(temperature=0, max_tokens=20))[0].outputs[0].text
    assert lines[1] == "after " + repr(expect)


def test_gemma_chat_and_generate_equal_the_cli():
    path = gemma_path()
    llm = LLM(model=path, threads=2, max_model_len=512)
    sp = SamplingParams(temperature=0, max_tokens=16)
    o = llm.chat([{"role": "user", "content": "Name three rivers."}], sp)[0]
    assert o.outputs[0].text.strip() == cli_run(path, "--chat", "Name three rivers.", "-n", "16", "-c", "512").strip()
    g = llm.generate("Photosynthesis is the process by which", sp)[0]
    assert g.outputs[0].text == cli_run(path, "-p", "Photosynthesis is the process by which", "-n", "16", "-c", "512")

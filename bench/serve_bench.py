#!/usr/bin/env python3
"""Load generator for an OpenAI-compatible server (Tandem's `tandem serve`, llama.cpp's, ...).

N concurrent streaming clients built on the official `openai` Python client
(AsyncOpenAI) send --num-requests requests whose prompt and output lengths are
drawn from distributions, and time every streamed token:

  TTFT  time from sending the request to the first streamed token
  TPOT  time per output token after the first: (end - first token) / (tokens - 1)
  ITL   gaps between successive streamed chunks
  E2E   request start to end of stream

It reports request, output-token and total-token throughput, TTFT p50/p90/p99,
TPOT p50/p90/p99, ITL p50/p99, E2E percentiles, and writes them with every
request's numbers to --json. Token counts are the server's own `usage` numbers
(stream_options.include_usage); a server that does not send them gets the
count of streamed chunks instead (the JSON says which).

Prompts are real English text: sentences from a fixed pool in a seeded order.
Their length in tokens is aimed at by a one-off calibration request (the
server's usage.prompt_tokens for a known text gives tokens per character),
so lengths are close, not exact; the report uses the server's counts.

Outputs run to max_tokens: requests carry `ignore_eos: true` (Tandem, vLLM,
llama.cpp's llama-server). A server without it can be given another way with
--extra-body, e.g. a logit_bias that bans the end-of-generation tokens
(bench/serve_compare.py does that for llama-cpp-python, whose min_tokens
masks only EOS and breaks its chat streams). A request that still ends early
(finish_reason "stop") is counted as early_stop.

Optional:
  --shared-prefix N   every prompt starts with the same N-token system prompt
                      (the system message in --chat mode)
  --bg-concurrency K  a background stream of K clients sending --bg-prompt-len
                      prompts for as long as the main requests run (e.g. long
                      prompts arriving while chats decode); its requests still
                      in flight when the main ones finish are cancelled
  --launch "CMD"      start the server, wait for it to answer, stop it at the end

Only loopback addresses are accepted as targets.

  bench/serve_bench.py --base-url http://127.0.0.1:8080/v1 -c 16 -n 64 --prompt-len uniform:100:400 --output-len 128
  bench/serve_bench.py --launch "build/tandem serve -m model.gguf --port 8181 --threads 2" \\
      --base-url http://127.0.0.1:8181/v1 -c 1 -n 8 --shared-prefix 1000 --prompt-len 32 --output-len 16 --json out.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ipaddress
import json
import math
import os
import random
import re
import shlex
import signal
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import asdict, dataclass, field

# A pool of plain sentences on unrelated topics, so prompts read like text and
# tokenize like text (no repeated-token degenerate cases).
SENTENCES = [
    "The old lighthouse keeper climbed the spiral stairs every evening to light the lamp before the fog rolled in.",
    "Photosynthesis converts sunlight, water and carbon dioxide into sugar and oxygen inside the leaves of green plants.",
    "A good recipe for bread needs only flour, water, salt and yeast, but patience matters more than any ingredient.",
    "The river changed its course after the spring floods, leaving the mill stranded in a field of drying mud.",
    "Compilers translate source code into machine instructions, and optimizers rearrange those instructions to run faster.",
    "In the market square, merchants sold spices, woven baskets, copper pots and bright bolts of dyed cotton.",
    "Migrating birds navigate thousands of kilometres using the stars, the sun and the magnetic field of the earth.",
    "She kept a notebook of every book she read, with a single sentence about what each one had taught her.",
    "The committee postponed its decision until the engineers could explain why the bridge swayed in strong winds.",
    "Glaciers carve deep valleys as they slide downhill, grinding rock into fine powder that colours the lakes below.",
    "A chess player who controls the centre of the board usually has more freedom to move her pieces later.",
    "The train left the station exactly on time, although half of the passengers were still looking for their seats.",
    "Honeybees communicate the direction and distance of flowers to each other by dancing on the walls of the hive.",
    "Every morning the baker opened the shop at six, and by seven there was a queue stretching around the corner.",
    "Modern telescopes collect light that left distant galaxies billions of years before the earth had even formed.",
    "The children built a raft from driftwood and rope, then argued for an hour about who would be the captain.",
    "Volcanic soil is often very fertile, which is why farmers return to the slopes even after a dangerous eruption.",
    "He repaired clocks in a tiny workshop filled with ticking, chiming and the smell of oil and brass polish.",
    "Databases keep an index of their records so that a query can find one row without reading every other row.",
    "The orchestra tuned their instruments while the audience settled into the red velvet seats of the concert hall.",
    "Tides rise and fall twice a day because the moon and the sun pull on the oceans with changing strength.",
    "A small village in the mountains celebrated the first snowfall with music, roasted chestnuts and warm cider.",
    "Archaeologists found pottery shards, bronze pins and a carved bone comb beneath the floor of the ancient house.",
    "When the power went out, the whole street gathered outside to watch the thunderstorm move across the hills.",
    "The museum guide explained how the painter mixed crushed minerals with egg yolk to make her bright colours.",
    "Sailors once measured the speed of their ship by throwing a knotted rope overboard and counting the knots.",
    "Her grandfather planted an apple orchard the year she was born, and now the trees bend under their fruit.",
    "Network packets may arrive out of order, so the receiver reassembles them using the sequence numbers they carry.",
    "The desert looked empty at noon, but at night it came alive with foxes, owls, beetles and small scurrying mice.",
    "After weeks of rehearsal, the actors finally performed the play in front of a full and enthusiastic theatre.",
    "Coral reefs shelter a quarter of all marine species even though they cover a tiny fraction of the ocean floor.",
    "The librarian recommended a novel about a cartographer who mapped an island that did not appear on any chart.",
    "Wind turbines turn slowly, yet the tips of their long blades travel faster than a car on the motorway.",
    "Every autumn the family pressed grapes in the courtyard and stored the juice in barrels in the cool cellar.",
    "A careful scientist writes down the failed experiments too, because they often explain the successful ones.",
    "The harbour was crowded with fishing boats, ferries, a rusty tugboat and one elegant white sailing yacht.",
    "Mathematicians proved long ago that there is no largest prime number, no matter how far one keeps counting.",
    "The mountain path was steep and narrow, with loose stones that rolled away beneath the hikers' heavy boots.",
    "Printing presses made books cheap enough for ordinary families, and reading spread quickly across the continent.",
    "At the end of the long day, the tired gardener sat on the bench and listened to the blackbirds singing.",
]

LOOPBACK_NAMES = {"localhost", "localhost.localdomain", "ip6-localhost"}


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- distributions


@dataclass
class Dist:
    """An integer length distribution: 'N', 'uniform:A:B', 'normal:MEAN:STD' or 'choice:a,b,c'."""

    spec: str
    kind: str = "const"
    a: float = 0
    b: float = 0
    choices: list[int] = field(default_factory=list)

    @staticmethod
    def parse(spec: str) -> "Dist":
        s = spec.strip()
        try:
            if re.fullmatch(r"\d+", s):
                d = Dist(s, "const", int(s))
            elif s.startswith("uniform:"):
                _, a, b = s.split(":")
                d = Dist(s, "uniform", int(a), int(b))
                if d.b < d.a:
                    raise ValueError("B < A")
            elif s.startswith("normal:"):
                _, m, sd = s.split(":")
                d = Dist(s, "normal", float(m), float(sd))
                if d.b < 0:
                    raise ValueError("negative standard deviation")
            elif s.startswith("choice:"):
                d = Dist(s, "choice", choices=[int(x) for x in s[len("choice:"):].split(",") if x])
                if not d.choices:
                    raise ValueError("no choices")
            else:
                raise ValueError("unknown form")
        except ValueError as e:
            raise argparse.ArgumentTypeError(
                f"bad length distribution {spec!r} ({e}); use N, uniform:A:B, normal:MEAN:STD or choice:a,b,c")
        if d.kind != "choice" and d.kind != "normal" and d.a < 1:
            raise argparse.ArgumentTypeError(f"bad length distribution {spec!r}: lengths must be >= 1")
        if d.kind == "choice" and min(d.choices) < 1:
            raise argparse.ArgumentTypeError(f"bad length distribution {spec!r}: lengths must be >= 1")
        return d

    def sample(self, rng: random.Random) -> int:
        if self.kind == "const":
            return int(self.a)
        if self.kind == "uniform":
            return rng.randint(int(self.a), int(self.b))
        if self.kind == "normal":
            return max(1, int(round(rng.gauss(self.a, self.b))))
        return rng.choice(self.choices)


# ---------------------------------------------------------------- prompts


class TextSource:
    """Builds text of about N tokens from the sentence pool, given tokens per character."""

    def __init__(self, tokens_per_char: float):
        self.tokens_per_char = tokens_per_char

    @staticmethod
    def sentences(rng: random.Random, min_chars: int) -> str:
        out: list[str] = []
        n = 0
        order: list[str] = []
        while n < min_chars:
            if not order:
                order = SENTENCES[:]
                rng.shuffle(order)
            s = order.pop()
            out.append(s)
            n += len(s) + 1
        return " ".join(out)

    def text(self, rng: random.Random, tokens: int) -> str:
        chars = max(1, int(round(tokens / self.tokens_per_char)))
        t = self.sentences(rng, chars + 200)[:chars]
        # End on a word boundary so the last token is a whole word.
        cut = t.rfind(" ")
        return t[:cut] if cut > chars // 2 else t


@dataclass
class Spec:
    """One request to send."""

    index: int
    prompt_len: int         # aimed at, in tokens (without the shared prefix)
    output_len: int         # max_tokens
    prompt: str = ""        # completions
    messages: list = field(default_factory=list)  # chat
    est_prompt_tokens: int = 0  # from the calibration, for servers that send no usage


def build_requests(n: int, prompt_dist: Dist, output_dist: Dist, src: TextSource, rng: random.Random,
                   chat: bool, system: str, tag: str) -> list[Spec]:
    specs = []
    for i in range(n):
        spec = Spec(i, prompt_dist.sample(rng), output_dist.sample(rng))
        # A unique lead-in keeps unrelated prompts from sharing cached blocks by chance.
        body = f"{tag} request {i}. " + src.text(rng, spec.prompt_len)
        if chat:
            spec.messages = ([{"role": "system", "content": system}] if system else []) + [
                {"role": "user", "content": body}]
        else:
            spec.prompt = (system + "\n\n" + body) if system else body
        text = system + body
        spec.est_prompt_tokens = round(src.tokens_per_char * len(text)) + 1
        specs.append(spec)
    return specs


# ---------------------------------------------------------------- one request


@dataclass
class Result:
    index: int
    group: str
    prompt_len_target: int
    max_tokens: int
    ok: bool = False
    error: str = ""
    cancelled: bool = False
    start: float = 0.0          # seconds since the run started
    ttft: float | None = None
    e2e: float | None = None
    tpot: float | None = None
    itl: list[float] = field(default_factory=list)
    chunks: int = 0
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    usage_from: str = ""        # "server", or "chunks" (no usage sent: output counted in chunks, prompt estimated)
    finish_reason: str | None = None
    early_stop: bool = False


def chunk_fields(chunk: dict, chat: bool) -> tuple[str, str | None]:
    """(text, finish_reason) of one streamed chunk, parsed as plain JSON."""
    choices = chunk.get("choices") or []
    if not choices:
        return "", None
    c = choices[0]
    if chat:
        return (c.get("delta") or {}).get("content") or "", c.get("finish_reason")
    return c.get("text") or "", c.get("finish_reason")


async def sse_events(resp):
    """The JSON payloads of a server-sent event stream, up to `data: [DONE]`.

    The openai client's own stream iterator builds a pydantic model for every
    chunk, most of the client's CPU under cProfile; on a machine whose cores
    the server under test shares, that time is taken from the server. Parsed
    with json.loads, the client's CPU while 16 clients ran 32 requests fell
    from 0.77-0.85 s to 0.48-0.53 s, the same saving for every server.
    """
    data: list[str] = []
    async for line in resp.iter_lines():
        if line.startswith("data:"):
            data.append(line[5:].lstrip())
        elif line == "" and data:
            payload = "\n".join(data)
            data = []
            if payload == "[DONE]":
                return
            ev = json.loads(payload)
            if isinstance(ev, dict) and ev.get("error"):
                err = ev["error"]
                msg = err.get("message", err) if isinstance(err, dict) else err
                raise RuntimeError(f"error event in the stream: {msg}")
            yield ev
    if data:
        raise RuntimeError("stream ended inside an event")


async def one_request(client, model: str, spec: Spec, chat: bool, args, group: str, t0: float,
                      sink: list[Result]) -> Result:
    """Streams one request; its Result lands in `sink` even when the task is cancelled."""
    r = Result(spec.index, group, spec.prompt_len, spec.output_len)
    extra: dict = dict(args.extra_body)
    if args.ignore_eos:
        extra["ignore_eos"] = True
    common = dict(model=model, max_tokens=spec.output_len, temperature=args.temperature, stream=True,
                  stream_options={"include_usage": True}, extra_body=extra or None, seed=args.seed + spec.index)
    last = None
    start = time.perf_counter()
    r.start = start - t0
    resp = None
    try:
        # The openai client sends the request (and raises its usual errors on
        # a 4xx/5xx); the events are parsed here (sse_events says why).
        api = client.chat.completions if chat else client.completions
        kwargs = dict(messages=spec.messages) if chat else dict(prompt=spec.prompt)
        async with api.with_streaming_response.create(**kwargs, **common) as resp:
            async for chunk in sse_events(resp):
                now = time.perf_counter()
                text, finish = chunk_fields(chunk, chat)
                if text:
                    if r.ttft is None:
                        r.ttft = now - start
                    else:
                        r.itl.append(now - last)
                    last = now
                    r.chunks += 1
                if finish:
                    r.finish_reason = finish
                u = chunk.get("usage")
                if u:
                    r.prompt_tokens, r.completion_tokens = u.get("prompt_tokens"), u.get("completion_tokens")
                    cached = (u.get("prompt_tokens_details") or {}).get("cached_tokens")
                    if cached is not None:
                        r.cached_tokens = cached
        end = time.perf_counter()
        r.e2e = end - start
        r.ok = r.ttft is not None
        if not r.ok:
            r.error = "stream ended without a token"
        if r.completion_tokens is None:
            r.completion_tokens, r.usage_from = r.chunks, "chunks"
            r.prompt_tokens = spec.est_prompt_tokens
        else:
            r.usage_from = "server"
        if r.ok and r.completion_tokens > 1:
            r.tpot = (end - start - r.ttft) / (r.completion_tokens - 1)
        r.early_stop = r.finish_reason == "stop" and r.completion_tokens < spec.output_len
    except asyncio.CancelledError:
        # Closing the stream drops the connection, which is how the server
        # learns to cancel the request. The task still ends cancelled.
        r.cancelled = True
        r.error = "cancelled at the end of the run"
        if resp is not None:
            with contextlib.suppress(Exception):
                await asyncio.shield(resp.close())
        raise
    except Exception as e:  # noqa: BLE001 - every failure is a data point
        r.error = f"{type(e).__name__}: {e}"[:500]
    finally:
        sink.append(r)
    return r


# ---------------------------------------------------------------- statistics


def percentile(values: list[float], p: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's default)."""
    if not values:
        return None
    v = sorted(values)
    k = (len(v) - 1) * p / 100.0
    lo, hi = math.floor(k), math.ceil(k)
    return v[lo] + (v[hi] - v[lo]) * (k - lo)


def summary(values: list[float], ps=(50, 90, 99)) -> dict:
    out = {"n": len(values), "mean": statistics.fmean(values) if values else None}
    for p in ps:
        out[f"p{p}"] = percentile(values, p)
    out["max"] = max(values) if values else None
    return out


def aggregate(results: list[Result], duration: float) -> dict:
    ok = [r for r in results if r.ok]
    prompt = sum(r.prompt_tokens or 0 for r in ok)
    out_tok = sum(r.completion_tokens or 0 for r in ok)
    itl = [x for r in ok for x in r.itl]
    return {
        "requests": len(results),
        "completed": len(ok),
        "failed": sum(1 for r in results if not r.ok and not r.cancelled),
        "cancelled": sum(1 for r in results if r.cancelled),
        "early_stop": sum(1 for r in ok if r.early_stop),
        "usage_from": sorted({r.usage_from for r in ok}),
        "duration_s": duration,
        "prompt_tokens": prompt,
        "completion_tokens": out_tok,
        "cached_prompt_tokens": sum(r.cached_tokens or 0 for r in ok),
        "request_throughput": len(ok) / duration if duration > 0 else None,
        "output_throughput": out_tok / duration if duration > 0 else None,
        "total_token_throughput": (prompt + out_tok) / duration if duration > 0 else None,
        "ttft_s": summary([r.ttft for r in ok]),
        "tpot_s": summary([r.tpot for r in ok if r.tpot is not None]),
        "itl_s": summary(itl),
        "e2e_s": summary([r.e2e for r in ok]),
        "errors": sorted({r.error for r in results if r.error and not r.cancelled})[:10],
    }


# ---------------------------------------------------------------- server handling


def check_loopback(url: str) -> None:
    host = urllib.parse.urlparse(url).hostname or ""
    if host.lower() in LOOPBACK_NAMES:
        return
    try:
        if ipaddress.ip_address(host).is_loopback:
            return
    except ValueError:
        pass
    raise SystemExit(f"refusing to send load to {host!r}: only loopback addresses (127.0.0.0/8, ::1, localhost)")


def root_url(base_url: str) -> str:
    u = base_url.rstrip("/")
    return u[: -len("/v1")] if u.endswith("/v1") else u


def http_get(url: str, timeout: float = 5.0, api_key: str | None = None) -> tuple[int, str]:
    req = urllib.request.Request(url)
    if api_key:
        req.add_header("Authorization", f"Bearer {api_key}")
    # No proxies: the target is loopback and must stay so.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(req, timeout=timeout) as resp:
            return resp.status, resp.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode("utf-8", "replace")


def wait_ready(base_url: str, proc: subprocess.Popen | None, timeout: float, api_key: str | None) -> None:
    root = root_url(base_url)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise SystemExit(f"server exited with code {proc.returncode} before answering")
        for path in ("/health", "/v1/models"):
            try:
                status, _ = http_get(root + path, 2.0, api_key)
                if status == 200:
                    return
            except (OSError, urllib.error.URLError):
                pass
        time.sleep(0.25)
    raise SystemExit(f"server at {root} did not answer /health or /v1/models within {timeout:.0f} s")


def launch(cmd: str, log_path: str | None) -> subprocess.Popen:
    out = open(log_path, "wb") if log_path else subprocess.DEVNULL  # noqa: SIM115 - lives as long as the server
    log(f"launching: {cmd}")
    return subprocess.Popen(shlex.split(cmd), stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def stop_server(proc: subprocess.Popen) -> None:
    if proc.poll() is not None:
        return
    # Its own session, created by launch(): the server and anything it spawned.
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(5)


def parse_prometheus(text: str) -> dict[str, float]:
    """Sample name with labels -> value, for the text exposition format."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = re.match(r"^(\S+?(?:\{[^}]*\})?)\s+(\S+)", line)
        if m:
            with contextlib.suppress(ValueError):
                out[m.group(1)] = float(m.group(2))
    return out


def scrape_metrics(base_url: str, api_key: str | None) -> dict[str, float] | None:
    try:
        status, text = http_get(root_url(base_url) + "/metrics", 5.0, api_key)
    except (OSError, urllib.error.URLError):
        return None
    return parse_prometheus(text) if status == 200 else None


# ---------------------------------------------------------------- the run


async def calibrate(client, model: str, timeout: float) -> tuple[float, int]:
    """Tokens per character of the sentence pool, from the server's own count."""
    text = TextSource.sentences(random.Random(987654321), 3000)
    empty = await client.completions.create(model=model, prompt="Hello", max_tokens=1, temperature=0, timeout=timeout)
    full = await client.completions.create(model=model, prompt="Hello " + text, max_tokens=1, temperature=0,
                                           timeout=timeout)
    if not full.usage or not empty.usage:
        raise SystemExit("the server sent no usage numbers for the calibration request")
    per_char = (full.usage.prompt_tokens - empty.usage.prompt_tokens) / len(text)
    if per_char <= 0:
        raise SystemExit("calibration gave no tokens per character")
    return per_char, full.usage.prompt_tokens


async def run(args) -> dict:
    from openai import AsyncOpenAI  # imported here so --help works without it

    client = AsyncOpenAI(base_url=args.base_url, api_key=args.api_key or "none", max_retries=0,
                         timeout=args.request_timeout)
    model = args.model
    if not model:
        models = await client.models.list()
        model = models.data[0].id
    per_char, calib_tokens = await calibrate(client, model, args.request_timeout)
    log(f"model {model}: {per_char:.3f} tokens per character of prompt text")
    src = TextSource(per_char)

    rng = random.Random(args.seed)
    system = ""
    if args.shared_prefix:
        system = f"System prompt {args.seed}. " + src.text(random.Random(args.seed * 7919 + 1), args.shared_prefix)
    tag = f"Run {args.seed}"
    specs = build_requests(args.num_requests, args.prompt_len, args.output_len, src, rng, args.chat, system, tag)
    bg_rng = random.Random(args.seed + 104729)

    metrics_before = scrape_metrics(args.base_url, args.api_key)
    results: list[Result] = []
    bg_results: list[Result] = []
    t0 = time.perf_counter()
    queue: asyncio.Queue[Spec] = asyncio.Queue()
    for s in specs:
        queue.put_nowait(s)

    async def worker() -> None:
        while True:
            try:
                spec = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            await one_request(client, model, spec, args.chat, args, "main", t0, results)
            done = len(results)
            if args.progress and (done % max(1, args.num_requests // 10) == 0 or done == args.num_requests):
                log(f"{done}/{args.num_requests} requests done")

    bg_counter = iter(range(1_000_000))

    async def bg_worker() -> None:
        while True:
            i = next(bg_counter)
            spec = build_requests(1, args.bg_prompt_len, args.bg_output_len, src, bg_rng, args.bg_chat, "",
                                  f"Background {args.seed}-{i}")[0]
            spec.index = i
            res = await one_request(client, model, spec, args.bg_chat, args, "background", t0, bg_results)
            if not res.ok:
                await asyncio.sleep(0.5)  # an overloaded server answers fast; do not spin
            if args.bg_interval > 0:
                await asyncio.sleep(args.bg_interval)

    bg_tasks = [asyncio.create_task(bg_worker()) for _ in range(args.bg_concurrency)]
    if bg_tasks and args.bg_lead > 0:
        await asyncio.sleep(args.bg_lead)  # let the background load reach steady state
    t_main = time.perf_counter()
    cpu_main = time.process_time()
    await asyncio.gather(*[worker() for _ in range(min(args.concurrency, args.num_requests))])
    duration = time.perf_counter() - t_main
    # This process's CPU while the main requests ran: on a machine it shares
    # with the server, time the server did not have.
    client_cpu = time.process_time() - cpu_main
    for t in bg_tasks:
        t.cancel()
    await asyncio.gather(*bg_tasks, return_exceptions=True)
    bg_duration = time.perf_counter() - t0
    await asyncio.sleep(0.2)
    metrics_after = scrape_metrics(args.base_url, args.api_key)
    await client.close()

    results.sort(key=lambda r: r.start)
    report = {
        "config": {
            "base_url": args.base_url, "model": model, "endpoint": "chat" if args.chat else "completions",
            "concurrency": args.concurrency, "num_requests": args.num_requests,
            "prompt_len": args.prompt_len.spec, "output_len": args.output_len.spec,
            "shared_prefix": args.shared_prefix, "seed": args.seed, "temperature": args.temperature,
            "ignore_eos": args.ignore_eos, "extra_body": args.extra_body, "launch": args.launch,
            "bg_concurrency": args.bg_concurrency, "bg_prompt_len": args.bg_prompt_len.spec,
            "bg_output_len": args.bg_output_len.spec, "bg_interval": args.bg_interval, "bg_lead": args.bg_lead,
            "tokens_per_char": per_char, "calibration_prompt_tokens": calib_tokens,
        },
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "summary": aggregate(results, duration),
        "client_cpu_s": client_cpu,
        "requests": [asdict(r) for r in results],
    }
    if args.bg_concurrency:
        report["background"] = {"summary": aggregate(bg_results, bg_duration),
                                "requests": [asdict(r) for r in sorted(bg_results, key=lambda r: r.start)]}
    if metrics_after is not None:
        report["server_metrics_after"] = metrics_after
        if metrics_before is not None:
            report["server_metrics_delta"] = {k: v - metrics_before.get(k, 0.0) for k, v in metrics_after.items()
                                              if v != metrics_before.get(k, 0.0)}
    return report


def fmt_ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1000:.1f}"


def print_report(rep: dict, out=sys.stdout) -> None:
    s = rep["summary"]
    c = rep["config"]
    print(f"model {c['model']}  endpoint {c['endpoint']}  concurrency {c['concurrency']}  "
          f"requests {s['completed']}/{s['requests']} ok, {s['failed']} failed, {s['early_stop']} ended early",
          file=out)
    print(f"duration {s['duration_s']:.2f} s  prompt tokens {s['prompt_tokens']}  "
          f"output tokens {s['completion_tokens']}  (counts from {', '.join(s['usage_from']) or '-'})"
          f"  client CPU {rep.get('client_cpu_s', 0):.2f} s", file=out)
    if s["request_throughput"] is not None:
        print(f"throughput: {s['request_throughput']:.3f} req/s  {s['output_throughput']:.1f} output tok/s  "
              f"{s['total_token_throughput']:.1f} total tok/s", file=out)
    for name, key in (("TTFT", "ttft_s"), ("TPOT", "tpot_s"), ("ITL", "itl_s"), ("E2E", "e2e_s")):
        d = s[key]
        print(f"{name:5s} ms: mean {fmt_ms(d['mean'])}  p50 {fmt_ms(d['p50'])}  p90 {fmt_ms(d['p90'])}  "
              f"p99 {fmt_ms(d['p99'])}  max {fmt_ms(d['max'])}", file=out)
    if "background" in rep:
        b = rep["background"]["summary"]
        print(f"background: {b['completed']} done, {b['cancelled']} cancelled at the end, {b['failed']} failed, "
              f"{b['prompt_tokens']} prompt tokens, TTFT p50 {fmt_ms(b['ttft_s']['p50'])} ms", file=out)
    for e in s["errors"]:
        print(f"error: {e}", file=out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base-url", default="http://127.0.0.1:8080/v1", help="the server's OpenAI base URL (loopback)")
    ap.add_argument("--api-key", default=os.environ.get("TANDEM_API_KEY"), help="Bearer key, if the server wants one")
    ap.add_argument("--model", help="model name to send (default: the first of /v1/models)")
    ap.add_argument("--launch", help="command that starts the server; it is stopped at the end")
    ap.add_argument("--launch-log", help="file for the launched server's output")
    ap.add_argument("--ready-timeout", type=float, default=300, help="seconds to wait for a launched server")
    ap.add_argument("-c", "--concurrency", type=int, default=16, help="concurrent clients")
    ap.add_argument("-n", "--num-requests", type=int, default=64)
    ap.add_argument("--prompt-len", type=Dist.parse, default=Dist.parse("200"),
                    help="prompt tokens: N, uniform:A:B, normal:MEAN:STD or choice:a,b,c")
    ap.add_argument("--output-len", type=Dist.parse, default=Dist.parse("64"), help="max_tokens, same forms")
    ap.add_argument("--shared-prefix", type=int, default=0, help="tokens of a system prompt shared by every request")
    ap.add_argument("--chat", action="store_true", help="use /v1/chat/completions (default: /v1/completions)")
    ap.add_argument("--seed", type=int, default=0, help="seeds the lengths, the prompt text and sampling")
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--no-ignore-eos", dest="ignore_eos", action="store_false",
                    help="let requests end at EOS instead of running to max_tokens")
    ap.add_argument("--extra-body", type=json.loads, default={},
                    help='JSON object merged into every request body, e.g. \'{"logit_bias": {"106": -100}}\'')
    ap.add_argument("--bg-concurrency", type=int, default=0, help="background clients (0: none)")
    ap.add_argument("--bg-prompt-len", type=Dist.parse, default=Dist.parse("1500"))
    ap.add_argument("--bg-output-len", type=Dist.parse, default=Dist.parse("8"))
    ap.add_argument("--bg-chat", action="store_true", help="background requests use chat completions")
    ap.add_argument("--bg-interval", type=float, default=0.0, help="pause of each background client between requests")
    ap.add_argument("--bg-lead", type=float, default=0.0, help="seconds the background runs before the main requests")
    ap.add_argument("--request-timeout", type=float, default=900.0)
    ap.add_argument("--json", help="write the full report here")
    ap.add_argument("--quiet", dest="progress", action="store_false")
    args = ap.parse_args(argv)
    if args.concurrency < 1 or args.num_requests < 1 or args.shared_prefix < 0 or args.bg_concurrency < 0:
        ap.error("--concurrency and --num-requests must be >= 1, --shared-prefix and --bg-concurrency >= 0")
    check_loopback(args.base_url)
    try:
        import openai  # noqa: F401
    except ImportError:
        raise SystemExit("the openai package is missing: pip install openai (bench/serve_compare.py sets up a venv)")

    if not isinstance(args.extra_body, dict):
        ap.error("--extra-body must be a JSON object")
    # A SIGTERM (a timeout, a parent giving up) still stops a launched server.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    proc = launch(args.launch, args.launch_log) if args.launch else None
    try:
        wait_ready(args.base_url, proc, args.ready_timeout if proc else 10, args.api_key)
        report = asyncio.run(run(args))
    finally:
        if proc is not None:
            stop_server(proc)
    print_report(report)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0 if report["summary"]["completed"] > 0 else 1


if __name__ == "__main__":
    sys.exit(main())

"""KV events over ZeroMQ, read as a router reads them: a pyzmq subscriber
decodes every batch with vLLM's own event structs (msgspec, in each of the
three layouts vLLM versions sent), replays them into the set of blocks it
believes the server holds, and checks that set against what the server says
it holds, the prompts' tokens and llm-d's block hashes (hashlib + cbor2)."""
import hashlib
import re
import time
from typing import Any

import cbor2
import msgspec
import pytest
import zmq

from harness import STORIES, Server, parse_metrics, wait_metrics

BLOCK = 16


# --- vLLM's event structs, in the layouts its versions used -----------------

def structs(batch_array, events_array):
    class EventBatch(msgspec.Struct, array_like=batch_array, omit_defaults=True, gc=False):
        ts: float
        events: list[Any]
        data_parallel_rank: int | None = None

    class KVCacheEvent(msgspec.Struct, array_like=events_array, omit_defaults=True, gc=False, tag=True):
        pass

    class BlockStored(KVCacheEvent):
        block_hashes: list[int]
        parent_block_hash: int | None
        token_ids: list[int]
        block_size: int
        lora_id: int | None
        medium: str | None

    class BlockRemoved(KVCacheEvent):
        block_hashes: list[int]
        medium: str | None

    class AllBlocksCleared(KVCacheEvent):
        pass

    if not events_array:  # later versions name lora_name too
        BlockStored = msgspec.defstruct(
            "BlockStored", [("lora_name", str | None)], bases=(BlockStored,), tag=True)

    class KVEventBatch(EventBatch):
        events: list[BlockStored | BlockRemoved | AllBlocksCleared]

    return msgspec.msgpack.Decoder(type=KVEventBatch)


LAYOUTS = {"array": (True, True), "array-map": (True, False), "map": (False, False)}


def low64(data):
    return int.from_bytes(hashlib.sha256(data).digest()[24:], "big")


def llmd_hashes(tokens, seed=""):
    """Block hashes of a prompt's full blocks, as llm-d's indexer computes them."""
    parent = low64(cbor2.dumps(seed, canonical=True))
    out = []
    for i in range(0, len(tokens) - len(tokens) % BLOCK, BLOCK):
        parent = low64(cbor2.dumps([parent, tokens[i:i + BLOCK], None], canonical=True))
        out.append(parent)
    return out


class Subscriber:
    """What a router knows: content hash -> (parent, tokens), from the events."""

    def __init__(self, endpoint, replay, layout, topic=b""):
        self.ctx = zmq.Context()
        self.replay = replay
        self.sock = self.ctx.socket(zmq.SUB)
        self.sock.connect(endpoint)
        self.sock.setsockopt(zmq.SUBSCRIBE, topic)
        self.decode = structs(*LAYOUTS[layout])
        self.held = {}
        self.seqs = []
        self.batches = []
        self.cleared = 0
        self.removed = 0

    def apply(self, batch):
        for ev in batch.events:
            kind = type(ev).__name__
            if kind == "BlockStored":
                assert ev.block_size == BLOCK and ev.medium == "CPU" and ev.lora_id is None
                assert len(ev.token_ids) == BLOCK * len(ev.block_hashes)
                parent = ev.parent_block_hash
                for i, h in enumerate(ev.block_hashes):
                    assert parent is None or parent in self.held, "a block stored before its parent"
                    assert h not in self.held, "a hash stored twice"
                    self.held[h] = (parent, ev.token_ids[i * BLOCK:(i + 1) * BLOCK])
                    parent = h
            elif kind == "BlockRemoved":
                for h in ev.block_hashes:
                    assert h in self.held, "removed a block never stored"
                    del self.held[h]
                    self.removed += 1
            else:
                self.held.clear()
                self.cleared += 1

    def drain(self, until=None, timeout=10):
        """Applies batches until `until(self)` holds (or, without one, until quiet)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if until is not None and until(self):
                return
            if not self.sock.poll(200 if until else 500):
                if until is None:
                    return
                continue
            topic, seq, payload = self.sock.recv_multipart()
            seq = int.from_bytes(seq, "big")
            # What went out before the subscription took hold (or was
            # dropped) comes from the replay socket, as a router fetches it.
            if seq > len(self.seqs):
                for missed_seq, missed in self.fetch(len(self.seqs)):
                    if missed_seq < seq:
                        self.take(missed_seq, missed)
            self.take(seq, payload)
        if until is not None:
            raise AssertionError(f"events never reached the expected state; held {len(self.held)}")

    def take(self, seq, payload):
        assert seq == len(self.seqs), f"batch {seq} after {len(self.seqs)} batches"
        self.seqs.append(seq)
        batch = self.decode.decode(payload)
        assert batch.data_parallel_rank == 0
        self.batches.append(batch)
        self.apply(batch)

    def fetch(self, start):
        """Batches from `start` on, from the replay socket: [(seq, payload)]."""
        dealer = self.ctx.socket(zmq.DEALER)
        dealer.connect(self.replay)
        dealer.send_multipart([b"", start.to_bytes(8, "big")])
        out = []
        try:
            while True:
                assert dealer.poll(10000), "the replay socket never finished"
                frames = dealer.recv_multipart()
                seq = int.from_bytes(frames[-2], "big", signed=True)
                if seq == -1:
                    return out
                out.append((seq, frames[-1]))
        finally:
            dealer.close(0)

    def chain_tokens(self, h):
        """The whole prefix a held hash stands for."""
        out = []
        while h is not None:
            parent, toks = self.held[h]
            out = toks + out
            h = parent
        return out

    def close(self):
        self.sock.close(0)
        self.ctx.term()


def start(*args):
    srv = Server(STORIES, "--kv-events", "tcp://127.0.0.1:*", "--kv-events-replay", "tcp://127.0.0.1:*", *args)
    m = re.search(r"KV events on (tcp://[0-9.:]+), replay on (tcp://[0-9.:]+)", srv.log_text())
    return srv, m.group(1), m.group(2)


def tokens_of(srv, text):
    import json
    status, _, body = srv.request("POST", "/tokenize", {"prompt": text})
    assert status == 200
    return json.loads(body)["tokens"]


def complete(srv, prompt, n=4):
    status, _, body = srv.request("POST", "/v1/completions", {"prompt": prompt, "max_tokens": n, "temperature": 0})
    assert status == 200, body


def published(srv):
    samples, _ = parse_metrics(srv.metrics())
    return samples["tandem_kv_blocks_published"]


PROMPTS = [
    "Once upon a time there was a little girl named Lily who loved to play in the park with her friends",
    "Once upon a time there was a little girl named Lily who had a big red ball and a small blue hat",
    "The big brown bear walked into the forest looking for honey and found a small bee hive by the river",
]


@pytest.mark.parametrize("layout", ["array", "array-map", "map"])
def test_events_name_exactly_the_cached_blocks(layout):
    srv, endpoint, replay = start("--kv-events-format", layout)
    sub = Subscriber(endpoint, replay, layout)
    try:
        for p in PROMPTS:
            complete(srv, p)
        sub.drain(lambda s: len(s.held) == published(srv) and len(s.held) >= 3)
        # Every prompt's full blocks are held, under llm-d's hashes, with their tokens.
        for p in PROMPTS:
            toks = tokens_of(srv, p)
            hashes = llmd_hashes(toks)
            assert hashes, p
            for i, h in enumerate(hashes):
                assert h in sub.held, f"block {i} of {p!r} not announced"
                assert sub.chain_tokens(h) == toks[:(i + 1) * BLOCK]
        # The shared beginning of the first two prompts is one chain.
        assert llmd_hashes(tokens_of(srv, PROMPTS[0]))[0] == llmd_hashes(tokens_of(srv, PROMPTS[1]))[0]
        assert sub.seqs == list(range(len(sub.seqs)))  # 0, 1, 2, ...
        # A reset forgets every free block: one AllBlocksCleared.
        status, _, _ = srv.request("POST", "/reset_prefix_cache", {})
        assert status == 200
        sub.drain(lambda s: s.cleared == 1)
        assert sub.held == {} and published(srv) == 0
    finally:
        sub.close()
        assert srv.stop() == 0


def test_eviction_is_announced_and_the_seed_names_the_root():
    # A pool of 12 blocks: the third long prompt evicts blocks of the first ones.
    srv, endpoint, replay = start("--kv-tokens", "192", "--ctx-size", "192", "--max-seqs", "1", "--kv-events-hash-seed", "42",
                          "--kv-events-topic", "kv@pod-a@stories")
    sub = Subscriber(endpoint, replay, "array-map", topic=b"kv@")
    try:
        long_prompts = [" ".join([p] * 3) for p in PROMPTS]
        for p in long_prompts:
            complete(srv, p, n=2)
        sub.drain(lambda s: s.removed > 0 and len(s.held) == published(srv))
        assert llmd_hashes(tokens_of(srv, long_prompts[2]), seed="42")[0] in sub.held
        assert llmd_hashes(tokens_of(srv, long_prompts[2]), seed="")[0] not in sub.held
        held = wait_metrics(srv, lambda m: m["tandem_kv_blocks_published"] == len(sub.held))
        assert held["tandem_kv_blocks_published"] <= 12
    finally:
        sub.close()
        assert srv.stop() == 0


def test_replay_returns_missed_batches():
    srv, endpoint, replay = start()
    sub = Subscriber(endpoint, replay, "array-map")
    try:
        for p in PROMPTS:  # before anyone subscribed: only the replay has these
            complete(srv, p)
        n = wait_metrics(srv, lambda s: s["tandem_kv_blocks_published"] >= 3)["tandem_kv_blocks_published"]
        batches = sub.fetch(0)
        assert [seq for seq, _ in batches] == list(range(len(batches)))
        for seq, payload in batches:
            sub.take(seq, payload)
        assert len(sub.held) == n
        assert sub.fetch(len(batches)) == []
    finally:
        sub.close()
        assert srv.stop() == 0


def test_flags_are_checked():
    import subprocess
    from harness import CLI
    r = subprocess.run([CLI, "serve", "-m", STORIES, "--port", "0", "--kv-events", "nonsense://x"],
                       capture_output=True, timeout=60)
    assert r.returncode == 1 and b"--kv-events nonsense://x" in r.stderr, r.stderr
    r = subprocess.run([CLI, "serve", "-m", STORIES, "--port", "0", "--kv-events-topic", "t"],
                       capture_output=True, timeout=60)
    assert r.returncode == 1 and b"need --kv-events" in r.stderr, r.stderr
    r = subprocess.run([CLI, "serve", "-m", STORIES, "--port", "0", "--kv-events", "tcp://*:1",
                        "--kv-events-format", "json"], capture_output=True, timeout=60)
    assert r.returncode != 0 and b"--kv-events-format" in r.stderr, r.stderr

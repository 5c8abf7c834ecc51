"""LLM: vLLM's offline API over Tandem's engine (docs/python.md)."""
from __future__ import annotations

import random
import re
import time
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple, Union

from . import _core
from .outputs import CompletionOutput, Logprob, PromptScore, RequestMetrics, RequestOutput
from .sampling_params import SamplingParams

PromptType = Union[str, List[int], Dict[str, Any]]
ChatMessage = Dict[str, Any]

# vLLM options that have one meaningful value here: accepted at that value,
# refused otherwise, so code written for vLLM runs unchanged.
_VLLM_FIXED = {"tensor_parallel_size": 1, "pipeline_parallel_size": 1}
_VLLM_IGNORED = ("trust_remote_code", "dtype", "tokenizer", "enforce_eager", "gpu_memory_utilization",
                 "disable_log_stats", "use_tqdm")


def _bytes(value: Union[int, str], name: str) -> int:
    """512M, 2G, 1.5GiB or a number of bytes."""
    if isinstance(value, int):
        return value
    m = re.fullmatch(r"\s*([0-9.]+)\s*([KMG]?)(i?B)?\s*", str(value), re.IGNORECASE)
    if not m:
        raise ValueError(f"{name}: '{value}' is not a size (e.g. 512M, 2G)")
    return int(float(m.group(1)) * {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[m.group(2).upper()])


class Tokenizer:
    """The model's tokenizer (the GGUF's), as LLM.get_tokenizer() returns it."""

    def __init__(self, engine: "_core.Engine") -> None:
        self._engine = engine

    def encode(self, text: str, add_special_tokens: bool = True) -> List[int]:
        return self._engine.tokenize(text, add_special_tokens, False)

    def decode(self, token_ids: Sequence[int]) -> str:
        return self._engine.detokenize(list(token_ids))


class LLM:
    """One model on Tandem's engine.

    ``LLM(model=PATH, **options)``: the options are the engine's (threads,
    max_model_len, kv_cache_dtype, cache_type_k/v, kv_cache_memory,
    max_num_seqs, max_num_batched_tokens, speculative, draft_model, ...;
    docs/python.md lists them). ``generate`` runs a list of prompts as one
    batch through continuous batching; the GIL is released while the engine
    steps, and Ctrl-C cancels the batch and leaves the engine usable.
    """

    def __init__(self, model: str, *, seed: Optional[int] = None,
                 speculative_config: Optional[Dict[str, Any]] = None, **options: Any) -> None:
        for key, value in _VLLM_FIXED.items():
            if key in options and options.pop(key) != value:
                raise ValueError(f"{key}: only {value} is supported")
        for key in _VLLM_IGNORED:
            options.pop(key, None)
        if speculative_config:
            spec = dict(speculative_config)
            method = spec.pop("method", "draft" if "model" in spec else "ngram")
            options["speculative"] = method
            if "model" in spec:
                options["draft_model"] = spec.pop("model")
            if "num_speculative_tokens" in spec:
                options["num_speculative_tokens"] = spec.pop("num_speculative_tokens")
            if spec:
                raise ValueError(f"speculative_config: unknown keys {sorted(spec)}")
        for key in ("kv_cache_memory", "memory_available"):
            if key in options and options[key] is not None:
                options[key] = _bytes(options[key], key)
        self._engine = _core.Engine(str(model), options)
        self._seeds = random.Random(seed) if seed is not None else None
        self._next_id = 0

    # -- information -----------------------------------------------------
    @property
    def max_model_len(self) -> int:
        return self._engine.max_model_len

    def get_tokenizer(self) -> Tokenizer:
        return Tokenizer(self._engine)

    def engine_metrics(self) -> Dict[str, int]:
        """The engine's counters and gauges (running, waiting, tokens, steps, ...)."""
        return self._engine.metrics()

    # -- generation ------------------------------------------------------
    def generate(self, prompts: Union[PromptType, Sequence[PromptType], None] = None,
                 sampling_params: Union[SamplingParams, Sequence[SamplingParams], None] = None,
                 *, prompt_token_ids: Optional[Sequence[Sequence[int]]] = None,
                 use_tqdm: bool = False) -> List[RequestOutput]:
        """Every prompt at once through the engine; the outputs in the prompts' order."""
        texts, ids = self._prompts(prompts, prompt_token_ids)
        params = self._params(sampling_params, len(ids))
        return self._run(texts, ids, params)

    def stream(self, prompts: Union[PromptType, Sequence[PromptType]],
               sampling_params: Union[SamplingParams, Sequence[SamplingParams], None] = None
               ) -> Iterator[RequestOutput]:
        """Like generate, yielding each piece as the engine decides it: every
        RequestOutput holds one choice's new text and token ids (a delta);
        the last of a choice has its finish_reason and metrics. Leaving the
        loop early cancels the rest."""
        texts, ids = self._prompts(prompts, None)
        params = self._params(sampling_params, len(ids))
        batch, rids = self._submit(ids, params)
        try:
            arrival = time.time()
            while not batch.done:
                for ev in batch.poll():
                    out = self._delta(ev, texts, ids, rids, arrival)
                    if out is not None:
                        yield out
        except BaseException:
            self._abort(batch)
            raise

    def chat(self, messages: Union[Sequence[ChatMessage], Sequence[Sequence[ChatMessage]]],
             sampling_params: Union[SamplingParams, Sequence[SamplingParams], None] = None,
             use_tqdm: bool = False) -> List[RequestOutput]:
        """One conversation (a list of {"role", "content"} messages) or a list
        of them, rendered with the model's chat template and generated as
        one batch; each turn's end markers stop it."""
        convs = [messages] if messages and isinstance(messages[0], dict) else list(messages)
        params = self._params(sampling_params, len(convs))
        ids, texts, per = [], [], []
        for conv, p in zip(convs, params):
            pairs: List[Tuple[str, str]] = []
            for m in conv:
                content = m.get("content") or ""
                if not isinstance(content, str):  # OpenAI's list of parts: the text ones
                    content = "".join(part.get("text", "") for part in content if part.get("type") == "text")
                pairs.append((str(m["role"]), content))
            tokens, stops = self._engine.chat_ids(pairs)
            q = SamplingParams(**{k: getattr(p, k) for k in p.__dataclass_fields__ if k != "stop_strings"})
            q.stop_strings = list(p.stop_strings) + [s for s in stops if s not in p.stop_strings]
            ids.append(tokens)
            texts.append(None)
            per.append(q)
        return self._run(texts, ids, per)

    def score(self, prompts: Union[PromptType, Sequence[PromptType]]) -> List[PromptScore]:
        """Each text's token log-probabilities under the model (evaluation:
        the sum, perplexity), computed as one batch with no generation."""
        texts, ids = self._prompts(prompts, None)
        params = [SamplingParams(max_tokens=0, prompt_logprobs=0, temperature=0)] * len(ids)
        outs = self._run(texts, ids, params)
        return [PromptScore(o.prompt, o.prompt_token_ids,
                            [None if d is None else d[t].logprob
                             for t, d in zip(o.prompt_token_ids, o.prompt_logprobs or [])])
                for o in outs]

    # -- the batch ---------------------------------------------------------
    def _prompts(self, prompts: Any, prompt_token_ids: Any) -> Tuple[List[Optional[str]], List[List[int]]]:
        if prompt_token_ids is not None:
            if prompts is not None:
                raise ValueError("give prompts or prompt_token_ids, not both")
            return [None] * len(prompt_token_ids), [list(map(int, p)) for p in prompt_token_ids]
        if prompts is None:
            raise ValueError("no prompts given")
        if isinstance(prompts, (str, dict)) or (isinstance(prompts, list) and prompts
                                                and isinstance(prompts[0], int)):
            prompts = [prompts]
        texts: List[Optional[str]] = []
        ids: List[List[int]] = []
        for i, p in enumerate(prompts):
            if isinstance(p, dict):  # vLLM's TextPrompt / TokensPrompt
                if "prompt_token_ids" in p:
                    p = list(p["prompt_token_ids"])
                elif "prompt" in p:
                    p = p["prompt"]
                else:
                    raise ValueError(f"prompt {i}: a dict needs 'prompt' or 'prompt_token_ids'")
            if isinstance(p, str):
                texts.append(p)
                ids.append(self._engine.prompt_ids(p))
            elif isinstance(p, (list, tuple)) and all(isinstance(t, int) for t in p):
                texts.append(None)
                ids.append(list(p))
            else:
                raise TypeError(f"prompt {i}: expected a string or a list of token ids, got {type(p).__name__}")
        return texts, ids

    @staticmethod
    def _params(sp: Any, count: int) -> List[SamplingParams]:
        if sp is None:
            return [SamplingParams()] * count
        if isinstance(sp, SamplingParams):
            return [sp] * count
        sp = list(sp)
        if len(sp) != count:
            raise ValueError(f"{count} prompts but {len(sp)} SamplingParams")
        return sp

    def _submit(self, ids: List[List[int]], params: List[SamplingParams]) -> Tuple["_core.Batch", List[str]]:
        dicts = [p._engine_dict(self._seeds.getrandbits(32) if self._seeds else None) for p in params]
        batch = self._engine.submit(ids, dicts)
        rids = [str(self._next_id + i) for i in range(len(ids))]
        self._next_id += len(ids)
        return batch, rids

    @staticmethod
    def _abort(batch: "_core.Batch") -> None:
        """Cancels what is left of a batch and steps it to its end, so the
        engine holds nothing of it (a second Ctrl-C while draining is held
        until it is done)."""
        batch.cancel()
        while not batch.done:
            try:
                batch.poll()
            except KeyboardInterrupt:
                batch.cancel()

    def _run(self, texts: List[Optional[str]], ids: List[List[int]],
             params: List[SamplingParams]) -> List[RequestOutput]:
        if not ids:
            return []
        arrival = time.time()
        batch, rids = self._submit(ids, params)
        outs = [RequestOutput(rids[i], texts[i], ids[i], None,
                              [CompletionOutput(c, "", []) for c in range(params[i].n)], False,
                              RequestMetrics(arrival_time=arrival))
                for i in range(len(ids))]
        want_lp = [p.logprobs is not None for p in params]
        pieces: Dict[Tuple[int, int], List[str]] = {}
        errors: List[str] = []
        try:
            while not batch.done:
                for ev in batch.poll():
                    (i, c, text, tokens, lps, tops, plps, ptops, finished, reason, timings, error,
                     prompt_tokens, cached) = ev
                    o = outs[i]
                    co = o.outputs[c]
                    if text:
                        pieces.setdefault((i, c), []).append(text)
                    co.token_ids.extend(tokens)
                    if want_lp[i] and lps:
                        if co.logprobs is None:
                            co.logprobs, co.cumulative_logprob = [], 0.0
                        for k, (tok, lp) in enumerate(lps):
                            co.logprobs.append(self._position(tok, lp, tops[k] if k < len(tops) else []))
                            co.cumulative_logprob += lp
                    if plps and o.prompt_logprobs is None:
                        o.prompt_logprobs = [None] + [
                            self._position(tok, lp, ptops[k] if k < len(ptops) else [])
                            for k, (tok, lp) in enumerate(plps) if k > 0]
                    o.num_cached_tokens = cached
                    if finished:
                        co.finish_reason = reason
                        if reason == "error":
                            errors.append(f"prompt {i}: {error}")
                        if timings is not None and c == 0:
                            o.metrics = self._metrics(arrival, timings)
        except BaseException:
            self._abort(batch)
            raise
        for (i, c), parts in pieces.items():
            outs[i].outputs[c].text = "".join(parts)
        for o in outs:
            o.finished = True
        if errors:
            raise RuntimeError("; ".join(errors))
        return outs

    def _delta(self, ev: tuple, texts: List[Optional[str]], ids: List[List[int]], rids: List[str],
               arrival: float) -> Optional[RequestOutput]:
        (i, c, text, tokens, lps, tops, plps, ptops, finished, reason, timings, error, _, cached) = ev
        if finished and reason == "error":
            raise RuntimeError(f"prompt {i}: {error}")
        if not (text or tokens or finished):
            return None
        logprobs = [self._position(tok, lp, tops[k] if k < len(tops) else []) for k, (tok, lp) in enumerate(lps)]
        co = CompletionOutput(c, text, list(tokens), None, logprobs or None, reason if finished else None)
        prompt_lps = None
        if plps:
            prompt_lps = [None] + [self._position(tok, lp, ptops[k] if k < len(ptops) else [])
                                   for k, (tok, lp) in enumerate(plps) if k > 0]
        return RequestOutput(rids[i], texts[i], ids[i], prompt_lps, [co], finished,
                             self._metrics(arrival, timings) if timings is not None else None, cached)

    def _position(self, token: int, logprob: float, top: List[Tuple[int, float]]) -> Dict[int, Logprob]:
        d: Dict[int, Logprob] = {}
        for rank, (t, lp) in enumerate(top, start=1):
            d[t] = Logprob(lp, rank, self._engine.piece(t))
        if token not in d:
            d = {token: Logprob(logprob, None, self._engine.piece(token)), **d}
        return d

    @staticmethod
    def _metrics(arrival: float, t: Dict[str, Any]) -> RequestMetrics:
        m = RequestMetrics(arrival_time=arrival, **t)
        m.time_in_queue = t["queued_s"]
        m.first_token_time = arrival + t["ttft_s"] if t["generated_tokens"] > 0 else None
        m.finished_time = time.time()
        return m

"""What generate() returns, shaped as vLLM's RequestOutput."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional


@dataclass
class Logprob:
    """One token's log-probability; rank is its place among the top
    alternatives (1: the most likely), None when it is not among them."""

    logprob: float
    rank: Optional[int] = None
    decoded_token: Optional[str] = None


# Per position: the chosen token's Logprob and those of the top alternatives.
SampleLogprobs = List[Dict[int, Logprob]]
PromptLogprobs = List[Optional[Dict[int, Logprob]]]


@dataclass
class RequestMetrics:
    """How the request went, phase by phase (seconds; the engine's own clock
    for the phases, the wall clock for the timestamps)."""

    arrival_time: float = 0.0
    first_token_time: Optional[float] = None
    finished_time: Optional[float] = None
    time_in_queue: float = 0.0
    queued_s: float = 0.0
    prefill_s: float = 0.0
    ttft_s: float = 0.0
    decode_s: float = 0.0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    generated_tokens: int = 0
    preemptions: int = 0
    decode_steps: int = 0
    drafted: int = 0
    accepted: int = 0


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: List[int]
    cumulative_logprob: Optional[float] = None
    logprobs: Optional[SampleLogprobs] = None
    finish_reason: Optional[str] = None
    stop_reason: Optional[str] = None

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    request_id: str
    prompt: Optional[str]
    prompt_token_ids: List[int]
    prompt_logprobs: Optional[PromptLogprobs]
    outputs: List[CompletionOutput]
    finished: bool
    metrics: Optional[RequestMetrics] = None
    num_cached_tokens: int = 0


@dataclass
class PromptScore:
    """A text's log-probability under the model (LLM.score): token_logprobs[i]
    is log p(token i | tokens before it); the first token has none."""

    prompt: Optional[str]
    prompt_token_ids: List[int]
    token_logprobs: List[Optional[float]] = field(default_factory=list)

    @property
    def logprob(self) -> float:
        return sum(x for x in self.token_logprobs if x is not None)

    @property
    def perplexity(self) -> float:
        import math

        scored = [x for x in self.token_logprobs if x is not None]
        return math.exp(-sum(scored) / len(scored)) if scored else float("nan")

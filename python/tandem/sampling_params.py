"""SamplingParams: how one request samples, under vLLM's field names."""
from __future__ import annotations

from dataclasses import dataclass, field
import json
from typing import Any, Dict, List, Optional, Union


@dataclass
class SamplingParams:
    """vLLM's SamplingParams, the fields the engine implements.

    Defaults are vLLM's (temperature 1, no top-k/top-p/min-p, 16 tokens);
    ``temperature=0`` is greedy. ``max_tokens=None`` generates until the
    context is full; ``max_tokens=0`` computes the prompt alone (with
    ``prompt_logprobs``, a scoring pass).
    """

    n: int = 1
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: Optional[int] = None
    stop: Optional[Union[str, List[str]]] = None
    ignore_eos: bool = False
    max_tokens: Optional[int] = 16
    min_tokens: int = 0
    logprobs: Optional[int] = None
    prompt_logprobs: Optional[int] = None
    logit_bias: Optional[Dict[int, float]] = None
    # Tandem's own: how many recent tokens the penalties look at (-1: all,
    # as vLLM does), and output constrained to JSON fitting a schema.
    repeat_last_n: int = -1
    json_schema: Optional[Union[str, Dict[str, Any]]] = None
    stop_strings: List[str] = field(init=False, repr=False, default_factory=list)

    def __post_init__(self) -> None:
        if self.stop is None:
            self.stop_strings = []
        elif isinstance(self.stop, str):
            self.stop_strings = [self.stop]
        else:
            self.stop_strings = list(self.stop)
        if self.n < 1:
            raise ValueError(f"n must be at least 1, got {self.n}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be non-negative, got {self.temperature}")
        if self.min_tokens != 0:
            # Refused rather than ignored: the engine has no minimum length.
            raise ValueError("min_tokens: the engine does not implement a minimum length (only 0 is accepted)")
        if self.top_k < 0:  # vLLM's -1 for "off"
            self.top_k = 0

    def _engine_dict(self, seed: Optional[int] = None) -> Dict[str, Any]:
        """The request's parameters under the engine's names (src/python/module.cpp)."""
        d: Dict[str, Any] = {
            "temperature": float(self.temperature),
            "top_k": int(self.top_k),
            "top_p": float(self.top_p),
            "min_p": float(self.min_p),
            "repetition_penalty": float(self.repetition_penalty),
            "repeat_last_n": int(self.repeat_last_n),
            "frequency_penalty": float(self.frequency_penalty),
            "presence_penalty": float(self.presence_penalty),
            "max_tokens": -1 if self.max_tokens is None else int(self.max_tokens),
            "stop": list(self.stop_strings),
            "ignore_eos": bool(self.ignore_eos),
            "n": int(self.n),
            "logprobs": -1 if self.logprobs is None else int(self.logprobs),
            "prompt_logprobs": -1 if self.prompt_logprobs is None else int(self.prompt_logprobs),
        }
        s = self.seed if self.seed is not None else seed
        if s is not None:
            if s < 0:
                raise ValueError(f"seed must not be negative, got {s}")
            d["seed"] = int(s)
        if self.logit_bias:
            d["logit_bias"] = [(int(k), float(v)) for k, v in self.logit_bias.items()]
        if self.json_schema is not None:
            d["json_schema"] = self.json_schema if isinstance(self.json_schema, str) else json.dumps(self.json_schema)
        return d

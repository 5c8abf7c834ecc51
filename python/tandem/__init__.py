"""Tandem's engine from Python, with vLLM's offline API:

    from tandem import LLM, SamplingParams
    llm = LLM(model="gemma-3-270m-q4_k_m.gguf")
    out = llm.generate(["Once upon a time"], SamplingParams(temperature=0, max_tokens=32))
    print(out[0].outputs[0].text)
"""
from .llm import LLM, Tokenizer
from .outputs import CompletionOutput, Logprob, PromptScore, RequestMetrics, RequestOutput
from .sampling_params import SamplingParams

__all__ = ["LLM", "SamplingParams", "RequestOutput", "CompletionOutput", "Logprob", "RequestMetrics",
           "PromptScore", "Tokenizer"]

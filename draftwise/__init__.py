"""draftwise: an LLM inference and serving engine built around speculative decoding."""
from .engine.gc_pause import paused_gc

with paused_gc():  # torch's and transformers' imports make long-lived objects by the hundred thousand
    from .compat.vllm import module_paths
    from .engine.arg_utils import EngineArgs
    from .engine.engine import LLMEngine
    from .inputs import TextPrompt, TokensPrompt
    from .llm import LLM
    from .outputs import CompletionOutput, Logprob, RequestOutput
    from .sampling_params import SamplingParams, StructuredOutputsParams

module_paths.install()  # vLLM's module paths its examples import (draftwise.v1.metrics.reader, ...)

__all__ = ["LLM", "SamplingParams", "RequestOutput", "CompletionOutput", "Logprob", "EngineArgs", "LLMEngine",
           "TextPrompt", "TokensPrompt", "StructuredOutputsParams"]
__version__ = "0.1.0"

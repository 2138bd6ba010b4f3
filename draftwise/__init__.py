"""draftwise: an LLM inference and serving engine built around speculative decoding."""
from .engine.arg_utils import EngineArgs
from .engine.engine import LLMEngine
from .inputs import TextPrompt, TokensPrompt
from .llm import LLM
from .outputs import CompletionOutput, Logprob, RequestOutput
from .sampling_params import SamplingParams, StructuredOutputsParams

__all__ = ["LLM", "SamplingParams", "RequestOutput", "CompletionOutput", "Logprob", "EngineArgs", "LLMEngine",
           "TextPrompt", "TokensPrompt", "StructuredOutputsParams"]
__version__ = "0.1.0"

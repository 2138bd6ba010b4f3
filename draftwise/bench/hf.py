"""Hugging Face transformers on the same weights: plain ``generate`` and prompt lookup.

``HFRunner(model_path, dtype, device, eos_token_ids)`` loads ``AutoModelForCausalLM`` from the
directory a draftwise engine loaded (``engine.config.model_path``; for a GGUF model, the file
through transformers' GGUF loader) in the engine's dtype and device, and stops at the engine's EOS ids.
``run_pass(prompts, params, num_speculative_tokens)`` runs the prompts' token ids one request
at a time (transformers' prompt lookup handles one sequence): ``generate(ids)`` when
``num_speculative_tokens`` is None, else
``generate(ids, prompt_lookup_num_tokens=K)``; greedy, or sampled after
``torch.manual_seed(params.seed)``. It returns a ``PassResult`` with output tokens and wall
time only (no TTFT, ITL or acceptance counters).
"""
from __future__ import annotations

import time

import torch

from .. import SamplingParams
from ..models.loader import load_transformers_model
from .measure import WARMUP_TOKENS, PassResult, PromptInput, RequestSample


class HFRunner:
    def __init__(self, model_path, dtype: torch.dtype, device: torch.device, eos_token_ids: list[int]):
        self.device = device
        self.model = load_transformers_model(model_path, dtype).to(device)
        self.eos_token_ids = sorted(eos_token_ids)

    def warm_up(self, prompt: PromptInput, num_speculative_tokens: int | None) -> None:
        self._generate(prompt.token_ids, SamplingParams(temperature=0.0, max_tokens=WARMUP_TOKENS),
                       num_speculative_tokens)

    def run_pass(self, prompts: list[PromptInput], params: list[SamplingParams],
                 num_speculative_tokens: int | None) -> PassResult:
        samples, seconds = [], 0.0
        for index, (prompt, p) in enumerate(zip(prompts, params)):
            start = time.perf_counter()
            token_ids = self._generate(prompt.token_ids, p, num_speculative_tokens)
            seconds += time.perf_counter() - start
            samples.append(RequestSample(index, token_ids, ttft=None, tpot=None, gaps=[]))
        return PassResult(seconds, samples, spec=None)

    @torch.inference_mode()
    def _generate(self, token_ids: list[int], params: SamplingParams, num_speculative_tokens: int | None) -> list[int]:
        ids = torch.tensor([token_ids], device=self.device)
        kwargs = dict(max_new_tokens=params.max_tokens, eos_token_id=self.eos_token_ids,
                      pad_token_id=self.eos_token_ids[0], attention_mask=torch.ones_like(ids))
        if params.temperature > 0:
            torch.manual_seed(params.seed or 0)
            kwargs.update(do_sample=True, temperature=params.temperature, top_p=1.0, top_k=0)
        else:
            kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        if num_speculative_tokens is not None:
            kwargs["prompt_lookup_num_tokens"] = num_speculative_tokens
        out = self.model.generate(ids, **kwargs)
        return out[0, len(token_ids):].tolist()

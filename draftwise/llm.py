"""The offline API: ``LLM(model=...).generate(prompts, sampling_params)`` as in vLLM.

``LLM`` is a thin layer over ``LLMEngine``: it normalises prompts and
sampling params, queues every request, steps the engine until all are done
(continuous batching does the rest) and returns outputs in input order.
"""
from __future__ import annotations

import itertools
import time
from collections.abc import Sequence as SequenceABC

from tqdm.auto import tqdm

from .engine.arg_utils import engine_config_from_kwargs
from .engine.engine import LLMEngine
from .metrics.reader import Metric
from .outputs import RequestOutput
from .sampling_params import SamplingParams


class LLM:
    def __init__(self, model: str | None = None, **kwargs):
        self.config = engine_config_from_kwargs(model=model, **kwargs)
        self.llm_engine = LLMEngine(self.config)
        self._counter = itertools.count()

    def get_metrics(self) -> list[Metric]:
        """vLLM's metrics since start-up: ``Counter``, ``Gauge``, ``Vector`` and ``Histogram`` objects
        (``draftwise.metrics.reader``) named ``vllm:*``, as vLLM's ``LLM.get_metrics()`` returns them."""
        return self.llm_engine.get_metrics()

    def get_spec_decode_stats(self) -> dict:
        """Speculative decoding counters and derived rates (vLLM's names, without the prefix).

        Keys: ``spec_decode_num_drafts``, ``spec_decode_num_draft_tokens``,
        ``spec_decode_num_accepted_tokens``, ``spec_decode_num_accepted_tokens_per_pos``,
        ``spec_decode_acceptance_rate``, ``spec_decode_mean_acceptance_length``,
        ``spec_decode_per_position_acceptance``; beyond vLLM's, ``spec_decode_draft_limits`` (what
        limited each sequence's drafts, per step) and ``spec_decode_step_cost`` (the step times the
        drafts were priced with, predicted vs observed). Empty without speculative decoding.
        """
        return self.llm_engine.get_spec_decode_stats()

    def get_default_sampling_params(self) -> SamplingParams:
        """The model's own sampling defaults (``generation_config``, see ``models/generation_config.py``);
        what ``generate`` and ``chat`` use when given no sampling params, as in vLLM."""
        return SamplingParams(**self.llm_engine.sampling_defaults)

    def get_tokenizer(self):
        return self.llm_engine.tokenizer

    def generate(self, prompts, sampling_params: SamplingParams | list[SamplingParams] | None = None,
                 use_tqdm: bool = True) -> list[RequestOutput]:
        prompts = _as_prompt_list(prompts)
        params = _as_params_list(self.get_default_sampling_params() if sampling_params is None else sampling_params,
                                 len(prompts))
        ids = [f"gen-{next(self._counter)}" for _ in prompts]
        added = []
        try:
            for rid, prompt, p in zip(ids, prompts, params):
                self.llm_engine.add_request(rid, prompt, p)
                added.append(rid)
        except Exception:
            self.llm_engine.abort_request(added)  # all-or-nothing: leave the engine as it was
            raise
        return self._run(ids, use_tqdm)

    def chat(self, messages, sampling_params=None, use_tqdm: bool = True,
             add_generation_prompt: bool = True, chat_template: str | None = None) -> list[RequestOutput]:
        conversations = [messages] if messages and isinstance(messages[0], dict) else list(messages)
        tokenizer = self.get_tokenizer()
        prompts = [tokenizer.apply_chat_template(conv, tokenize=False, chat_template=chat_template,
                                                 add_generation_prompt=add_generation_prompt)
                   for conv in conversations]
        token_prompts = [{"prompt": p, "prompt_token_ids": tokenizer.encode(p, add_special_tokens=False)}
                         for p in prompts]
        return self.generate(token_prompts, sampling_params, use_tqdm)

    def _run(self, ids: list[str], use_tqdm: bool) -> list[RequestOutput]:
        engine, pending = self.llm_engine, set(ids)
        finished: dict[str, RequestOutput] = {}
        bar = tqdm(total=len(ids), desc="Processed prompts", disable=not use_tqdm, dynamic_ncols=True)
        start, num_out = time.perf_counter(), 0
        try:
            while pending:
                for out in engine.step():
                    if out.finished and out.request_id in pending:
                        pending.discard(out.request_id)
                        finished[out.request_id] = out
                        num_out += sum(len(c.token_ids) for c in out.outputs)
                        bar.update(1)
                        bar.set_postfix_str(f"output {num_out / (time.perf_counter() - start):.1f} tok/s")
        except BaseException:
            engine.abort_request(list(pending))
            raise
        finally:
            bar.close()
            if engine.speculator:
                engine.speculator.flush_log()
        return [finished[rid] for rid in ids]


def _as_prompt_list(prompts) -> list:
    if isinstance(prompts, (str, dict)):
        return [prompts]
    if isinstance(prompts, SequenceABC) and prompts and all(isinstance(t, int) for t in prompts):
        return [{"prompt_token_ids": list(prompts)}]
    if not isinstance(prompts, SequenceABC) or not prompts:
        raise ValueError("prompts must be a str, a dict, or a non-empty list of them")
    return list(prompts)


def _as_params_list(params, num_prompts: int) -> list[SamplingParams]:
    if isinstance(params, SamplingParams):
        return [params] * num_prompts
    params = list(params)
    if len(params) != num_prompts:
        raise ValueError(f"got {len(params)} sampling_params for {num_prompts} prompts")
    if not all(isinstance(p, SamplingParams) for p in params):
        raise ValueError("sampling_params must be SamplingParams objects")
    return params

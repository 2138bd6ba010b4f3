"""One configuration on one workload: build its engine, warm it up, time passes of requests.

``run_pass(llm, prompts, params, concurrency)`` sends every prompt through
``LLMEngine.add_request``/``step`` with ``concurrency`` requests in flight (a closed loop:
when one finishes, the next prompt starts) and returns a ``PassResult``:

* output tokens/s = output tokens of the pass / its wall time (prefill included);
* per request, from ``RequestOutput.metrics``: TTFT = ``first_token_time - arrival_time``,
  TPOT = ``(finished_time - first_token_time) / (tokens - 1)``; and from the step loop, ITL =
  the gaps between steps that gave the request new tokens (vLLM's definition: with
  speculation one step may bring several tokens, so ITL >= TPOT);
* speculative counters: differences of ``LLM.get_spec_decode_stats()`` around the pass
  (a ``SpecDecodingStats``; ``None`` for ``none``).

Prompts are ``PromptInput``s, tokenized once per workload (chat messages through the
model's chat template, as ``LLM.chat`` does), so every configuration and transformers get
the very same token ids.
"""
from __future__ import annotations

import itertools
import time
from dataclasses import dataclass

from .. import LLM, SamplingParams, StructuredOutputsParams
from ..spec_decode.metrics import SpecDecodingStats
from .workloads import BenchPrompt
from .options import BenchOptions, Configuration

WARMUP_TOKENS = 8
WARMUP_TEXT = "The quick brown fox jumps over the lazy dog. Sentence {}:"
_REQUEST_IDS = itertools.count()


@dataclass(slots=True, frozen=True)
class PromptInput:
    name: str
    text: str
    token_ids: list[int]

    def as_engine_prompt(self) -> dict:
        return {"prompt": self.text, "prompt_token_ids": self.token_ids}


@dataclass(slots=True)
class RequestSample:
    prompt_index: int
    token_ids: list[int]  # output
    ttft: float | None  # seconds from arrival to the first output token (None: not measured)
    tpot: float | None  # seconds per output token after the first (None for one token)
    gaps: list[float]  # seconds between steps that gave new tokens


@dataclass(slots=True)
class PassResult:
    seconds: float
    samples: list[RequestSample]  # in prompt order
    spec: SpecDecodingStats | None
    grammar: tuple[int, int, float] | None = None  # structured outputs: grammar drafts, accepted, host seconds

    @property
    def num_tokens(self) -> int:
        return sum(len(s.token_ids) for s in self.samples)

    @property
    def tokens_per_s(self) -> float:
        return self.num_tokens / self.seconds if self.seconds > 0 else 0.0


def tokenize_prompts(tokenizer, prompts: list[BenchPrompt]) -> list[PromptInput]:
    inputs = []
    for prompt in prompts:
        if prompt.messages is not None and tokenizer.chat_template is not None:
            text = tokenizer.apply_chat_template(prompt.messages, tokenize=False, add_generation_prompt=True)
            ids = tokenizer.encode(text, add_special_tokens=False)
        elif prompt.messages is not None:  # a base model without a chat template: the messages as text
            text = "\n\n".join(m["content"] for m in prompt.messages) + "\n\n"
            ids = tokenizer.encode(text, add_special_tokens=True)
        else:
            text, ids = prompt.prompt, tokenizer.encode(prompt.prompt, add_special_tokens=True)
        inputs.append(PromptInput(prompt.name, text, list(ids)))
    return inputs


def sampling_params(options: BenchOptions, prompts: list[BenchPrompt]) -> list[SamplingParams]:
    """Greedy, or sampled with a seed per prompt so every configuration draws the same way; with
    ``options.structured_outputs`` a prompt with a schema is constrained to it."""
    greedy = options.temperature == 0
    return [SamplingParams(temperature=options.temperature, max_tokens=options.max_tokens,
                           seed=None if greedy else options.seed + i,
                           structured_outputs=StructuredOutputsParams(
                               json=prompt.schema, disable_any_whitespace=options.compact_json)
                           if options.structured_outputs and prompt.schema else None)
            for i, prompt in enumerate(prompts)]


def build_engine(options: BenchOptions, config: Configuration, concurrency: int) -> LLM:
    """The configuration's engine for ``concurrency`` requests at once (``max_num_seqs``, which also
    sizes the default KV cache), warmed up with that many short requests."""
    additional = dict(options.additional_config or {})
    if config.grammar_drafts is not None:
        additional["grammar_drafts"] = config.grammar_drafts
    llm = LLM(model=options.model, dtype=options.dtype, device=options.device, seed=options.seed,
              max_num_seqs=concurrency, speculative_config=config.speculative_config,
              kv_cache_memory_bytes=options.kv_cache_memory_bytes, additional_config=additional or None,
              compilation_config=options.compilation_config, enforce_eager=options.enforce_eager)
    warmup = [BenchPrompt("warmup", prompt=WARMUP_TEXT.format(i)) for i in range(concurrency)]
    params = SamplingParams(temperature=0.0, max_tokens=WARMUP_TOKENS)
    run_pass(llm, tokenize_prompts(llm.get_tokenizer(), warmup), [params] * concurrency, concurrency)
    return llm


def run_pass(llm: LLM, prompts: list[PromptInput], params: list[SamplingParams], concurrency: int) -> PassResult:
    engine = llm.llm_engine
    before = llm.get_spec_decode_stats()
    queue = list(range(len(prompts)))
    running: dict[str, _Tracker] = {}
    samples: dict[int, RequestSample] = {}
    start = time.perf_counter()
    try:
        while queue or running:
            while queue and len(running) < concurrency:
                index = queue.pop(0)
                request_id = f"bench-{next(_REQUEST_IDS)}"
                engine.add_request(request_id, prompts[index].as_engine_prompt(), params[index])
                running[request_id] = _Tracker(index)
            for out in engine.step():
                tracker = running.get(out.request_id)
                if tracker is not None and tracker.observe(out, time.time()):
                    samples[tracker.prompt_index] = tracker.sample(out)
                    del running[out.request_id]
    except BaseException:
        engine.abort_request(list(running))
        raise
    seconds = time.perf_counter() - start
    after = llm.get_spec_decode_stats()
    return PassResult(seconds, [samples[i] for i in range(len(prompts))], counters_between(before, after),
                      grammar_between(before, after))


class _Tracker:
    """Token arrival times of one request, as the step loop sees them."""

    def __init__(self, prompt_index: int):
        self.prompt_index = prompt_index
        self.num_tokens = 0
        self.last_time = 0.0
        self.gaps: list[float] = []

    def observe(self, out, now: float) -> bool:
        """Record the step's new tokens; True once the request has finished."""
        num_tokens = len(out.outputs[0].token_ids)
        if num_tokens > self.num_tokens:
            if self.num_tokens:
                self.gaps.append(now - self.last_time)
            self.num_tokens, self.last_time = num_tokens, now
        return out.finished

    def sample(self, out) -> RequestSample:
        m = out.metrics
        token_ids = list(out.outputs[0].token_ids)
        ttft = (m.first_token_time or m.finished_time) - m.arrival_time
        tpot = (m.finished_time - m.first_token_time) / (len(token_ids) - 1) if len(token_ids) > 1 else None
        return RequestSample(self.prompt_index, token_ids, ttft, tpot, self.gaps)


def grammar_between(before: dict, after: dict) -> tuple[int, int, float] | None:
    """(drafted, accepted, seconds): what the grammar's counters grew by (None without structured outputs)."""
    if "grammar_num_draft_tokens" not in after:
        return None
    return tuple(after[key] - before.get(key, 0) for key in ("grammar_num_draft_tokens",
                                                             "grammar_num_accepted_tokens", "grammar_seconds"))


def counters_between(before: dict, after: dict) -> SpecDecodingStats | None:
    """What the engine's speculative counters grew by (``None`` without speculation)."""
    if "spec_decode_num_drafts" not in after:
        return None
    per_pos_after = after["spec_decode_num_accepted_tokens_per_pos"]
    per_pos_before = before.get("spec_decode_num_accepted_tokens_per_pos", [0] * len(per_pos_after))
    return SpecDecodingStats(
        num_spec_tokens=len(per_pos_after),
        num_drafts=after["spec_decode_num_drafts"] - before.get("spec_decode_num_drafts", 0),
        num_draft_tokens=after["spec_decode_num_draft_tokens"] - before.get("spec_decode_num_draft_tokens", 0),
        num_accepted_tokens=after["spec_decode_num_accepted_tokens"] - before.get("spec_decode_num_accepted_tokens", 0),
        num_accepted_tokens_per_pos=[a - b for a, b in zip(per_pos_after, per_pos_before)])


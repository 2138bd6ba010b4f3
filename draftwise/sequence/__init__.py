"""Per-sequence state: tokens, how many have K/V in the cache, blocks, and finish state.

A request with ``n > 1`` owns ``n`` sequences. The scheduler and runner only
see sequences; the engine groups them back into one ``RequestOutput``.
Invariant: positions ``[0, num_computed_tokens)`` have K/V in the cache at
the slots given by ``block_ids``; ``all_token_ids[num_computed_tokens:]``
still have to be run through the model.
"""
from __future__ import annotations

import enum
import itertools

from ..outputs import Logprob
from ..sampling_params import SamplingParams
from .spec_state import SpecState

_seq_counter = itertools.count()


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class Sequence:
    def __init__(self, request_id: str, index: int, prompt_token_ids: list[int],
                 params: SamplingParams, seed: int, arrival_time: float):
        self.seq_id = next(_seq_counter)
        self.request_id = request_id
        self.index = index
        self.params = params
        self.seed = seed  # keys the stateless sampling noise: (seed, position)
        self.prompt_token_ids = list(prompt_token_ids)
        self.all_token_ids = list(prompt_token_ids)
        self.num_prompt_tokens = len(prompt_token_ids)
        self.num_computed_tokens = 0
        self.block_ids: list[int] = []
        self.block_table_row: int | None = None  # its row of the BlockManager's BlockTable
        self.block_keys: list[int] = []  # prefix-cache keys of the leading full computed blocks
        self.num_cached_tokens = 0  # prompt tokens found in the prefix cache at admission
        self.status = SequenceStatus.WAITING
        self.arrival_time = arrival_time
        self.first_scheduled_time: float | None = None
        self.first_token_time: float | None = None
        self.finished_time: float | None = None
        self.finish_reason: str | None = None
        self.stop_reason: int | str | None = None
        self.num_preemptions = 0
        self.logprobs: list[dict[int, Logprob]] | None = [] if params.logprobs is not None else None
        self.cumulative_logprob = 0.0
        self.text = ""  # detokenized output, truncated at a stop string when one matched
        self.spec = SpecState()  # drafts, drafter position, acceptance counters (spec_state.py)
        self.kv_transfer_params: dict | None = None  # what a proposer handed over (hidden states file)

    def truncate_output(self, num_output_tokens: int) -> None:
        """Keep the first ``num_output_tokens`` output tokens (a finished sequence's output only)."""
        del self.all_token_ids[self.num_prompt_tokens + num_output_tokens:]
        if self.logprobs is not None:
            del self.logprobs[num_output_tokens:]
            self.cumulative_logprob = sum(entry[token].logprob
                                          for entry, token in zip(self.logprobs, self.output_token_ids))
        self.text, self.stop_reason = "", None

    def num_draft_slots(self, max_model_len: int) -> int:
        """Drafts that fit before ``max_model_len`` and ``max_tokens``, leaving room for the token the
        verifying step samples after them (>= 0)."""
        limit = max_model_len - self.num_tokens - 1
        if self.params.max_tokens is not None:
            limit = min(limit, self.params.max_tokens - self.num_output_tokens - 1)
        return max(0, limit)

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def output_token_ids(self) -> list[int]:
        return self.all_token_ids[self.num_prompt_tokens:]

    @property
    def num_output_tokens(self) -> int:
        return len(self.all_token_ids) - self.num_prompt_tokens

    @property
    def is_finished(self) -> bool:
        return self.status == SequenceStatus.FINISHED

    def __repr__(self) -> str:
        return (f"Sequence({self.request_id}#{self.index}, tokens={self.num_tokens}, "
                f"computed={self.num_computed_tokens}, {self.status.value})")

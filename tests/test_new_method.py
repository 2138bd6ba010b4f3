"""A new method is one file: a proposer defined here, and registered, runs through the proposer
contract and the engine (greedy outputs equal plain decoding) without touching any other file.

The proposer drafts the token at a fixed distance back, repeated (``lookback`` is its own
``speculative_config`` key, from its ``Options``). It is registered for this module only, so
the other modules' lists of registered methods stay as they are.
"""
from __future__ import annotations

from dataclasses import dataclass

import pytest
from conftest import PROMPTS, greedy
from test_proposer_contract import (
    check_all_zero_limits_give_an_empty_batch,
    check_drafts_respect_max_tokens_and_max_model_len,
    check_shapes_padding_and_clipping,
    check_state_is_released_after_requests_finish_or_abort,
)
from test_spec_equivalence import REPEAT_PROMPT

from draftwise import LLM
from draftwise.spec_decode import interface
from draftwise.spec_decode.interface import DraftBatch, ProposeBatch, Proposer, register
from draftwise.validate import check_int

METHOD = "lookback_test"


class LookbackProposer(Proposer):
    method = METHOD

    @dataclass
    class Options:
        lookback: int = 6

        def __post_init__(self) -> None:
            check_int("lookback", self.lookback, 1)

    def propose(self, batch: ProposeBatch) -> DraftBatch:
        back = self.options.lookback
        drafts = []
        for seq, limit in zip(batch.seqs, batch.max_num_drafts):
            tokens = seq.all_token_ids
            drafts.append(tokens[-back:][:limit] if len(tokens) >= back and limit > 0 else [])
        return DraftBatch.from_lists(drafts)


@pytest.fixture(scope="module")
def registered():
    """Register the method for this module's tests, and forget it afterwards."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(interface._REGISTRY, METHOD, LookbackProposer)  # restored on exit
        register(LookbackProposer)
        yield {"method": METHOD, "num_speculative_tokens": 4, "lookback": 6}


@pytest.fixture(scope="module")
def llm(registered, tiny_model_dir):
    return LLM(model=str(tiny_model_dir), dtype="float32", speculative_config=registered)


def test_the_method_is_registered_and_validated(registered, tiny_model_dir):
    assert METHOD in interface.registered_methods()
    with pytest.raises(ValueError, match="lookback"):
        LLM(model=str(tiny_model_dir), speculative_config={**registered, "lookback": 0})


def test_contract(llm):
    check_shapes_padding_and_clipping(llm.llm_engine)
    check_all_zero_limits_give_an_empty_batch(llm.llm_engine)
    check_state_is_released_after_requests_finish_or_abort(llm.llm_engine)


def test_drafts_respect_limits(registered, tiny_model_dir):
    llm = LLM(model=str(tiny_model_dir), dtype="float32", speculative_config=registered, max_model_len=128)
    check_drafts_respect_max_tokens_and_max_model_len(llm)


def test_greedy_equals_plain_and_drafts_are_verified(llm, tiny_llm):
    prompts = PROMPTS[:4] + [REPEAT_PROMPT]
    params = greedy(40, ignore_eos=True)
    expected = [o.outputs[0].token_ids for o in tiny_llm.generate(prompts, params, use_tqdm=False)]
    got = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    assert got == expected
    metrics = llm.get_spec_decode_stats()
    assert metrics["spec_decode_num_drafts"] > 0 and metrics["spec_decode_num_accepted_tokens"] > 0

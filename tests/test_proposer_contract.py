"""The proposer contract, checked for every registered method: shapes, -1 padding, clipping to
``max_num_drafts`` (including zero), and release of per-sequence state.

The ``check_*`` functions are the contract; any engine with a proposer can be run through
them (``test_new_method.py`` does so for a proposer defined in a test module)."""
from __future__ import annotations

import pytest
import torch
from conftest import PROMPTS, greedy
from test_spec_equivalence import drafting_methods, spec_configs

from draftwise import LLM
from draftwise.paged import ForwardInput
from draftwise.sampling_params import SamplingParams
from draftwise.sequence import Sequence
from draftwise.spec_decode import ProposeBatch
from draftwise.spec_decode.interface import TargetHidden


@pytest.fixture(scope="module", params=drafting_methods())
def engine(request, tiny_model_dir, spec_dirs):
    config = spec_configs(spec_dirs)[request.param]
    return LLM(model=str(tiny_model_dir), dtype="float32", speculative_config=config).llm_engine


def _running_seqs(engine, prompts: list[str]) -> list[Sequence]:
    """Sequences with blocks for their tokens, as the engine hands them to a proposer."""
    seqs = []
    for i, prompt in enumerate(prompts):
        ids = engine.tokenizer.encode(prompt) * 2  # repeated, so n-gram style methods find matches
        seq = Sequence(f"contract-{i}", 0, ids, SamplingParams(temperature=0), seed=i, arrival_time=0.0)
        assert engine.block_manager.ensure(seq, seq.num_tokens + 16)
        seqs.append(seq)
    return seqs


def _batch(engine, seqs: list[Sequence], limits: list[int]) -> ProposeBatch:
    """What the engine hands a proposer after a step; for hidden-state proposers the target's
    rows of every position, as after each sequence's prefill."""
    needs = engine.speculator.needs
    if not (needs.hidden_states or needs.aux_layer_ids):
        return ProposeBatch(seqs, limits)
    hidden, aux, cu = engine.runner.paged.forward([ForwardInput(s.all_token_ids, 0, s.block_ids) for s in seqs],
                                            needs.aux_layer_ids)
    return ProposeBatch(seqs, limits, TargetHidden(hidden, aux, cu, seqs, [0] * len(seqs)))


def check_shapes_padding_and_clipping(engine):
    seqs = _running_seqs(engine, PROMPTS[:5])
    limits = [0, 1, 3, 2, 3]
    proposer = engine.speculator.proposer
    drafts = proposer.propose(_batch(engine, seqs, limits))
    assert drafts.token_ids.dtype == torch.int64
    assert drafts.token_ids.shape[0] == len(seqs)
    assert drafts.token_ids.shape[1] == max(drafts.num_draft_tokens, default=0)
    vocab = engine.hf_config.vocab_size
    for row, num, limit in zip(drafts.token_ids.tolist(), drafts.num_draft_tokens, limits):
        assert 0 <= num <= limit
        assert all(0 <= t < vocab for t in row[:num])
        assert all(t == -1 for t in row[num:])
    if drafts.probs is not None:
        assert drafts.probs.shape == (*drafts.token_ids.shape, vocab)
    assert sum(drafts.num_draft_tokens) > 0  # repeated prompts give every method something to draft
    for seq in seqs:
        proposer.on_finished(seq)
        engine.block_manager.free(seq)


def check_all_zero_limits_give_an_empty_batch(engine):
    seqs = _running_seqs(engine, PROMPTS[:2])
    drafts = engine.speculator.proposer.propose(_batch(engine, seqs, [0, 0]))
    assert drafts.num_draft_tokens == [0, 0] and drafts.token_ids.shape == (2, 0)
    for seq in seqs:
        engine.speculator.proposer.on_finished(seq)
        engine.block_manager.free(seq)


def check_state_is_released_after_requests_finish_or_abort(engine):
    llm_engine = engine
    proposer = llm_engine.speculator.proposer
    llm_engine.add_request("done", PROMPTS[6], greedy(12))
    llm_engine.add_request("aborted", PROMPTS[2], greedy(40))
    for _ in range(3):
        llm_engine.step()
    llm_engine.abort_request("aborted")
    while llm_engine.has_unfinished_requests():
        llm_engine.step()
    assert proposer.tracked_seq_ids() == set()
    assert llm_engine.block_manager.num_free_blocks == llm_engine.block_manager.num_blocks


def check_drafts_respect_max_tokens_and_max_model_len(llm):
    prompt_len = len(llm.get_tokenizer().encode(PROMPTS[6]))
    out = llm.generate(PROMPTS[6], greedy(200, ignore_eos=True), use_tqdm=False)[0].outputs[0]
    assert len(out.token_ids) == llm.llm_engine.max_model_len - prompt_len and out.finish_reason == "length"
    for max_tokens in (1, 2, 7):
        out = llm.generate(PROMPTS[6], greedy(max_tokens, ignore_eos=True), use_tqdm=False)[0].outputs[0]
        assert len(out.token_ids) == max_tokens


def test_shapes_padding_and_clipping(engine):
    check_shapes_padding_and_clipping(engine)


def test_all_zero_limits_give_an_empty_batch(engine):
    check_all_zero_limits_give_an_empty_batch(engine)


def test_state_is_released_after_requests_finish_or_abort(engine):
    check_state_is_released_after_requests_finish_or_abort(engine)


def test_drafts_respect_max_tokens_and_max_model_len(tiny_model_dir, spec_dirs):
    for config in spec_configs(spec_dirs).values():
        llm = LLM(model=str(tiny_model_dir), dtype="float32", speculative_config=config, max_model_len=128)
        check_drafts_respect_max_tokens_and_max_model_len(llm)

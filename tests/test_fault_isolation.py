"""A request that breaks a step fails alone: the engine bisects the step's requests, fails the
culprit(s) with finish_reason "error", and every other request gets exactly its clean-run tokens."""
from __future__ import annotations

import pytest
from conftest import PROMPTS, SERVER_SPEC

from draftwise import LLM, SamplingParams
from draftwise.engine.fault_isolation import find_failing

FAULTY_SEED = 666  # the request whose rows the injected fault is tied to


def _params() -> list[SamplingParams]:
    """Greedy and seeded sampled requests mixed; index 3 carries the faulty seed."""
    params = [SamplingParams(temperature=0.0 if i % 2 else 0.8, seed=i, max_tokens=12, ignore_eos=True)
              for i in range(len(PROMPTS))]
    params[3] = SamplingParams(temperature=0.8, seed=FAULTY_SEED, max_tokens=12, ignore_eos=True)
    return params


def _inject_fault(llm: LLM, after_tokens: int) -> list[int]:
    """Make every forward that holds the faulty request's rows raise once it has ``after_tokens`` outputs;
    returns a list that counts the forwards run (bisection included)."""
    runner = llm.llm_engine.runner
    real_execute, calls = runner.execute, []

    def execute(scheduled, needs=None):
        calls.append(len(scheduled))
        for item in scheduled:
            if item.seq.params.seed == FAULTY_SEED and item.seq.num_output_tokens >= after_tokens:
                raise RuntimeError("injected fault tied to one request")
        return real_execute(scheduled, needs)

    runner.execute = execute
    return calls


@pytest.mark.parametrize("engine_kwargs", [{}, {"async_scheduling": True}, {"speculative_config": SERVER_SPEC}],
                         ids=["plain", "async-scheduling", "ngram"])
@pytest.mark.parametrize("after_tokens", [0, 5], ids=["in-prefill", "mid-decode"])
def test_faulty_request_fails_alone_and_others_match_a_clean_run(tiny_model_dir, engine_kwargs, after_tokens):
    llm = LLM(model=str(tiny_model_dir), dtype="float32", seed=0, **engine_kwargs)
    clean = llm.generate(PROMPTS, _params(), use_tqdm=False)
    calls = _inject_fault(llm, after_tokens)
    outs = llm.generate(PROMPTS, _params(), use_tqdm=False)
    for i, (out, ref) in enumerate(zip(outs, clean)):
        if i == 3:
            assert out.finished and out.outputs[0].finish_reason == "error"
            assert "injected fault" in out.error
            assert len(out.outputs[0].token_ids) == after_tokens
        else:
            assert out.error is None
            assert out.outputs[0].token_ids == ref.outputs[0].token_ids, f"request {i} changed"
    engine = llm.llm_engine
    assert not engine.has_unfinished_requests() and engine.block_manager.usage == 0
    assert len(calls) > 0


def _check_alone(outs, clean, says: str) -> None:
    for i, (out, ref) in enumerate(zip(outs, clean)):
        if i == 3:
            assert out.finished and out.outputs[0].finish_reason == "error" and says in out.error
        else:
            assert out.error is None and out.outputs[0].token_ids == ref.outputs[0].token_ids, f"request {i} changed"


@pytest.mark.parametrize("engine_kwargs", [{}, {"async_scheduling": True}], ids=["plain", "async-scheduling"])
def test_a_faulty_output_build_fails_its_request_alone(tiny_model_dir, engine_kwargs):
    """Detokenizing one request raises: that request ends with "error", the others are untouched."""
    llm = LLM(model=str(tiny_model_dir), dtype="float32", seed=0, **engine_kwargs)
    clean = llm.generate(PROMPTS, _params(), use_tqdm=False)
    processor = llm.llm_engine.output_processor
    real_decode = processor.decode

    def decode(seq):
        if seq.params.seed == FAULTY_SEED:
            raise UnicodeError("injected detokenization fault")
        return real_decode(seq)

    processor.decode = decode
    _check_alone(llm.generate(PROMPTS, _params(), use_tqdm=False), clean, "injected detokenization fault")
    assert not llm.llm_engine.has_unfinished_requests() and llm.llm_engine.block_manager.usage == 0


def test_a_faulty_grammar_draft_fails_its_request_alone(tiny_model_dir, monkeypatch):
    """The grammar's drafting raises for one constrained request: it alone ends with "error"."""
    from draftwise import StructuredOutputsParams
    from draftwise.engine.structured_outputs import StructuredOutputs

    constraint = StructuredOutputsParams(regex=r"[a-z ]{8,40}")
    params = [SamplingParams(temperature=0.0, seed=i, max_tokens=12, structured_outputs=constraint)
              for i in range(len(PROMPTS))]
    params[3] = SamplingParams(temperature=0.0, seed=FAULTY_SEED, max_tokens=12, structured_outputs=constraint)
    llm = LLM(model=str(tiny_model_dir), dtype="float32", seed=0)
    clean = llm.generate(PROMPTS, params, use_tqdm=False)
    real = StructuredOutputs._draft_one

    def draft_one(self, seq, rec):
        if seq.params.seed == FAULTY_SEED and seq.num_output_tokens >= 3:
            raise RuntimeError("injected grammar drafting fault")
        return real(self, seq, rec)

    monkeypatch.setattr(StructuredOutputs, "_draft_one", draft_one)
    _check_alone(llm.generate(PROMPTS, params, use_tqdm=False), clean, "injected grammar drafting fault")
    engine = llm.llm_engine
    assert not engine.has_unfinished_requests() and engine.block_manager.usage == 0 and not engine.structured.states


@pytest.mark.parametrize("method", ["ngram", "eagle3"])
def test_a_faulty_proposer_fails_its_request_alone(tiny_model_dir, spec_dirs, method):
    """The proposer raises whenever the faulty request is among the sequences it drafts for: that
    request alone ends with "error" (found by bisection), the others keep their clean-run tokens."""
    from test_spec_equivalence import spec_configs

    config = SERVER_SPEC if method == "ngram" else spec_configs(spec_dirs)[method]
    llm = LLM(model=str(tiny_model_dir), dtype="float32", seed=0, speculative_config=config)
    clean = llm.generate(PROMPTS, _params(), use_tqdm=False)
    proposer = llm.llm_engine.speculator.proposer
    real_propose, batches = proposer.propose, []

    def propose(batch):
        batches.append(len(batch.seqs))
        if any(seq.params.seed == FAULTY_SEED and seq.num_output_tokens >= 3 for seq in batch.seqs):
            raise RuntimeError("injected drafting fault")
        return real_propose(batch)

    proposer.propose = propose
    _check_alone(llm.generate(PROMPTS, _params(), use_tqdm=False), clean, "injected drafting fault")
    engine = llm.llm_engine
    assert not engine.has_unfinished_requests() and engine.block_manager.usage == 0
    assert not proposer.tracked_seq_ids()
    assert max(batches) == len(PROMPTS) and 1 in batches  # the bisection narrowed it down to one


def test_bisection_names_each_failing_group_and_combinations():
    bad = {2, 5}

    def run(items):
        if bad & set(items) or {7, 8} <= set(items):  # 7 and 8 only fail together
            raise ValueError(f"bad items {sorted(items)}")

    groups = [[i] for i in range(10)]
    failing = find_failing(groups, run)
    # {7, 8, 9} raises while [7] and [8, 9] pass: the smallest subset known to raise fails as a whole
    assert set(failing) == {2, 5, 7, 8, 9}
    assert all(isinstance(e, ValueError) for e in failing.values())
    assert find_failing([[0], [1]], run) == {}

"""Chain drafters (eagle, eagle3, mtp, dflash) ingest a sequence's target rows only when it drafts:
the rows of the steps it sat out wait (``spec_decode/pending_rows.py``) and are ingested with the
step's new rows when it drafts again, so its drafts are those of a drafter that ingested every step;
no drafter forward runs in a step where no sequence drafts; a sequence that never drafts is ingested
once ``max_rows`` wait. Greedy outputs are the plain ones throughout."""
from __future__ import annotations

import pytest
from conftest import PROMPTS, greedy
from test_spec_equivalence import spec_configs

from draftwise import LLM
from draftwise.spec_decode.forward_timer import RowsTimer

CHAIN_METHODS = ["eagle", "eagle3", "mtp", "dflash"]


def _run(model_dir, config: dict, drafts_now, max_rows: int = 1000):
    """Generate PROMPTS[:3] with the draft-length policy replaced by ``drafts_now(step, seq) -> bool``.
    Returns (texts, {(request id, num tokens): drafts}, drafter forwards over waiting/new rows,
    steps in which some sequence was allowed to draft, the most rows a sequence left waiting)."""
    llm = LLM(model=str(model_dir), dtype="float32", speculative_config=config)
    engine = llm.llm_engine
    proposer = engine.speculator.proposer
    proposer.pending.max_rows = max_rows
    state = {"step": 0, "drafting_steps": 0, "ingests": 0, "lag": 0}
    proposed = {}

    def limits(seqs, max_num_drafts, num_base_rows, drafting_seconds=None, catch_up=None):
        chosen = [limit if drafts_now(state["step"], seq) else 0 for seq, limit in zip(seqs, max_num_drafts)]
        state["step"] += 1
        state["drafting_steps"] += any(chosen)
        return chosen

    def propose(batch, inner=proposer.propose):
        drafts = inner(batch)
        waiting = [s.num_tokens - 1 - s.spec.drafter_num_computed_tokens for s in batch.seqs]  # rows not ingested
        state["lag"] = max([state["lag"]] + waiting)
        for i, seq in enumerate(batch.seqs):
            if drafts.num_draft_tokens[i]:
                proposed[(seq.request_id, seq.num_tokens)] = drafts.token_ids[i, :drafts.num_draft_tokens[i]].tolist()
        return drafts

    def counted(inner):
        def run(*args, **kwargs):
            state["ingests"] += 1
            return inner(*args, **kwargs)
        return run

    engine.speculator.policy.limits = limits
    proposer.propose = propose
    if hasattr(proposer.model, "write_context"):  # dflash: its ingestion writes the context K/V
        proposer.model.write_context = counted(proposer.model.write_context)
    else:
        proposer.model.ingest = counted(proposer.model.ingest)
    outs = llm.generate(PROMPTS[:3], [greedy(n, ignore_eos=True) for n in (30, 22, 26)], use_tqdm=False)
    assert proposer.tracked_seq_ids() == set()  # nothing waits for a finished sequence
    return [o.outputs[0].text for o in outs], proposed, state


@pytest.mark.parametrize("method", CHAIN_METHODS)
def test_sequences_that_sat_out_draft_what_an_every_step_drafter_drafts(method, tiny_model_dir, spec_dirs):
    config = spec_configs(spec_dirs)[method]
    texts, every_step, _ = _run(tiny_model_dir, config, lambda step, seq: True)
    # Sequences sit out 0-3 steps at a time, at different steps; some steps nobody drafts.
    sometimes = lambda step, seq: step % 5 != 2 and (step + seq.seq_id) % 4 == 0  # noqa: E731
    lazy_texts, lazy, state = _run(tiny_model_dir, config, sometimes)
    assert lazy_texts == texts
    common = set(lazy) & set(every_step)
    assert len(common) >= 10, f"{method}: too few comparable drafts ({len(common)})"
    assert {k: lazy[k] for k in common} == {k: every_step[k] for k in common}
    # A drafter forward only in steps where someone drafts (prompts wait too: max_rows is large).
    assert 0 < state["ingests"] <= state["drafting_steps"]
    assert state["lag"] >= 3  # rows did wait


@pytest.mark.parametrize("method", ["eagle3", "dflash"])
def test_a_sequence_that_never_drafts_is_ingested_every_max_rows(method, tiny_model_dir, spec_dirs):
    texts, proposed, state = _run(tiny_model_dir, spec_configs(spec_dirs)[method], lambda s, q: False, max_rows=8)
    plain = LLM(model=str(tiny_model_dir), dtype="float32").generate(
        PROMPTS[:3], [greedy(n, ignore_eos=True) for n in (30, 22, 26)], use_tqdm=False)
    assert texts == [o.outputs[0].text for o in plain] and not proposed
    assert state["lag"] < 8 and state["ingests"] > 0  # rows wait while fewer than max_rows would


def test_chain_drafters_price_their_ingestion(tiny_model_dir, spec_dirs):
    """Drafting at all costs an ingestion forward (it runs only when someone drafts): the first draft
    is priced too, not only the chain steps after it."""
    for method in ("eagle", "dflash"):
        llm = LLM(model=str(tiny_model_dir), dtype="float32", speculative_config=spec_configs(spec_dirs)[method])
        proposer = llm.llm_engine.speculator.proposer
        llm.generate(PROMPTS[:2], greedy(12, ignore_eos=True), use_tqdm=False)
        assert proposer.drafting_seconds(1) > 0.0 and proposer.drafting_seconds(0) == 0.0, method


def test_rows_timer_fits_forwards_of_every_size():
    timer = RowsTimer()
    assert timer.seconds(8) == 0.0
    timer.observe(300, 0.015)
    timer.observe(300, 0.016)
    assert timer.seconds(8) == 0.0  # one size seen: a long forward does not price a short one
    for _ in range(50):
        timer.observe(8, 0.003)
        timer.observe(64, 0.006)
    assert timer.seconds(8) == pytest.approx(0.003, rel=0.05)
    assert timer.seconds(64) == pytest.approx(0.006, rel=0.05)
    assert timer.seconds(300) > timer.seconds(64)

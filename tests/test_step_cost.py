"""The step-cost model: step time by rows and by the keys decode rows read, learned from noisy
measured steps, following drift, never decreasing in rows; and its start-up seeds, which leave
the KV cache as they found it."""
from __future__ import annotations

import random

import pytest

from draftwise import LLM
from draftwise.engine.scheduler import ScheduledSeq, Scheduler, SchedulerOutput
from draftwise.engine.drafting.step_cost import StepCostModel, decode_keys, knots
from draftwise.engine.drafting.step_timing import measure_further_key_seconds, measure_key_seconds, measure_step_seconds
from draftwise.sampling_params import SamplingParams
from draftwise.sequence import Sequence


def _truth(rows: int) -> float:
    """A CPU-like step: 12 ms for one row, a jump at the second, then 0.5 ms per row."""
    return 0.012 + (0.004 if rows > 1 else 0.0) + 0.0005 * (rows - 1)


def _learn(model: StepCostModel, truth, n: int, seed: int = 0) -> None:
    rng = random.Random(seed)
    for _ in range(n):
        rows = rng.choice([1, 1, 2, 3, 5, 6, rng.randint(1, 300)])
        model.observe(rows, truth(rows) * rng.uniform(0.85, 1.15))


def test_knots_are_dense_where_rows_are_few():
    assert knots(20) == [1, 2, 3, 4, 6, 8, 12, 16, 20]
    assert knots(1) == [1] and knots(2048)[-3:] == [1024, 1536, 2048]


def test_learns_a_cost_curve_from_noisy_steps():
    model = StepCostModel(512)
    assert model.seconds(8) is None and not model.ready
    _learn(model, _truth, 3000)
    for rows in (1, 2, 5, 16, 64, 200, 256):
        assert model.seconds(rows) == pytest.approx(_truth(rows), rel=0.1), rows


def test_follows_a_machine_that_gets_slower():
    model = StepCostModel(512)
    _learn(model, _truth, 2000)
    _learn(model, lambda r: 2 * _truth(r), 1500, seed=1)
    for rows in (1, 5, 64):
        assert model.seconds(rows) == pytest.approx(2 * _truth(rows), rel=0.15), rows


def test_seed_gives_the_shape_and_real_steps_the_level():
    model = StepCostModel(256)
    model.seed({1: 0.030, 6: 0.036, 64: 0.120})  # measured while another process was starting
    for _ in range(200):
        model.observe(1, 0.020)  # real steps only ever run one row (no drafts yet)
    assert model.seconds(1) == pytest.approx(0.020, rel=0.05)
    assert model.seconds(6) / model.seconds(1) == pytest.approx(1.2, rel=0.05)  # the seed's shape
    assert model.seconds(64) == pytest.approx(0.080, rel=0.05)


def test_never_decreasing_in_rows():
    model = StepCostModel(64)
    model.seed({1: 0.010, 8: 0.020, 16: 0.015, 32: 0.030})  # a noisy dip at 16 rows
    times = [model.seconds(r) for r in range(1, 65)]
    assert times == sorted(times)


def test_a_knot_few_steps_visited_yields_to_a_well_measured_one():
    """Five slow 4-row steps must not lift the 8-row knot that 300 steps measured (which priced
    every row from 4 to 16 as free): knots out of order are pooled by their evidence, and the
    drift moves by a clipped geometric mean."""
    model = StepCostModel(64)
    model.seed({1: 0.021, 4: 0.022, 8: 0.025, 16: 0.030, 64: 0.050})
    for _ in range(300):
        model.observe(8, 0.050)
        model.observe(1, 0.040)
    drift = model.drift
    for _ in range(5):
        model.observe(4, 0.150)
    assert model.drift < 1.25 * drift  # a few stalled steps barely move the level of unvisited knots
    assert model.seconds(8) == pytest.approx(0.050, rel=0.1)  # (pooled with the 5 slow steps)
    assert model.seconds(4) <= model.seconds(8) < model.seconds(16) < model.seconds(32)


def test_knots_past_the_measured_ones_keep_the_seeds_slope():
    """Few-sequence steps run as the seed says (drift ~1) while 32 sequences of long contexts push
    64 rows far above it, and no step ever runs 96. Rows past 64 still cost what the seed says each
    row adds (they were priced as free once the knots above were clamped flat to the pushed-up level)."""
    model = StepCostModel(256)
    model.seed({1: 0.020, 16: 0.040, 64: 0.100, 256: 0.300})  # ~1 ms per row past 64 rows
    for _ in range(100):
        model.observe(8, 0.020 + 7 / 15 * 0.020)
        model.observe(64, 0.160)
    seed_slope = (0.300 - 0.100) / 192 * model.drift
    assert model.seconds(96) - model.seconds(64) >= 0.9 * 32 * seed_slope
    assert model.seconds(128) > model.seconds(96) > model.seconds(64)
    assert model.seconds(64) == pytest.approx(0.160, rel=0.05)  # a measured knot keeps its level


def test_rows_within_a_time():
    model = StepCostModel.fixed(0.5, 64)  # a step of r rows: 1 + 0.5 (r - 1)
    assert model.ready and not model.free
    assert model.max_rows_within(2.0, 64) == 3 and model.max_rows_within(100.0, 64) == 64
    assert model.max_rows_within(0.5, 64) == 1  # never below one row
    model.observe(1, 50.0)  # a fixed model ignores measurements
    assert model.seconds(1) == 1.0 and StepCostModel.fixed(0.0, 64).free


def test_start_up_seed_is_sane_and_frees_its_blocks(tiny_llm):
    engine = tiny_llm.llm_engine
    seconds = measure_step_seconds(engine.runner.paged, engine.block_manager, [1, 2, 5], context_len=32)
    assert sorted(seconds) == [1, 2, 5] and all(0.0 < s < 5.0 for s in seconds.values())
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


def test_engine_learns_from_its_steps(tiny_model_dir, monkeypatch):
    monkeypatch.delenv("DRAFTWISE_VERIFY_ROW_COST")
    prompts = ["hello there", "a longer prompt with some more words in it"]
    llm = LLM(model=str(tiny_model_dir), dtype="float32", max_num_batched_tokens=64, decode_stall_factor=2)
    model = llm.llm_engine.step_cost
    assert model.ready and not model.frozen  # seeded at start-up
    before = list(model.counts)
    llm.generate(prompts, use_tqdm=False)
    assert model.counts[1] > before[1] + 5  # the two-row decode steps were folded in
    llm = LLM(model=str(tiny_model_dir), dtype="float32", max_num_batched_tokens=64, decode_stall_factor=2,
              speculative_config={"method": "ngram", "num_speculative_tokens": 2})
    llm.generate(prompts, use_tqdm=False)
    model, decode = llm.llm_engine.step_cost, llm.llm_engine.decode_cost  # decode: prices drafts, learns
    assert 5 < sum(decode.counts) < sum(model.counts) and decode.counts[-1] == 0  # no prefill steps


def test_nothing_is_timed_without_a_reader(tiny_model_dir, monkeypatch):
    monkeypatch.delenv("DRAFTWISE_VERIFY_ROW_COST")
    engine = LLM(model=str(tiny_model_dir), dtype="float32").llm_engine  # no drafts to price, no prefill bound
    assert not engine.step_cost.ready and not engine.decode_cost.ready


def test_row_cost_env_fixes_the_model(tiny_model_dir, monkeypatch):
    monkeypatch.setenv("DRAFTWISE_VERIFY_ROW_COST", "0.25")
    model = LLM(model=str(tiny_model_dir), dtype="float32").llm_engine.step_cost
    assert model.frozen and [model.seconds(r) for r in (1, 2, 5)] == [1.0, 1.25, 2.0]
    monkeypatch.setenv("DRAFTWISE_VERIFY_ROW_COST", "cheap")
    with pytest.raises(ValueError, match="DRAFTWISE_VERIFY_ROW_COST='cheap'.*number >= 0"):
        LLM(model=str(tiny_model_dir), dtype="float32")


def test_prefill_bound_holds_for_the_tail_of_mixed_steps():
    """Steps mixing prefill with decodes that run 20-40% over the model's prediction raise the
    scheduler's margin to about their 95th percentile, and the prefill a step may take shrinks;
    a fixed model (units of a one-row step, not seconds) keeps the margin at 1."""
    model = StepCostModel(512)
    model.seed({1: 0.010, 64: 0.050, 512: 0.300})
    scheduler = Scheduler(None, 8, 512, model, decode_stall_factor=3)
    before = scheduler._prefill_budget(8, 512)
    rng = random.Random(0)
    for _ in range(400):
        rows = rng.randrange(40, 120)
        scheduler.observe_mixed_step(rows, model.seconds(rows) * rng.uniform(1.2, 1.4))
    assert 1.3 < scheduler.prefill_margin < 1.45
    assert scheduler._prefill_budget(8, 512) < before
    fixed = Scheduler(None, 8, 512, StepCostModel.fixed(0.02, 512), decode_stall_factor=3)
    fixed.observe_mixed_step(64, 5.0)
    assert fixed.prefill_margin == 1.0


KEY_SECONDS = 2e-6  # a 2-core CPU with SmolLM2: ~2 ms per 1000 keys a decode row reads


def _decode_step(rows: int, keys: int) -> float:
    """Rows nearly free (a bf16 CPU at a short context), each key read 2 us."""
    return 0.021 + 0.0005 * (rows - 1) + KEY_SECONDS * keys


def test_keys_read_are_priced_and_the_rows_learned_without_them():
    """Decode steps of 8 sequences at contexts from 100 to 3000 tokens: the model predicts each step
    from its keys, and a draft row of a long sequence costs its keys, not a short context's row."""
    model = StepCostModel(256)
    model.seed({1: 0.021, 8: 0.0245, 64: 0.052}, key_seconds=KEY_SECONDS)
    rng = random.Random(0)
    for _ in range(600):
        rows = rng.choice([8, 8, 9, 10, 12])
        keys = rows * rng.randint(100, 3000)
        model.observe(rows, _decode_step(rows, keys) * rng.uniform(0.9, 1.1), keys)
    for rows, context in ((8, 128), (8, 3000), (12, 1500)):
        assert model.seconds(rows, rows * context) == pytest.approx(_decode_step(rows, rows * context), rel=0.1)
    draft = model.seconds(9, 9 * 3000) - model.seconds(8, 8 * 3000)
    assert draft == pytest.approx(0.0005 + 3000 * KEY_SECONDS, rel=0.15)  # ~6.5 ms, not ~0.5 ms
    assert model.key_cost == pytest.approx(KEY_SECONDS, rel=0.1)


def test_key_cost_follows_a_machine_that_gets_slower():
    model = StepCostModel(64)
    model.seed({1: 0.021, 8: 0.0245}, key_seconds=KEY_SECONDS)
    for _ in range(300):
        model.observe(8, 1.5 * _decode_step(8, 8 * 2000), 8 * 2000)
    assert model.key_cost == pytest.approx(1.5 * KEY_SECONDS, rel=0.05)
    assert model.seconds(8, 8 * 500) == pytest.approx(1.5 * _decode_step(8, 8 * 500), rel=0.1)


def test_without_a_key_seed_keys_change_nothing():
    model = StepCostModel(64)
    model.seed({1: 0.010, 8: 0.012})
    model.observe(8, 0.050, 8 * 3000)
    assert model.key_cost == 0.0 and model.seconds(8, 0) == model.seconds(8, 10 ** 6)
    assert StepCostModel.fixed(0.5, 64).seconds(2, 10 ** 6) == 1.5


def test_key_cost_is_measured_and_frees_its_blocks(tiny_llm):
    engine = tiny_llm.llm_engine
    paged, blocks = engine.runner.paged, engine.block_manager
    seconds = measure_key_seconds(paged, blocks, num_seqs=2, contexts=(16, 128))
    assert 0.0 <= seconds < 1e-3 and blocks.num_free_blocks == blocks.num_blocks
    assert measure_key_seconds(paged, blocks, contexts=(16, 24)) == 0.0  # too close to tell apart
    too_many = blocks.num_blocks * blocks.block_size
    assert measure_key_seconds(paged, blocks, num_seqs=2, contexts=(16, too_many)) == 0.0
    assert blocks.num_free_blocks == blocks.num_blocks


def test_further_key_cost_is_measured_and_priced(tiny_llm):
    """A sequence's further rows get their own key cost, measured on one throw-away sequence whose
    blocks are freed after; seeded, it scales what a draft row's keys cost, never above a first row's."""
    engine = tiny_llm.llm_engine
    paged, blocks = engine.runner.paged, engine.block_manager
    seconds = measure_further_key_seconds(paged, blocks, num_rows=3, contexts=(16, 128))
    assert seconds is not None and 0.0 <= seconds < 1e-3 and blocks.num_free_blocks == blocks.num_blocks
    assert measure_further_key_seconds(paged, blocks, contexts=(16, 24)) is None  # too close to tell apart
    model = StepCostModel(64)
    model.seed({1: 0.010, 8: 0.012}, key_seconds=KEY_SECONDS, further_key_seconds=KEY_SECONDS / 4)
    assert model.further_key_share == 0.25
    model.seed({1: 0.010, 8: 0.012}, key_seconds=KEY_SECONDS, further_key_seconds=KEY_SECONDS * 3)
    assert model.further_key_share == 1.0


def test_stats_say_what_drafts_were_priced_with():
    """The model reports its step time by rows, its key costs, and its mean prediction against the
    observed time of the steps it learnt from (each predicted before it learnt from that step)."""
    model = StepCostModel(64)
    assert model.as_stats()["spec_decode_step_cost"]["num_steps"] == 0
    model.seed({1: 0.010, 8: 0.012}, key_seconds=KEY_SECONDS, further_key_seconds=KEY_SECONDS / 2)
    predicted = model.seconds(4, 500)
    model.observe(4, 0.020, 500)
    stats = model.as_stats()["spec_decode_step_cost"]
    assert stats["num_steps"] == 1 and stats["mean_observed_ms"] == 20.0
    assert stats["mean_predicted_ms"] == round(predicted * 1e3, 3) and stats["draft_key_share"] == 0.5
    assert set(stats["step_ms_by_rows"]) == {1, 2, 4, 8, 16} and stats["ms_per_1000_keys"] > 0


def test_keys_count_decode_rows_only():
    """A decode with 2 drafts at context 40 and a plain decode at 10 read 3 * 43 + 11 keys; a
    prefill chunk beside them reads none (its rows are priced by rows alone)."""
    def seq(name: str, num_tokens: int, num_computed: int) -> Sequence:
        s = Sequence(name, 0, list(range(num_tokens)), SamplingParams(), 0, 0.0)
        s.num_computed_tokens = num_computed
        return s
    plan = SchedulerOutput([ScheduledSeq(seq("a", 41, 40), 1, [7, 8]), ScheduledSeq(seq("b", 11, 10), 1),
                            ScheduledSeq(seq("c", 500, 100), 64)])
    assert plan.decode_keys() == 3 * 43 + 11 == decode_keys([43, 11], [3, 1])
    assert plan.decode_keys(0.5) == 2 * 43 + 11 == decode_keys([43, 11], [3, 1], 0.5)


def test_prefill_bound_counts_the_decodes_keys():
    """Decodes at long contexts make a longer step, so the same stall factor admits more prefill
    rows beside them, and a step predicted with their keys is not mistaken for a slow one."""
    model = StepCostModel(512)
    model.seed({1: 0.010, 64: 0.050, 512: 0.300}, key_seconds=KEY_SECONDS)
    scheduler = Scheduler(None, 8, 512, model, decode_stall_factor=3)
    short, long = scheduler._prefill_budget(8, 512, 8 * 100), scheduler._prefill_budget(8, 512, 8 * 3000)
    assert long > short
    for _ in range(200):
        scheduler.observe_mixed_step(72, model.seconds(72, 8 * 3000), 8 * 3000)
    assert scheduler.prefill_margin < 1.1


def test_a_long_forward_is_timed_once():
    """Short settings: a warm-up, then the best of ``repeats`` turns; a setting whose warm-up is long
    keeps that timing (each repeat of a 256-row 8B forward would cost seconds of start-up)."""
    from draftwise.engine.drafting.step_timing import LONG_FORWARD_SECONDS, _best_of_turns

    calls = []
    times = {1: [0.003, 0.002, 0.004, 0.001], 256: [LONG_FORWARD_SECONDS * 3]}

    def time_one(rows: int) -> float:
        calls.append(rows)
        return times[rows][calls.count(rows) - 1]

    assert _best_of_turns(time_one, [1, 256], repeats=3) == {1: 0.001, 256: LONG_FORWARD_SECONDS * 3}
    assert calls.count(1) == 4 and calls.count(256) == 1

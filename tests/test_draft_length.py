"""The draft length policy: drafts are priced for the whole batch by the step-cost model, cut
where they cannot pay for their rows, and that changes speed only, never outputs."""
from __future__ import annotations

import itertools
import random

import numpy as np
from conftest import PROMPTS, greedy

from draftwise import LLM
from draftwise.engine.drafting.length import CATCH_UP_SHARE, PROBE_EVERY, PROBE_SHARE, REPRICE_EVERY, DraftLengthPolicy
from draftwise.engine.drafting.step_cost import StepCostModel
from draftwise.spec_decode.proposers.draft_model import DraftModelProposer
from draftwise.sampling_params import SamplingParams
from draftwise.sequence import Sequence

NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 2}


def _linear(c: float, max_rows: int = 256) -> DraftLengthPolicy:
    return DraftLengthPolicy(StepCostModel.fixed(c, max_rows))


def _measured(samples: dict[int, float], max_rows: int = 512) -> DraftLengthPolicy:
    model = StepCostModel(max_rows)
    model.seed(samples)
    return DraftLengthPolicy(model)


def _one(policy: DraftLengthPolicy, alpha: float, limit: int, num_rows: int = 1) -> int:
    return policy.allocate([[alpha ** (j + 1) for j in range(limit)]], num_rows)[0]


def test_one_sequence_follows_the_classic_rule():
    assert _one(_linear(0.0), 0.9, 7) == 7 and not _linear(0.0).prices_rows  # free rows: every draft
    assert _one(_linear(0.1), 0.05, 7) == 0  # drafts almost never accepted cost a step share
    assert _one(_linear(0.01), 0.99, 10) == 10 and _one(_linear(0.01), 0.99, 4) == 4
    lengths = [_one(_linear(0.08), a / 10, 10) for a in range(10)]
    assert lengths == sorted(lengths) and lengths[0] == 0 and lengths[-1] > 3
    # (1 + a) / (1 + c) > 1 exactly when a > c: the first draft pays iff its acceptance beats its cost
    assert _one(_linear(0.2), 0.21, 1) == 1 and _one(_linear(0.2), 0.19, 1) == 0
    # a costly first row and cheap further ones (fp32 on AVX2): one draft does not pay, five do
    jump = _measured({1: 1.0, 2: 1.45, 11: 1.72})
    assert _one(jump, 0.38, 1) == 0 and _one(jump, 0.38, 10) >= 3


def test_a_drafter_forward_per_draft_is_priced():
    """EAGLE's chain: the first draft comes with the ingested row, each further one costs a drafter
    forward. Rows nearly free, forwards at 15% of a step: with 40% acceptance only the free first
    draft pays; with 95%, deep chains do; a fixed model (unit: a one-row step) ignores seconds."""
    policy = _measured({1: 0.020, 8: 0.021})
    chain = lambda depth: max(0, depth - 1) * 0.003  # noqa: E731
    assert policy.allocate([[0.4 ** (j + 1) for j in range(5)]], 1)[0] >= 4  # unpriced: nearly every draft
    assert policy.allocate([[0.4 ** (j + 1) for j in range(5)]], 1, chain) == [1]
    assert policy.allocate([[0.95 ** (j + 1) for j in range(5)]], 1, chain) == [5]
    assert policy.allocate([[0.4] * 2] * 8, 8, chain) == [2] * 8  # one forward serves 8 sequences: it pays
    assert _linear(0.001).allocate([[0.4 ** (j + 1) for j in range(5)]], 1, chain)[0] > 1


def test_model_drafters_measure_their_forwards(tiny_model_dir, spec_dirs):
    from test_spec_equivalence import spec_configs

    for method in ("eagle", "draft_model", "dflash"):
        llm = LLM(model=str(tiny_model_dir), dtype="float32", speculative_config=spec_configs(spec_dirs)[method])
        proposer = llm.llm_engine.speculator.proposer
        # nothing timed yet, drafts are tried first; a draft model is timed at start-up (warm_up)
        assert (proposer.drafting_seconds(3) > 0.0) == (method == "draft_model")
        llm.generate(PROMPTS[:2], greedy(12, ignore_eos=True), use_tqdm=False)
        assert proposer.drafting_seconds(3) > 0.0 and proposer.drafting_seconds(0) == 0.0, method


def test_a_draft_model_is_warmed_up_and_prices_its_catch_up(tiny_model_dir, spec_dirs):
    """The draft model runs at start-up (its first forward is slow: that is not a request's cost, so
    it is not timed; then a first forward at two sizes and a draft's are, and no block is kept), so
    from the first request a sequence whose drafter lags prices its catch-up, one that does not none."""
    from test_spec_equivalence import spec_configs

    calls = []
    original = DraftModelProposer.warm_up
    DraftModelProposer.warm_up = lambda self, blocks: calls.append(blocks.num_free_blocks) or original(self, blocks)
    try:
        llm = LLM(model=str(tiny_model_dir), dtype="float32", speculative_config=spec_configs(spec_dirs)["draft_model"])
    finally:
        DraftModelProposer.warm_up = original
    engine = llm.llm_engine
    proposer = engine.speculator.proposer
    assert calls == [engine.block_manager.num_blocks] and engine.block_manager.num_free_blocks == calls[0]
    assert proposer.drafting_seconds(3) > 0.0 and proposer.catch_up_seconds([]) == []  # timed at start-up
    lagging = Sequence("lag", 0, list(range(200)), SamplingParams(), 0, 0.0)
    current = Sequence("cur", 1, list(range(200)), SamplingParams(), 0, 0.0)
    current.spec.drafter_num_computed_tokens = 199
    lag, cur = proposer.catch_up_seconds([lagging, current])
    assert lag > 0.0 and cur == 0.0


def test_allocation_is_the_best_set_of_prefixes():
    """Brute force over every combination of per-sequence draft lengths, on random cost curves."""
    rng = random.Random(0)
    for _ in range(60):
        costs, total = {}, 1.0
        for rows in (1, 2, 3, 4, 6, 8, 12):
            total += rng.uniform(0.0, 0.5)
            costs[rows] = total
        policy = _measured(costs, 12)
        gains = [sorted((rng.random() for _ in range(rng.randint(0, 3))), reverse=True) for _ in range(3)]
        base = rng.randint(1, 3)

        def rate(ks):
            tokens = len(gains) + sum(sum(g[:k]) for g, k in zip(gains, ks))
            return tokens / policy.step_cost.seconds(base + sum(ks))

        best = max(rate(ks) for ks in itertools.product(*(range(len(g) + 1) for g in gains)))
        assert np.isclose(rate(policy.allocate(gains, base)), best)


def test_allocation_with_keys_is_the_best_set_of_prefixes():
    """Brute force again, rows at a constant cost and each draft reading its sequence's context (at
    its own share of a first row's key cost): ranking drafts by gain per second of their own finds
    the best set."""
    rng = random.Random(1)
    for _ in range(60):
        model = StepCostModel(64)
        key_seconds = rng.uniform(1e-6, 3e-6)
        model.seed({1: 0.02, 64: 0.02 + 63 * rng.uniform(0.0, 0.002)}, key_seconds=key_seconds,
                   further_key_seconds=key_seconds * rng.choice([0.2, 0.5, 1.0]))
        policy = DraftLengthPolicy(model)
        gains = [sorted((rng.random() for _ in range(rng.randint(0, 3))), reverse=True) for _ in range(3)]
        lens = [rng.randint(50, 4000) for _ in gains]

        def rate(ks):
            tokens = len(gains) + sum(sum(g[:k]) for g, k in zip(gains, ks))
            keys = sum(lens) + model.further_key_share * sum(k * n + k * (k + 1) // 2 for k, n in zip(ks, lens))
            return tokens / model.seconds(len(gains) + sum(ks), keys)

        best = max(rate(ks) for ks in itertools.product(*(range(len(g) + 1) for g in gains)))
        assert np.isclose(rate(policy.allocate(gains, len(gains), context_lens=lens)), best)


def test_few_and_many_drafts_are_priced_alike(monkeypatch):
    """A batch's drafts are priced one by one when few and in one numpy pass when many: the same choice."""
    from draftwise.engine.drafting import length

    rng = random.Random(2)
    for _ in range(40):
        model = StepCostModel(256)
        model.seed({1: 0.02, 8: 0.021 + rng.uniform(0, 0.01), 64: 0.02 + 63 * rng.uniform(0.0, 0.002)},
                   key_seconds=2e-6, further_key_seconds=1e-6)
        policy = DraftLengthPolicy(model)
        gains = [sorted((rng.random() for _ in range(rng.randint(0, 6))), reverse=True) for _ in range(6)]
        lens = [rng.randint(50, 4000) for _ in gains]
        chain = lambda depth: 0.001 * depth  # noqa: E731
        few = policy.allocate(gains, len(gains), chain, lens)
        monkeypatch.setattr(length, "FEW_DRAFTS", 0)
        assert policy.allocate(gains, len(gains), chain, lens) == few
        monkeypatch.setattr(length, "FEW_DRAFTS", 16)


def test_a_draft_of_a_long_sequence_pays_for_its_keys():
    """Rows nearly free (bf16 on a 2-core CPU), each key read 2.3 us (measured on SmolLM2): 8
    sequences at a 128-token context draft at 50% acceptance, at a 3000-token one they do not,
    and in a mixed batch only the short ones do."""
    model = StepCostModel(64)
    model.seed({1: 0.0214, 2: 0.0215, 8: 0.0252, 32: 0.0464}, key_seconds=2.3e-6)
    policy = DraftLengthPolicy(model)
    gains = [[0.5 ** (j + 1) for j in range(3)]] * 8
    assert all(policy.allocate(gains, 8, context_lens=[128] * 8))
    assert policy.allocate(gains, 8) == policy.allocate(gains, 8, context_lens=[128] * 8)
    assert not any(policy.allocate(gains, 8, context_lens=[3000] * 8))
    assert all(policy.allocate(gains, 8))  # the rows alone would have drafted them all
    mixed = policy.allocate(gains, 8, context_lens=[128, 3000] * 4)
    assert all(mixed[0::2]) and not any(mixed[1::2])
    # where a draft row reads the keys its first row brought into the caches at a tenth of the cost
    model.seed({1: 0.0214, 2: 0.0215, 8: 0.0252, 32: 0.0464}, key_seconds=2.3e-6, further_key_seconds=2.3e-7)
    assert all(policy.allocate(gains, 8, context_lens=[3000] * 8))


def test_a_large_batch_steps_aside_when_rows_are_not_free():
    # a CPU in bf16: rows nearly free up to a few, then every row costs ~0.9 ms of a 12 ms step
    policy = _measured({1: 0.012, 2: 0.0125, 4: 0.013, 8: 0.015, 32: 0.035, 64: 0.064, 128: 0.12})
    gains = [[0.6 ** (j + 1) for j in range(5)]]
    assert policy.allocate(gains, 1)[0] >= 3  # one request: speculation pays
    assert sum(policy.allocate(gains * 32, 32)) == 0  # 32 decoding: no draft pays for its row
    sure = [[0.97 ** (j + 1) for j in range(5)]]
    chosen = policy.allocate(sure + gains * 31, 32)
    assert chosen[0] >= 3 and sum(chosen[1:]) == 0  # only the near-certain drafts do


def test_policy_learns_from_verified_drafts_and_probes_again():
    policy = _linear(0.15)
    seq = Sequence("r", 0, [1, 2, 3], SamplingParams(), 0, 0.0)
    start = policy.limits([seq], [8], 1)[0]
    assert 0 < start < 8  # the prior (0.5) is worth a short draft
    for _ in range(10):
        policy.observe(seq, 4, 0)
    assert policy.limits([seq], [8], 1) == [0]
    # Its failures are the method's too, so fading its evidence does not help: a probe comes after
    # PROBE_EVERY withheld steps, one draft.
    probes = [policy.limits([seq], [8], 1)[0] for _ in range(2 * PROBE_EVERY)]
    assert probes[0] == 0 and probes.count(1) == 2 and max(probes) == 1
    for _ in range(20):
        policy.observe(seq, 8, 8)
    assert policy.limits([seq], [8], 1) == [8]


def test_new_sequences_start_at_what_the_method_achieves():
    """The prior follows every verified draft: after other sequences' drafts failed, a new sequence
    in a batch where a row costs a third of a token gets none; after they succeeded, it drafts."""
    policy = _linear(0.35)
    fresh = lambda i: Sequence(f"n{i}", 100 + i, [1, 2, 3], SamplingParams(), 0, 0.0)  # noqa: E731
    assert policy.limits([fresh(0)], [4], 1)[0] > 0  # PRIOR (0.5) pays for a row costing 0.35
    for i in range(30):
        policy.observe(fresh(1), 2, 0)  # other sequences: every first draft rejected
    assert policy.prior < 0.1 and policy.limits([fresh(2)], [4], 1) == [0]
    probes = [policy.limits([fresh(2)], [4], 1)[0] for _ in range(PROBE_EVERY)]  # then one probe
    assert probes[0] == 0 and sorted(probes)[-2:] == [0, 1]  # one probe, of one draft
    for i in range(300):
        policy.observe(fresh(3), 4, 4)
    assert policy.prior > 0.9 and policy.limits([fresh(4)], [4], 1) == [4]


def test_a_failing_sequence_is_probed_sooner_where_the_method_succeeds():
    """A sequence whose drafts failed fades back to the method's own acceptance (at most PRIOR): where
    other sequences' drafts succeed it is probed again sooner than where every draft fails."""
    def first_probe(others_accept: bool) -> int:
        policy = _linear(0.15)
        seq = Sequence("r", 0, [1, 2, 3], SamplingParams(), 0, 0.0)
        for i in range(10):
            policy.observe(seq, 4, 0)
            policy.observe(Sequence(f"o{i}", 1 + i, [1], SamplingParams(), 0, 0.0), 4, 4 if others_accept else 0)
        return next(step for step in range(1000) if policy.limits([seq], [8], 1)[0] > 0)

    assert first_probe(others_accept=True) < first_probe(others_accept=False)


def test_a_withheld_batch_is_probed_one_sequence_at_a_time():
    """Where no draft pays, every PROBE_EVERY steps one sequence gets one draft (the one whose drafter
    lags least, then the least known) and the others stay withheld; the method's prior does not
    drift back up meanwhile (no re-probe bursts)."""
    policy = _linear(0.35)
    for i in range(30):
        policy.observe(Sequence(f"o{i}", 50 + i, [1], SamplingParams(), 0, 0.0), 2, 0)
    prior = policy.prior
    seqs = [Sequence(f"s{i}", i, [1, 2, 3], SamplingParams(), 0, 0.0) for i in range(8)]
    for i, seq in enumerate(seqs):
        seq.spec.draft_tried = 0.1 if i == 5 else 1.0 + i
    seqs[2].spec.drafter_num_computed_tokens = 2  # its drafter lags one position, the others three
    steps = [policy.limits(seqs, [4] * 8, 8) for _ in range(3 * PROBE_EVERY)]
    probes = {n: chosen for n, chosen in enumerate(steps) if any(chosen)}
    assert list(probes) == [PROBE_EVERY - 1, 2 * PROBE_EVERY - 1, 3 * PROBE_EVERY - 1]
    assert all(chosen == [0, 0, 1] + [0] * 5 for chosen in probes.values())
    seqs[2].spec.drafter_num_computed_tokens = 0
    steps = [policy.limits(seqs, [4] * 8, 8) for _ in range(PROBE_EVERY)]
    assert steps[-1] == [0] * 5 + [1, 0, 0] and not any(map(any, steps[:-1]))  # the least known
    assert policy.prior == prior


def test_a_drafter_catch_up_is_weighed_against_the_steps_left():
    """A draft model's catch-up (its prompt's K/V, or the positions of the steps it was withheld) is
    paid once: a sequence gets drafts only where it costs at most CATCH_UP_SHARE of the decode time
    its remaining tokens take, and a probe waits until it costs at most PROBE_SHARE of the time
    spent without drafts since the last one."""
    policy = _measured({1: 0.005, 8: 0.0052})  # rows nearly free: every sure draft pays by itself
    seq = Sequence("r", 0, [1, 2, 3], SamplingParams(), 0, 0.0)
    for _ in range(20):
        policy.observe(seq, 4, 4)
    step = policy.step_cost.seconds(1, seq.num_tokens)
    assert policy.limits([seq], [4], 1, catch_up=[(0.0, 200)]) == [4]
    assert policy.limits([seq], [4], 1, catch_up=[(CATCH_UP_SHARE * 200 * step * 0.9, 200)]) == [4]
    assert policy.limits([seq], [4], 1, catch_up=[(CATCH_UP_SHARE * 200 * step * 1.1, 200)]) == [0]
    assert policy.limits([seq], [4], 1, catch_up=[(0.01, 2)]) == [0]  # two tokens left: not worth it
    idle = [policy.limits([seq], [4], 1, catch_up=[(PROBE_SHARE * 3 * PROBE_EVERY * step, 2)])[0]
            for _ in range(4 * PROBE_EVERY)]
    # (the step before counted as idle too): a probe once it is cheap enough, one draft
    assert 3 * PROBE_EVERY - 3 <= idle.index(1) <= 3 * PROBE_EVERY - 1 and sum(idle) == 1
    fixed = _linear(0.35)  # its unit is a one-row step, not seconds: catch-ups are not weighed
    failing = Sequence("f", 9, [1, 2, 3], SamplingParams(), 0, 0.0)
    for _ in range(10):
        fixed.observe(failing, 4, 0)
    probes = [fixed.limits([failing], [4], 1, catch_up=[(10.0, 200)])[0] for _ in range(PROBE_EVERY)]
    assert probes[-1] == 1 and sum(probes) == 1


def test_confident_prefix_is_kept_and_doubtful_tail_cut():
    policy = _measured({1: 1.0, 2: 1.45, 9: 1.66})
    assert policy.cut([6], [[0.95, 0.9, 0.9, 0.85, 0.04, 0.01]], 1) == [4]  # the tail does not pay
    assert policy.cut([3], [[0.3, 0.1, 0.05]], 1) == [0]  # a doubtful draft is dropped
    assert _linear(0.0).cut([3], [[0.3, 0.1, 0.05]], 1) == [3]  # free rows: keep all
    assert policy.cut([0, 2], [[], [0.99, 0.98]], 2) == [0, 2]


def _run(tiny_model_dir, row_cost: float, prompts, params):
    llm = LLM(model=str(tiny_model_dir), dtype="float32", speculative_config=NGRAM)
    llm.llm_engine.speculator.price_with(StepCostModel.fixed(row_cost, 256))
    outs = llm.generate(prompts, params, use_tqdm=False)
    return [o.outputs[0].token_ids for o in outs], llm.get_spec_decode_stats()


def test_cut_drafts_change_nothing_but_the_draft_count(tiny_model_dir, tiny_llm):
    prompts = PROMPTS[:6]
    params = greedy(32)
    expected = [o.outputs[0].token_ids for o in tiny_llm.generate(prompts, params, use_tqdm=False)]
    free, free_metrics = _run(tiny_model_dir, 0.0, prompts, params)
    costly, costly_metrics = _run(tiny_model_dir, 0.3, prompts, params)
    assert free == expected and costly == expected
    assert costly_metrics["spec_decode_num_draft_tokens"] < free_metrics["spec_decode_num_draft_tokens"]


def test_a_batch_is_priced_again_every_few_steps_or_when_it_changes():
    """Pricing costs a share of every step: a batch keeps the drafts it was priced to for
    REPRICE_EVERY - 1 steps while it is unchanged and nothing was verified (withheld, or a lookup
    found nothing), and is priced again at once when it changes or drafts are verified."""
    policy = _linear(0.15)
    seqs = [Sequence(f"r{i}", i, [1, 2, 3], SamplingParams(), 0, 0.0) for i in range(2)]
    for seq in seqs:
        for _ in range(10):
            policy.observe(seq, 4, 0)
    priced = []
    original = policy.allocate
    policy.allocate = lambda *args, **kwargs: priced.append(1) or original(*args, **kwargs)
    for _ in range(2 * REPRICE_EVERY):
        assert policy.limits(seqs, [4, 4], 2) == [0, 0]
    assert len(priced) == 2
    assert policy.limits(seqs[:1], [4], 1) == [0] and len(priced) == 3  # another batch: priced
    assert policy.limits(seqs[:1], [2], 1) == [0] and len(priced) == 4  # other caps: priced
    for _ in range(20):
        policy.observe(seqs[0], 4, 4)  # new evidence: priced
    kept = [policy.limits(seqs[:1], [4], 1) for _ in range(REPRICE_EVERY)]
    assert kept == [[4]] * REPRICE_EVERY and len(priced) == 5  # drafts nobody verified: kept, not priced

"""SamplingParams validation (no model needed)."""
from __future__ import annotations

import pytest

from draftwise import SamplingParams


def test_defaults_match_vllm():
    p = SamplingParams()
    assert p.n == 1
    assert p.temperature == 1.0
    assert p.top_p == 1.0
    assert p.top_k in (0, -1)
    assert p.min_p == 0.0
    assert p.seed is None
    assert p.max_tokens == 16
    assert p.min_tokens == 0
    assert not p.stop  # None or empty
    assert not p.stop_token_ids
    assert p.ignore_eos is False
    assert p.presence_penalty == 0.0
    assert p.frequency_penalty == 0.0
    assert p.repetition_penalty == 1.0
    assert p.logprobs is None
    assert p.skip_special_tokens is True
    assert p.include_stop_str_in_output is False


@pytest.mark.parametrize(
    "field, value",
    [
        ("n", 0),
        ("n", -3),
        ("temperature", -0.1),
        ("temperature", -5),
        ("top_p", 0.0),
        ("top_p", -0.5),
        ("top_p", 1.01),
        ("top_k", -2),
        ("top_k", -100),
        ("min_p", -0.01),
        ("min_p", 1.5),
        ("max_tokens", 0),
        ("max_tokens", -1),
        ("min_tokens", -1),
        ("presence_penalty", 2.5),
        ("presence_penalty", -2.01),
        ("frequency_penalty", 3.0),
        ("frequency_penalty", -2.5),
        ("repetition_penalty", 0.0),
        ("repetition_penalty", -1.0),
        ("logprobs", -1),
    ],
)
def test_invalid_value_raises_naming_field(field, value):
    with pytest.raises(ValueError) as exc:
        SamplingParams(**{field: value})
    assert field in str(exc.value)


def test_min_tokens_greater_than_max_tokens():
    with pytest.raises(ValueError, match="min_tokens"):
        SamplingParams(min_tokens=10, max_tokens=5)
    # Equal is fine.
    p = SamplingParams(min_tokens=5, max_tokens=5)
    assert p.min_tokens == p.max_tokens == 5


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(top_p=1.0),
        dict(top_p=1e-6),
        dict(top_k=1),
        dict(top_k=50),
        dict(min_p=0.0),
        dict(min_p=1.0),
        dict(temperature=0.0),
        dict(temperature=2.5),
        dict(presence_penalty=2.0, frequency_penalty=-2.0),
        dict(presence_penalty=-2.0, frequency_penalty=2.0),
        dict(repetition_penalty=0.5),
        dict(repetition_penalty=100.0),
        dict(logprobs=0),
        dict(logprobs=5),
        dict(n=4, seed=123),
        dict(max_tokens=1),
        dict(min_tokens=3, max_tokens=8),
        dict(stop="abc"),
        dict(stop=["a", "bc"], stop_token_ids=[1, 2]),
    ],
)
def test_valid_values_accepted(kwargs):
    p = SamplingParams(**kwargs)
    for key, value in kwargs.items():
        if key == "stop":
            continue  # may be normalised to a list
        assert getattr(p, key) == value


@pytest.mark.parametrize("top_k", [0, -1])
def test_top_k_zero_and_minus_one_accepted(top_k):
    # Both mean "off"; behavioural equivalence is checked in test_generate.py.
    SamplingParams(top_k=top_k)


def test_stop_string_or_list():
    for stop in ("END", ["END"], ["END", "STOP"]):
        p = SamplingParams(stop=stop)
        assert p.stop is not None


# --------------------------------------------------------------------------------------
# Sampling behaviour on the tiny random model.
# --------------------------------------------------------------------------------------
from conftest import PROMPTS, greedy  # noqa: E402


def _gen(llm, prompts, params):
    return [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]


def _sampled(seed=None, **kw):
    kw.setdefault("temperature", 1.0)
    kw.setdefault("max_tokens", 16)
    kw.setdefault("ignore_eos", True)
    return SamplingParams(seed=seed, **kw)


def test_seed_reproducible_alone_and_in_any_batch(tiny_llm):
    p = _sampled(seed=42)
    alone = _gen(tiny_llm, PROMPTS[1], p)[0]
    assert _gen(tiny_llm, PROMPTS[1], p)[0] == alone
    batch = _gen(tiny_llm, [PROMPTS[0], PROMPTS[1], PROMPTS[4]], [_sampled(), p, _sampled(seed=7)])
    assert batch[1] == alone
    batch2 = _gen(tiny_llm, [PROMPTS[4], PROMPTS[6], PROMPTS[1], PROMPTS[1]],
                  [_sampled(seed=7), _sampled(), _sampled(), p])
    assert batch2[3] == alone
    assert batch2[0] == batch[2]  # the other seeded request is reproducible too


def test_different_seeds_give_different_samples(tiny_llm):
    outs = [_gen(tiny_llm, PROMPTS[1], _sampled(seed=s))[0] for s in range(1, 5)]
    assert len({tuple(o) for o in outs}) >= 3


def test_unseeded_samples_differ_from_greedy(tiny_llm):
    ref = _gen(tiny_llm, PROMPTS[1], greedy(16, ignore_eos=True))[0]
    outs = _gen(tiny_llm, [PROMPTS[1]] * 3, _sampled())
    assert any(o != ref for o in outs)


@pytest.mark.parametrize(
    "kwargs",
    [dict(top_k=1), dict(top_p=1e-6), dict(min_p=1.0), dict(temperature=0.0, seed=5),
     dict(temperature=0.0, top_k=5, top_p=0.5)],
    ids=["top_k=1", "top_p=1e-6", "min_p=1", "temp0-seeded", "temp0-with-filters"],
)
def test_degenerate_filters_equal_greedy(tiny_llm, kwargs):
    prompts = PROMPTS[:4]
    ref = _gen(tiny_llm, prompts, greedy(16, ignore_eos=True))
    kw = dict(temperature=1.0, seed=3)
    kw.update(kwargs)
    # Batched with a random-sampling request to exercise mixed batches.
    outs = _gen(tiny_llm, prompts + [PROMPTS[5]],
                [_sampled(**kw)] * len(prompts) + [_sampled(seed=9, temperature=1.5)])
    assert outs[:len(prompts)] == ref


def test_top_k_off_values_are_equivalent(tiny_llm):
    a = _gen(tiny_llm, PROMPTS[2], _sampled(seed=21, top_k=0))[0]
    b = _gen(tiny_llm, PROMPTS[2], _sampled(seed=21, top_k=-1))[0]
    assert a == b


def test_top_k_restricts_to_top_ranks(tiny_llm):
    for seed in (1, 2):
        c = tiny_llm.generate(PROMPTS[2], _sampled(seed=seed, temperature=2.0, top_k=2, logprobs=2),
                              use_tqdm=False)[0].outputs[0]
        assert all(e[t].rank <= 2 for t, e in zip(c.token_ids, c.logprobs))
    # Control: without top-k, high-temperature sampling does leave the top 2.
    c = tiny_llm.generate(PROMPTS[2], _sampled(seed=1, temperature=2.0, logprobs=2),
                          use_tqdm=False)[0].outputs[0]
    assert any(e[t].rank > 2 for t, e in zip(c.token_ids, c.logprobs))


def test_min_p_restricts_to_likely_tokens(tiny_llm):
    import math

    for seed in (1, 2):
        c = tiny_llm.generate(PROMPTS[2], _sampled(seed=seed, min_p=0.3, logprobs=1),
                              use_tqdm=False)[0].outputs[0]
        for t, e in zip(c.token_ids, c.logprobs):
            top = max(lp.logprob for lp in e.values())
            assert math.exp(e[t].logprob) >= 0.3 * math.exp(top) - 1e-6


def _num_repeats(tokens):
    return len(tokens) - len(set(tokens))


def test_repetition_penalty_prevents_repeats(tiny_llm):
    base = _gen(tiny_llm, PROMPTS, greedy(20, ignore_eos=True))
    pen = _gen(tiny_llm, PROMPTS, greedy(20, ignore_eos=True, repetition_penalty=100.0))
    assert sum(map(_num_repeats, base)) > 0  # the unpenalised model does repeat itself
    assert pen != base
    for prompt, tokens in zip(PROMPTS, pen):
        assert _num_repeats(tokens) == 0
        # As in vLLM / HF, prompt tokens are penalised too.
        assert not set(tokens) & set(tiny_llm.get_tokenizer()(prompt).input_ids)


@pytest.mark.parametrize("name", ["presence_penalty", "frequency_penalty"])
def test_additive_penalties_reduce_repeats(tiny_llm, name):
    base = _gen(tiny_llm, PROMPTS, greedy(20, ignore_eos=True))
    pen = _gen(tiny_llm, PROMPTS, greedy(20, ignore_eos=True, **{name: 2.0}))
    neg = _gen(tiny_llm, PROMPTS, greedy(20, ignore_eos=True, **{name: -2.0}))
    assert pen != base and neg != base
    assert sum(map(_num_repeats, pen)) < sum(map(_num_repeats, base))
    assert sum(map(_num_repeats, neg)) > sum(map(_num_repeats, base))


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(seed=2**63), "seed"),
        (dict(seed=2**63 - 1, n=2), "seed"),  # sequence 1 would sample with seed 2**63
        (dict(seed=-2**63 - 1), "seed"),
        (dict(top_k=2**64), "top_k"),
        (dict(n=2**63), "n"),
        (dict(max_tokens=2**70), "max_tokens"),
        (dict(stop_token_ids=[2**64]), "stop_token_ids"),
        (dict(temperature=float("nan")), "temperature"),
        (dict(temperature=float("inf")), "temperature"),
        (dict(repetition_penalty=10**400), "repetition_penalty"),
        (dict(stop="end\ud800"), "stop"),
        (dict(min_tokens=6, max_tokens=5), "min_tokens"),
        (dict(n=True), "n"),
    ],
)
def test_values_the_engine_cannot_represent_are_refused(kwargs, field):
    with pytest.raises(ValueError, match=rf"SamplingParams\.{field}="):
        SamplingParams(**kwargs)


def test_int64_edges_are_accepted():
    assert SamplingParams(seed=2**63 - 2, n=2).seed == 2**63 - 2
    assert SamplingParams(seed=-2**63).seed == -2**63
    assert SamplingParams(top_k=2**63 - 1).top_k == 2**63 - 1


def test_error_messages_never_echo_a_huge_value():
    with pytest.raises(ValueError) as exc:
        SamplingParams(stop=["x" * 100_000 + "\ud800"])
    assert len(str(exc.value)) < 300

"""Constrained sampling never leaves its constraint, and speculation keeps its distribution.

* The sampler's noise stays inside (0, 1) at its extremes, so a token the grammar mask (or
  top-k) removed can never be drawn: rows whose noise hits the largest uniform, found by
  search and pinned here, with the old 24-bit noise's ``1.0`` rows as well.
* Many concurrent seeded requests at temperature 1 over a regex with forced spans and free
  choices, in every drafting configuration (plain constrained decoding, grammar drafts, ngram,
  a probabilistic model drafter): every output matches, and the outputs' distribution is plain
  constrained decoding's (chi-square; one-hot drafts keep plain decoding's noise, so there the
  outputs are the very same).
* A token the grammar refuses anyway (injected here) ends its request with
  ``finish_reason="error"``, the output cut before it; the server answers 500 naming the
  request, and keeps serving.
"""
from __future__ import annotations

import collections
import re

import pytest
import torch
from conftest import app_server
from test_server_errors import call

from draftwise import LLM, SamplingParams, StructuredOutputsParams
from draftwise.sample import SamplingMetadata, SpecDecodeMetadata
from draftwise.sample.logits import uniform_noise
from draftwise.sample.verify.rejection_sampler import rejection_sample
from draftwise.sample.sampler import sample

VOCAB = 49152  # SmolLM2's width: the extreme rows below are where its columns meet the largest uniform
# (seed, position 5, column): the largest uniform (1 - 2**-24) here, and 1.0 under 24-bit noise.
EXTREME_ROWS = [(928, 33844), (984, 21764), (1122, 36074), (1527, 30807), (1981, 30762)]
POSITION = 5

REGEX = r"(cat|dog|bird) sat on the (mat|rug|sofa|floor)\."
PROMPT = "The cat sat on the mat. The dog sat on the rug. The bird sat on the"
NUM_REQUESTS = 600


def _meta(seeds: list[int], top_k: int | None = None) -> SamplingMetadata:
    rows = len(seeds)
    return SamplingMetadata(
        all_greedy=False, greedy=torch.zeros(rows, dtype=torch.bool), temperature=torch.ones(rows),
        top_k=None if top_k is None else torch.full((rows,), top_k), top_p=None, min_p=None,
        seeds=torch.tensor(seeds), positions=torch.full((rows,), POSITION))


def _only(allowed: list[int], rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A grammar bitmask allowing ``allowed`` in every row: (rows [rows], bitmask [rows, words])."""
    bitmask = torch.zeros(rows, VOCAB // 32, dtype=torch.int64)
    for token in allowed:
        bitmask[:, token // 32] |= 1 << (token % 32)
    bitmask = torch.where(bitmask >= 1 << 31, bitmask - (1 << 32), bitmask)  # as int32 bit patterns
    return torch.arange(rows), bitmask.to(torch.int32)


def test_extreme_uniforms_stay_inside_the_unit_interval():
    seeds = torch.tensor([seed for seed, _ in EXTREME_ROWS])
    u = uniform_noise(seeds, torch.full_like(seeds, POSITION), VOCAB)
    assert float(u.max()) < 1.0 and float(u.min()) > 0.0
    assert float(u[0, EXTREME_ROWS[0][1]]) == 1 - 2 ** -24  # the pinned rows do reach the extreme
    assert torch.isfinite(-torch.log(u)).all() and (-torch.log(u) > 0).all()


def test_a_masked_token_is_never_drawn_at_the_extremes():
    logits = torch.randn(len(EXTREME_ROWS), VOCAB, generator=torch.Generator().manual_seed(0))
    meta = _meta([seed for seed, _ in EXTREME_ROWS])
    meta.grammar_rows, meta.grammar_bitmask = _only([7, 11], len(EXTREME_ROWS))
    drawn = sample(logits, meta).token_ids[:, 0]
    assert set(drawn.tolist()) <= {7, 11}
    top2 = logits.topk(2, dim=-1).indices
    drawn = sample(logits, _meta([seed for seed, _ in EXTREME_ROWS], top_k=2)).token_ids[:, 0]
    assert (drawn[:, None] == top2).any(dim=-1).all()


def test_verification_never_emits_a_masked_token_at_the_extremes():
    """One-hot drafts (allowed tokens) verified at the extreme rows: accepted or not, every emitted
    token is one the mask allows."""
    num_seqs = len(EXTREME_ROWS)
    logits = torch.randn(2 * num_seqs, VOCAB, generator=torch.Generator().manual_seed(1))
    meta = _meta([seed for seed, _ in EXTREME_ROWS for _ in range(2)])
    meta.positions = torch.tensor([POSITION, POSITION + 1] * num_seqs)
    meta.grammar_rows, meta.grammar_bitmask = _only([7, 11], 2 * num_seqs)
    spec = SpecDecodeMetadata(torch.full((num_seqs,), 7), [1] * num_seqs, torch.arange(1, num_seqs + 1),
                              torch.arange(num_seqs) * 2, torch.arange(num_seqs) * 2 + 1)
    emitted = rejection_sample(logits, meta, spec).token_ids
    assert set(emitted[emitted >= 0].tolist()) <= {7, 11}


def _constrained(n: int = NUM_REQUESTS) -> list[SamplingParams]:
    return [SamplingParams(temperature=1.0, seed=i, max_tokens=16,
                           structured_outputs=StructuredOutputsParams(regex=REGEX)) for i in range(n)]


def _texts(llm: LLM) -> list[str]:
    outs = llm.generate([PROMPT] * NUM_REQUESTS, _constrained(), use_tqdm=False)
    return [o.outputs[0].text for o in outs]


def _homogeneity_pvalue(a: collections.Counter, b: collections.Counter) -> float:
    """Chi-square test that two samples of categories come from one distribution."""
    keys = sorted(set(a) | set(b))
    table = torch.tensor([[a[k] for k in keys], [b[k] for k in keys]], dtype=torch.float64)
    expected = table.sum(1, keepdim=True) * table.sum(0, keepdim=True) / table.sum()
    stat = ((table - expected) ** 2 / expected).sum()
    df = torch.tensor(float(len(keys) - 1))
    return float(1 - torch.special.gammainc(df / 2, stat / 2))


@pytest.fixture(scope="module")
def plain_texts(tiny_model_dir) -> list[str]:
    llm = LLM(model=str(tiny_model_dir), dtype="float32", seed=0, additional_config={"grammar_drafts": False})
    texts = _texts(llm)
    assert all(re.fullmatch(REGEX, t) for t in texts)
    assert len(set(texts)) >= 6  # free choices were taken: the comparison below has categories
    return texts


def _config(name: str, spec_dirs: dict) -> dict:
    return {
        "grammar_drafts": {},
        "ngram": {"speculative_config": {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3}},
        "draft_model": {"speculative_config": {"method": "draft_model", "model": str(spec_dirs["draft"]),
                                               "num_speculative_tokens": 3, "draft_sample_method": "probabilistic"}},
    }[name]


@pytest.mark.parametrize("name", ["grammar_drafts", "ngram", "draft_model"])
def test_every_output_matches_and_keeps_plain_constrained_distribution(name, tiny_model_dir, spec_dirs,
                                                                      plain_texts):
    llm = LLM(model=str(tiny_model_dir), dtype="float32", seed=0, **_config(name, spec_dirs))
    texts = _texts(llm)
    assert [t for t in texts if not re.fullmatch(REGEX, t)] == []
    assert _homogeneity_pvalue(collections.Counter(plain_texts), collections.Counter(texts)) > 1e-3
    if name != "draft_model":  # one-hot drafts: plain decoding's noise, the same tokens
        assert texts == plain_texts
    stats = llm.get_spec_decode_stats()
    assert stats.get("spec_decode_num_draft_tokens", 0) + stats["grammar_num_draft_tokens"] > 0


def _emit_a_refused_token_once(engine, token: int):
    """Make the runner emit ``token`` as the second output token of the first constrained sequence."""
    execute, done = engine.runner.execute, []

    def execute_and_corrupt(scheduled, needs=None):
        result = execute(scheduled, needs)
        for i, seq in enumerate(result.seqs):
            if not done and seq.params.structured_outputs is not None and seq.num_output_tokens == 1:
                result.token_ids[i] = [token]
                done.append(seq.request_id)
        return result

    engine.runner.execute = execute_and_corrupt
    return done


def _digit_token(tokenizer) -> int:
    return next(i for i in range(len(tokenizer)) if tokenizer.decode([i]).strip().isdigit())


def test_a_refused_token_fails_its_request_and_is_cut(tiny_model_dir):
    llm = LLM(model=str(tiny_model_dir), dtype="float32", seed=0)
    corrupted = _emit_a_refused_token_once(llm.llm_engine, _digit_token(llm.get_tokenizer()))
    params = _constrained(2) + [SamplingParams(temperature=0.0, max_tokens=8)]
    outs = llm.generate([PROMPT] * 3, params, use_tqdm=False)
    failed = [o for o in outs if o.request_id in corrupted]
    assert len(failed) == 1 and failed[0].outputs[0].finish_reason == "error"
    assert "structured-output constraint" in failed[0].error
    assert len(failed[0].outputs[0].token_ids) == 1  # cut before the refused token
    assert not any(ch.isdigit() for ch in failed[0].outputs[0].text)
    others = [o.outputs[0] for o in outs if o.request_id not in corrupted]
    assert [c.finish_reason for c in others] == ["stop", "length"]
    assert re.fullmatch(REGEX, others[0].text)
    engine = llm.llm_engine
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks and not engine.structured.states


def test_a_refused_token_is_a_500_naming_the_request(tiny_model_dir):
    from transformers import AutoTokenizer

    from draftwise.config import EngineConfig
    from draftwise.engine.engine import LLMEngine
    from draftwise.server.app import build_app
    from draftwise.server.async_engine import AsyncEngine

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    engine = LLMEngine(EngineConfig(model=str(tiny_model_dir), dtype="float32"))
    corrupted = _emit_a_refused_token_once(engine, _digit_token(tokenizer))
    with app_server(build_app(AsyncEngine(engine), ["tiny"], tokenizer)) as url:
        body = {"prompt": PROMPT, "max_tokens": 16, "temperature": 1.0, "seed": 3,
                "structured_outputs": {"regex": REGEX}}
        status, payload = call(url, "/v1/completions", body, key=None)
        assert corrupted and status == 500 and payload["error"]["type"] == "server_error"
        assert corrupted[0] in payload["error"]["message"]
        status, payload = call(url, "/v1/completions", body, key=None)
        assert status == 200 and re.fullmatch(REGEX, payload["choices"][0]["text"])
        assert engine.block_manager.usage == 0 and not engine.has_unfinished_requests()

"""The sampler's fast paths give what the reference computes: top-k / top-p settled from each row's
largest logits equals a sort of the whole vocabulary (rows that cannot be settled fall back to it),
and the C++ noise equals the torch noise bit for bit."""
from __future__ import annotations

import pytest
import torch

from draftwise.kernels import native
from draftwise.sample import logits as sampling
from draftwise.sample.logits import CANDIDATES, _top_k_top_p_sorted, apply_top_k_top_p, uniform_noise_reference

VOCAB = 6000


def rows(num: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    scale = torch.tensor([0.3, 1.0, 4.0, 12.0]).repeat(num // 4 + 1)[:num, None]  # flat to peaked rows
    return torch.randn(num, VOCAB, generator=g) * scale


@pytest.mark.parametrize("case", ["top_p", "top_k", "both", "mixed"])
def test_candidates_equal_a_full_sort(case):
    logits = rows(32, seed=1)
    top_k = top_p = None
    if case in ("top_k", "both", "mixed"):
        top_k = torch.tensor([5, 50, 255, 256, 1000, VOCAB, 1, 4096] * 4)
    if case in ("top_p", "both", "mixed"):
        top_p = torch.tensor([0.5, 0.9, 0.95, 0.99, 1.0, 0.3, 0.999, 0.8] * 4)
    if case == "mixed":
        logits[3, 100:110] = logits[3].max() + 1  # ties at the top
    fast = apply_top_k_top_p(logits, top_k, top_p)
    full = _top_k_top_p_sorted(logits, top_k, top_p)
    assert torch.equal(fast.isinf(), full.isinf())
    assert torch.equal(fast[~fast.isinf()], full[~full.isinf()])


def test_flat_rows_fall_back_and_peaked_rows_do_not(monkeypatch):
    calls = []
    real = sampling._top_k_top_p_sorted
    monkeypatch.setattr(sampling, "_top_k_top_p_sorted", lambda x, k, p: calls.append(len(x)) or real(x, k, p))
    flat, peaked, wide = torch.zeros(1, VOCAB), torch.zeros(1, VOCAB), torch.zeros(1, VOCAB)
    peaked[0, :10] = 20.0
    wide[0, :1000] = 20.0
    out = apply_top_k_top_p(torch.cat([flat, peaked, wide]), None, torch.tensor([0.9, 0.9, 0.9]))
    assert calls == [1]  # only the flat row needed the sort; the wide one was settled in the second tier
    assert abs(int((~out[0].isinf()).sum()) - int(VOCAB * 0.9)) <= 1 and VOCAB * 0.9 > CANDIDATES[-1]
    assert abs(int((~out[2].isinf()).sum()) - 900) <= 1 and 900 > CANDIDATES[0]
    assert (~out[1].isinf()).sum() == 10


@pytest.mark.skipif(not native.load(), reason="the C++ CPU kernels did not build")
def test_native_noise_equals_the_torch_noise():
    seeds = torch.tensor([0, 1, -1, 2 ** 40 + 7, -(2 ** 62), 12345])
    positions = torch.tensor([0, 5, 100000, 3, 2 ** 30, 77])
    for stream in (0, 1, 3):
        native_noise = torch.ops.draftwise_cpu.uniform_noise(seeds, positions, 4099, stream)
        assert torch.equal(native_noise, uniform_noise_reference(seeds, positions, 4099, stream))

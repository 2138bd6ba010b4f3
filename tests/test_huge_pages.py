"""Large weight buffers on huge pages: aligned to 2 MiB where the kernel allows them, plain tensors
otherwise, and a linear on them computes exactly what it computes on plain pages."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, quants

from draftwise.kernels import huge_pages
from draftwise.layers import gguf_linear
from draftwise.layers.gguf_linear import GGUFLinear


def test_a_large_buffer_is_aligned_to_a_huge_page_and_backed_by_its_mapping(monkeypatch):
    monkeypatch.setenv(huge_pages.ENV, "1")
    if not huge_pages.enabled():
        pytest.skip(f"no transparent huge pages here (mode {huge_pages.thp_mode()!r})")
    shape = (3 * huge_pages.HUGE_PAGE_BYTES // 4 + 5, 4)  # not a whole number of huge pages
    t = huge_pages.empty(shape, torch.float32)
    assert t.shape == shape and t.dtype == torch.float32 and t.is_contiguous()
    assert t.data_ptr() % huge_pages.HUGE_PAGE_BYTES == 0
    t.fill_(1.5)
    del t  # (the mapping goes with the last view of it)
    small = huge_pages.empty((16, 16), torch.float32)
    assert small.data_ptr() % huge_pages.HUGE_PAGE_BYTES != 0 or small.numel() * 4 < huge_pages.MIN_BYTES


def test_switched_off_it_is_a_plain_tensor(monkeypatch):
    monkeypatch.setenv(huge_pages.ENV, "0")
    assert not huge_pages.enabled()
    t = huge_pages.empty((huge_pages.MIN_BYTES,), torch.uint8)
    assert t.shape == (huge_pages.MIN_BYTES,) and t.untyped_storage().nbytes() == huge_pages.MIN_BYTES


@pytest.mark.skipif(not gguf_linear.available(), reason="the C++ CPU kernels did not build")
def test_a_linear_on_huge_pages_computes_what_it_does_on_plain_pages(monkeypatch):
    rng = np.random.default_rng(0)
    out_features, in_features = 4096, 1024  # Q4_0: 2.25 MiB of blocks per part, two parts
    parts = [torch.from_numpy(quants.quantize(rng.standard_normal((out_features, in_features)).astype(np.float32),
                                              GGMLQuantizationType.Q4_0)) for _ in range(2)]
    monkeypatch.setenv(huge_pages.ENV, "0")
    plain = GGUFLinear(parts, "Q4_0")
    monkeypatch.setenv(huge_pages.ENV, "1")
    huge = GGUFLinear(parts, "Q4_0")
    assert torch.equal(plain.blocks, huge.blocks)
    x = torch.randn(3, in_features, generator=torch.Generator().manual_seed(1))
    assert torch.equal(plain(x), huge(x))
    if huge_pages.enabled():
        assert huge.blocks.data_ptr() % huge_pages.HUGE_PAGE_BYTES == 0

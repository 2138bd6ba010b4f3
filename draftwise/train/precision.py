"""The matrix precision ``train-draft`` computes in: ``float32``, ``bfloat16`` (CPU autocast: bf16
matrix products, fp32 weights, optimizer and losses) or ``auto``, measured at start-up.

``auto`` times one forward and backward of a drafter-sized product (512 rows x 576 x 8192, an
lm_head over a draft vocabulary) both ways and keeps bf16 only where it is faster
by ``MIN_GAIN``: CPUs with native bf16 dot products (AVX512-BF16, AMX) gain, others (AVX2 only)
emulate bf16 and lose. On CUDA, ``auto`` is bf16.
"""
from __future__ import annotations

import contextlib
import time

import torch

CHOICES = ("auto", "float32", "bfloat16")
MIN_GAIN = 1.15


def use_bfloat16(precision: str, device: torch.device) -> bool:
    if precision not in CHOICES:
        raise ValueError(f"--precision must be one of {', '.join(CHOICES)}, got {precision!r}")
    if precision != "auto":
        return precision == "bfloat16"
    if device.type == "cuda":
        return True
    return _seconds(False) > MIN_GAIN * _seconds(True)


def autocast(enabled: bool, device: torch.device):
    if not enabled:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=torch.bfloat16)


def _seconds(bf16: bool, rows: int = 512, hidden: int = 576, vocab: int = 8192) -> float:
    """Best of 4: forward and backward of ``x @ w.T`` at the drafter's sizes."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(rows, hidden, generator=generator, requires_grad=True)
    w = torch.randn(vocab, hidden, generator=generator, requires_grad=True)
    best = float("inf")
    for _ in range(4):
        start = time.perf_counter()
        with autocast(bf16, torch.device("cpu")):
            out = x @ w.T
        out.float().sum().backward()
        best = min(best, time.perf_counter() - start)
    return best

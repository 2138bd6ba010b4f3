"""Triton kernels for a decoder step on a CUDA GPU: fewer, fused launches where torch runs several.

A decode step of a small model on a GPU is bound by its kernel launches, not its bytes: each layer's
norms, rotary embedding, KV write, masks and activation run as a dozen tiny torch kernels. The kernels
here fuse them (``elementwise.py``: residual add + RMSNorm + cast, rotary + KV write, SiLU x up;
``static_attention.py``: paged attention of a uniform batch read straight from the block table), and
``models/fused_layers.py`` runs a decoder's layers with them.

``enabled(device, dtype)`` says whether to use them: Triton importable, a CUDA device (or Triton's
CPU interpreter, ``TRITON_INTERPRET=1``, which the tests use), ``DRAFTWISE_TRITON`` not ``0``, and a
self-check that runs each kernel once against its torch reference on that device and dtype and
passed. The check runs once per (device, dtype) and process; a kernel that fails to build or to match
turns the fused path off with a warning, and the model keeps its torch layers.
"""
from __future__ import annotations

import functools
import importlib.util
import logging
import os

import torch

TRITON_ENV = "DRAFTWISE_TRITON"
logger = logging.getLogger(__name__)


def interpreted() -> bool:
    """Triton runs its kernels on the CPU through its interpreter (tests on machines without a GPU)."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def enabled(device: torch.device, dtype: torch.dtype) -> bool:
    if os.environ.get(TRITON_ENV, "1") == "0" or importlib.util.find_spec("triton") is None:
        return False
    if device.type != "cuda" and not (device.type == "cpu" and interpreted()):
        return False
    if dtype not in (torch.float32, torch.bfloat16, torch.float16):
        return False
    return _self_check(str(device), dtype)


@functools.cache
def _self_check(device: str, dtype: torch.dtype) -> bool:
    from .check import check_kernels

    try:
        error = check_kernels(torch.device(device), dtype)
    except Exception as exc:  # a kernel that does not build here: the torch layers run instead
        error = f"{type(exc).__name__}: {exc}"
    if error:
        logger.warning("draftwise: the Triton kernels are off on %s (%s): %s", device, dtype, error)
    return not error

"""The fused Triton kernels (``layers/gpu/``) and the layers that run on them (``models/fused_layers.py``):
on a CUDA GPU, or on the CPU through Triton's interpreter (``TRITON_INTERPRET=1``, fp32); skipped
elsewhere. Each kernel equals its torch reference (the start-up self-check), and an engine whose
layers run fused emits the torch layers' greedy tokens, on ragged steps and on the static step's
uniform decode batches (where attention is the Triton paged kernel; the kernel check covers verify
rows, three per sequence)."""
from __future__ import annotations

import importlib.util

import pytest
import torch
from conftest import PROMPTS, greedy

from draftwise import LLM
from draftwise.engine.compile_target import attach_static_step
from draftwise.layers import gpu

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None
                                or not (DEVICE == "cuda" or gpu.interpreted()),
                                reason="needs Triton and a CUDA GPU (or TRITON_INTERPRET=1)")
MAX_TOKENS = [9, 14, 6, 11]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16] if DEVICE == "cuda" else [torch.float32])
def test_every_kernel_matches_its_torch_reference(dtype):
    from draftwise.layers.gpu.check import check_kernels

    assert check_kernels(torch.device(DEVICE), dtype) == ""


def _engine(model_dir, fused: bool, static: bool) -> LLM:
    llm = LLM(model=str(model_dir), dtype="float32", device=DEVICE, enforce_eager=True, seed=0)
    engine = llm.llm_engine
    model = engine.runner.paged.model
    assert model.fused or DEVICE == "cpu"  # on by default on a GPU
    model.fused, model.stack = fused, None if fused else model.stack
    if static:
        attach_static_step(engine.runner.paged, engine.block_manager.num_blocks, [1, 2, 4], 1,
                           engine.max_model_len, capture=False)
    return llm


def _tokens(llm: LLM) -> list[list[int]]:
    params = [greedy(n) for n in MAX_TOKENS]
    return [o.outputs[0].token_ids for o in llm.generate(PROMPTS[:4], params, use_tqdm=False)]


def test_fused_layers_give_the_torch_layers_tokens(tiny_model_dir):
    expected = _tokens(_engine(tiny_model_dir, fused=False, static=False))
    assert _tokens(_engine(tiny_model_dir, fused=True, static=False)) == expected  # ragged steps
    fused_static = _engine(tiny_model_dir, fused=True, static=True)
    assert _tokens(fused_static) == expected
    assert fused_static.llm_engine.runner.paged.static_step._entries  # decode steps took the Triton attention

"""The C++ decoder stack (``models/decoder_stack.py``): every architecture's layers on GGUF blocks
run from C++ are as accurate as the Python layers on the same blocks; a decode or verify step
run whole in C++ equals, bit for bit, the same step run as two C++ halves around the Python
attention (the path of steps that mix prefill chunks in), K/V cache included."""
from __future__ import annotations

import pytest
import torch
from test_model_parity import (
    ARCHS,
    BLOCK_SIZE,
    CPU,
    MAX_POS,
    _hf_logits,
    _kv_cache,
    _run_schedule,
    _tokens,
    _window,
    random_checkpoint,
)

from draftwise.layers import gguf_linear
from draftwise.layers.attention import build_metadata
from draftwise.layers.forward_context import forward_context
from draftwise.models import decoder_stack
from draftwise.models.registry import build_model, load_config

pytestmark = pytest.mark.skipif(not gguf_linear.available(), reason="the C++ CPU kernels did not build")


@pytest.fixture(scope="module", params=ARCHS)
def quantized(request, tmp_path_factory):
    """(name, the random fp32 transformers model, a model of that architecture on its weights as
    Q8_0 blocks with its C++ stack and paged attention for every query length the kernel takes)."""
    name = request.param
    path = tmp_path_factory.mktemp(f"stack-{name}")
    hf = random_checkpoint(name, path)
    model = build_model(path, load_config(path), torch.float32, CPU, max_positions=MAX_POS, quantization="q8_0")
    assert model.stack is not None and model.stack.num_layers() == len(model.layers)
    model.set_attention_plan({64: "paged"})
    return name, hf.eval(), model


SCHEDULE = [[(0, 20), (1, 9)], [(1, 1), (0, 21)], [(0, 1), (1, 1)], [(1, 5), (0, 1)], [(0, 1)], [(1, 9), (0, 1)]]


def test_stack_is_as_accurate_as_the_python_layers(quantized):
    """Same blocks, same 8-bit activations, prefill, decode, verify and mixed steps: against the
    fp32 transformers model, the stack's logits are as close as the Python layers' (within 25%;
    not bit for bit: the stack keeps fp32 between the linears and orders its sums its own way,
    and on this deliberately ill-conditioned random model a one-step change of an 8-bit
    activation moves the logits by a few percent). A wrong norm, rotary or activation is far
    off."""
    name, hf, model = quantized
    seqs, tables = [_tokens(45, seed=2), _tokens(25, seed=3)], [[3, 0, 5], [6, 2]]
    ref = torch.cat([_hf_logits(hf, s) for s in seqs])
    stacked = torch.cat(_run_schedule(model, seqs, tables, SCHEDULE))
    stack, model.stack = model.stack, None
    try:
        python = torch.cat(_run_schedule(model, seqs, tables, SCHEDULE))
    finally:
        model.stack = stack
    error = lambda logits: ((logits - ref).norm() / ref.norm()).item()  # noqa: E731
    assert error(stacked) <= 1.25 * error(python) + 1e-3, name
    assert (stacked.argmax(-1) == python.argmax(-1)).float().mean().item() >= 0.95, name


@torch.no_grad()
def test_a_whole_step_equals_its_halves(quantized):
    """A verify step of two sequences (4 and 1 query rows) after their prompts: the one-call C++
    path and the layer-by-layer halves give the same hidden states and write the same K/V."""
    name, _, model = quantized
    seqs, tables = [_tokens(30, seed=5), _tokens(20, seed=6)], [[3, 0], [6, 2]]
    kv = _kv_cache(model)
    table = torch.tensor(tables)
    prompt = build_metadata(table, [26, 19], [26, 19], BLOCK_SIZE, _window(model), CPU)
    with forward_context(model.attention_metadata(prompt), kv):
        model(torch.cat([seqs[0][:26], seqs[1][:19]]), torch.cat([torch.arange(26), torch.arange(19)]))
    ids = torch.cat([seqs[0][26:30], seqs[1][19:20]])
    positions = torch.cat([torch.arange(26, 30), torch.arange(19, 20)])
    meta = model.attention_metadata(build_metadata(table, [4, 1], [30, 20], BLOCK_SIZE, _window(model), CPU))
    assert meta.cu_query_lens is not None  # the paged kernel: the whole path
    whole, halves, kv_whole, kv_halves = whole_and_halves(model, meta, ids, positions, kv)
    assert torch.equal(whole, halves), name
    assert torch.equal(kv_whole, kv_halves), name
    assert not torch.equal(kv_whole, kv), name  # the step wrote its K/V


def whole_and_halves(model, meta, ids: torch.Tensor, positions: torch.Tensor, kv: torch.Tensor):
    """One step of ``ids`` at ``positions`` on ``meta`` run twice from the same cache: the one-call C++
    path and the layer-by-layer halves; ``(whole, halves, kv_whole, kv_halves)`` (``kv`` is not changed)."""
    x = model.embed_tokens(ids).float()
    if model.embed_scale is not None:
        x = x * torch.tensor(model.embed_scale, dtype=x.dtype)
    rope = {t: (c[positions].unsqueeze(1), s[positions].unsqueeze(1)) for t, (c, s) in model.rope.items()}
    cos, sin = [rope[t][0] for t in model.rope_types], [rope[t][1] for t in model.rope_types]
    kv_whole, kv_halves = kv.clone(), kv.clone()
    with forward_context(meta, kv_whole):
        whole, _ = decoder_stack.run_stack(model, x, rope, ())
    with forward_context(meta, kv_halves):
        halves = decoder_stack._layer_by_layer(model, x, cos, sin, False, 0, len(model.layers))
    return whole, halves, kv_whole, kv_halves

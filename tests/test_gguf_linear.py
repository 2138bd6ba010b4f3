"""Linears on GGUF blocks as stored (``GGUFLinear``), every supported type: exact against the
kernel's own arithmetic (the weights as ``gguf`` de-quantizes them, activations rounded to 8 bits
per 32 values),
close to the float product, batch invariant; the bundled model runs on them by default."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, quants

from draftwise import LLM, SamplingParams
from draftwise.layers import gguf_linear
from draftwise.layers.gguf_linear import BLOCK_BYTES, QTYPE_IDS, REPACKED, GGUFLinear

pytestmark = pytest.mark.skipif(not gguf_linear.available(), reason="the C++ CPU kernels did not build")


def _random_k_blocks(qtype: str, out_features: int, in_features: int, rng) -> np.ndarray:
    """Random k-quant super-blocks (``gguf`` cannot quantize to these) with small fp16 scales."""
    raw = rng.integers(0, 256, size=(out_features, in_features // 256, BLOCK_BYTES[qtype]), dtype=np.uint8)
    d, dmin = (np.array([v], np.float16).view(np.uint8) for v in (0.01, 0.005))
    if qtype == "Q6_K":  # ql, qh, scales, then d
        raw[..., 208:210] = d
    else:  # d, dmin first
        raw[..., 0:2], raw[..., 2:4] = d, dmin
    return raw.reshape(out_features, -1)


def _blocks(qtype: str, out_features: int, in_features: int, seed: int) -> np.ndarray:  # [out, row_bytes]
    """Random weights in ``qtype`` as a file stores them."""
    rng = np.random.default_rng(seed)
    if qtype.endswith("_K"):
        return _random_k_blocks(qtype, out_features, in_features, rng)
    weights = rng.standard_normal((out_features, in_features)).astype(np.float32)
    return quants.quantize(weights, GGMLQuantizationType[qtype])


def _layer(qtype: str, out_features: int = 48, in_features: int = 512, seed: int = 0):
    """(GGUFLinear over random weights in ``qtype``, their de-quantized [out, in] fp32 weights by gguf)."""
    blocks = _blocks(qtype, out_features, in_features, seed)
    weight = quants.dequantize(blocks, GGMLQuantizationType[qtype])
    return GGUFLinear(torch.from_numpy(blocks), qtype), torch.from_numpy(weight)


def _as_kernel_rounds(x: torch.Tensor) -> torch.Tensor:  # [rows, in]
    """Activations as the kernel sees them: per block of 32, round(x * 127 / max|x|) * max|x| / 127."""
    blocks = x.reshape(x.shape[0], -1, 32)
    amax = blocks.abs().amax(dim=-1, keepdim=True)
    scale = amax / 127
    q = torch.where(amax > 0, torch.round(blocks * (127 / amax)), 0.0)
    return (q * scale).reshape_as(x)


@pytest.mark.parametrize("qtype", sorted(QTYPE_IDS))
def test_equals_the_files_weights_times_rounded_activations(qtype):
    layer, weight = _layer(qtype)
    x = torch.randn(5, 512, generator=torch.Generator().manual_seed(1))
    out = layer(x)
    exact = (_as_kernel_rounds(x).double() @ weight.double().t()).float()
    assert torch.allclose(out, exact, rtol=1e-4, atol=1e-4 * exact.abs().max().item())
    product = x @ weight.t()
    assert ((out - product).norm() / product.norm()) < 0.01  # 8-bit activations


@pytest.mark.parametrize("out_features", [40, 48])  # 48: interleaved where AVX512-VNNI runs
@pytest.mark.parametrize("qtype", sorted(QTYPE_IDS))
def test_a_rows_result_does_not_depend_on_its_batch(qtype, out_features):
    layer, _ = _layer(qtype, out_features=out_features, in_features=256)
    x = torch.randn(16, 256, generator=torch.Generator().manual_seed(2))
    alone = torch.cat([layer(x[i:i + 1]) for i in range(16)])
    for rows in (2, 3, 8, 9, 16):
        for start in (0, 16 - rows):
            assert torch.equal(layer(x[start:start + rows]), alone[start:start + rows])


def test_bias_and_bf16_inputs():
    layer, weight = _layer("Q8_0", out_features=32, in_features=64)
    layer.bias = torch.randn(32)
    x = torch.randn(3, 64)
    out = layer(x.bfloat16())
    assert out.dtype == torch.bfloat16
    ref = x @ weight.t() + layer.bias
    assert ((out.float() - ref).norm() / ref.norm()) < 0.02


def test_bad_blocks_are_refused():
    with pytest.raises(ValueError, match="IQ4_NL"):
        GGUFLinear(torch.zeros(4, 144, dtype=torch.uint8), "IQ4_NL")
    with pytest.raises(ValueError, match=r"\[out, k \* 18\]"):
        GGUFLinear(torch.zeros(4, 100, dtype=torch.uint8), "Q4_0")


@pytest.mark.slow
def test_bundled_model_runs_on_its_blocks_close_to_fp32():
    """SmolLM2 Q4_1: with dtype auto every layer linear and the tied head (Q8_0) keep the file's
    blocks; over several prompts the first token's top logprobs stay close to the de-quantized
    fp32 model's: 0.15 on average, 0.6 at most (8-bit activations and a bf16 KV cache move a
    4-bit model's logprobs by ~0.1 on average and up to ~0.5 on some tokens, whatever runs the
    layers)."""
    prompts = ["Write a Python function that reverses a string.", "What is the capital of France?",
               "Explain photosynthesis in one sentence.", "How do I sort a list in Python?",
               "Give me a haiku about winter.", "def fibonacci(n):"]
    params = SamplingParams(temperature=0.0, max_tokens=1, logprobs=5)
    refs = [o.outputs[0].logprobs[0] for o in LLM(dtype="float32").generate(prompts, params, use_tqdm=False)]
    llm = LLM()
    model = llm.llm_engine.runner.model
    assert model.num_gguf_linears == 4 * len(model.layers) + 1 and isinstance(model.lm_head, GGUFLinear)
    outs = [o.outputs[0].logprobs[0] for o in llm.generate(prompts, params, use_tqdm=False)]
    diffs = []
    for ref, out in zip(refs, outs):
        shared = set(ref) & set(out)
        assert len(shared) >= 3
        diffs += [abs(ref[t].logprob - out[t].logprob) for t in shared]
    assert sum(diffs) / len(diffs) < 0.15 and max(diffs) < 0.6


@pytest.mark.parametrize("out_features", [24, 32])  # 32: interleaved 16 rows at a time where AVX512-VNNI runs
@pytest.mark.parametrize("in_features", [576, 544, 608])  # last group: a pair, 1 unit, 3 units
@pytest.mark.parametrize("qtype", [t for t in REPACKED if not t.endswith("_K")])
def test_repacked_rows_compute_the_files_weights(qtype, in_features, out_features):
    """Q4_0 / Q4_1 / Q5_0 / Q8_0 rows are repacked at load (their last partial group too where it
    is a pair; 16 rows interleaved where the CPU runs that kernel); at every row count the outputs
    equal the file layout's up to the order of the sums, and both equal the exact product of the
    file's weights with the rounded activations."""
    rng = np.random.default_rng(3)
    kind = GGMLQuantizationType[qtype]
    blocks = quants.quantize(rng.standard_normal((out_features, in_features)).astype(np.float32), kind)
    weight = torch.from_numpy(quants.dequantize(blocks, kind)).double()
    layer = GGUFLinear(torch.from_numpy(blocks), qtype)
    assert layer.packed and not torch.equal(layer.blocks, torch.from_numpy(blocks))
    for rows in (1, 3, 9):  # seeded: a value on an 8-bit rounding tie may round the other way in the reference
        x = torch.randn(rows, in_features, generator=torch.Generator().manual_seed(rows))
        as_stored = torch.ops.draftwise_cpu.gguf_linear(x, torch.from_numpy(blocks), layer.qtype_id, False, None)
        exact = (_as_kernel_rounds(x).double() @ weight.t()).float()
        tol = 1e-5 * exact.abs().max().item()
        assert torch.allclose(layer(x), exact, rtol=1e-5, atol=tol)
        assert torch.allclose(as_stored, exact, rtol=1e-5, atol=tol)


@pytest.mark.parametrize("out_features", [24, 32, 64])
@pytest.mark.parametrize("qtype", ["Q4_K", "Q5_K", "Q6_K"])
def test_k_quant_rows_compute_the_files_weights(qtype, out_features):
    """The k-quants are interleaved 16 rows at a time where AVX512-VNNI runs (their scales, mins
    and high bits moved, never rounded) and kept as stored elsewhere; at every row count both
    layouts equal the exact product of the file's weights with the rounded activations."""
    rng = np.random.default_rng(4)
    blocks = _random_k_blocks(qtype, out_features, 768, rng)
    weight = torch.from_numpy(quants.dequantize(blocks, GGMLQuantizationType[qtype])).double()
    layer = GGUFLinear(torch.from_numpy(blocks), qtype)
    if out_features % 16:
        assert torch.equal(layer.blocks, torch.from_numpy(blocks))
    for rows in (1, 3, 9):
        x = torch.randn(rows, 768, generator=torch.Generator().manual_seed(rows))
        as_stored = torch.ops.draftwise_cpu.gguf_linear(x, torch.from_numpy(blocks), layer.qtype_id, False, None)
        exact = (_as_kernel_rounds(x).double() @ weight.t()).float()
        tol = 1e-5 * exact.abs().max().item()
        assert torch.allclose(layer(x), exact, rtol=1e-5, atol=tol)
        assert torch.allclose(as_stored, exact, rtol=1e-5, atol=tol)


@pytest.mark.parametrize("rows", [(32, 16, 16), (24, 8)])  # whole 16-row blocks per part, or not
@pytest.mark.parametrize("qtype", ["Q4_0", "Q4_K", "Q6_K", "Q5_1"])
def test_a_fused_projections_parts_compute_as_their_rows_concatenated(qtype, rows):
    """A fused projection is laid out part by part into one buffer (each part straight from the
    file's mapping); it computes exactly what the concatenated rows do."""
    parts = [torch.from_numpy(_blocks(qtype, n, 512, seed)) for seed, n in enumerate(rows)]
    fused, whole = GGUFLinear(parts, qtype), GGUFLinear(torch.cat(parts), qtype)
    assert fused.out_features == sum(rows) and torch.equal(fused.blocks, whole.blocks)
    x = torch.randn(3, 512, generator=torch.Generator().manual_seed(5))
    assert torch.equal(fused(x), whole(x))


def test_a_weight_in_the_files_layout_is_used_in_place():
    """Q5_1 has no other layout: its rows are the file's own bytes, not a copy."""
    blocks = torch.from_numpy(_blocks("Q5_1", 32, 256, 6))
    assert GGUFLinear([blocks], "Q5_1").blocks.data_ptr() == blocks.data_ptr()

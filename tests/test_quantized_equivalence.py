"""Speculation on quantized weights changes no output: with the linears and the head on quantized
blocks (``quantization="q4_0"``, the kernels GGUF files run on; the layers as the C++ stack), greedy outputs of every method
equal plain decoding on the same weights, token for token, alone and batched, in fp32 and at the
default dtype, with the model drafters' linears on Q8_0 blocks too; a bad ``quantization`` is
refused naming the field."""
from __future__ import annotations

import pytest
import torch
from conftest import PROMPTS, greedy
from test_spec_equivalence import REPEAT_PROMPT, drafting_methods, spec_configs

from draftwise import LLM
from draftwise.layers import gguf_linear
from draftwise.layers.gguf_linear import GGUFLinear

pytestmark = pytest.mark.skipif(not gguf_linear.available(), reason="the C++ CPU kernels did not build")
PROMPTS_ALL = PROMPTS + [REPEAT_PROMPT]
PARAMS = [greedy(24) for _ in PROMPTS] + [greedy(40)]


def _tokens(outs):
    return [o.outputs[0].token_ids for o in outs]


@pytest.fixture(scope="module", params=["float32", "auto"])
def quantized_plain(request, tiny_model_dir):
    """(dtype, plain greedy outputs on q4_0 weights, each prompt alone). Prefix caching is off: the
    batched pass would hit the alone passes' blocks, and a prompt's rows after a hit attend with the
    paged kernel where the whole prompt attends with SDPA (a rounding apart)."""
    llm = LLM(model=str(tiny_model_dir), dtype=request.param, quantization="q4_0", seed=0, device="cpu",
              enable_prefix_caching=False)
    model = llm.llm_engine.runner.model
    assert model.num_gguf_linears == 4 * len(model.layers) + 1 and isinstance(model.lm_head, GGUFLinear)
    assert model.stack is not None  # the layers run as one C++ stack
    alone = [_tokens(llm.generate(p, sp, use_tqdm=False))[0] for p, sp in zip(PROMPTS_ALL, PARAMS)]
    assert _tokens(llm.generate(PROMPTS_ALL, PARAMS, use_tqdm=False)) == alone  # batching changes nothing
    return request.param, alone


@pytest.mark.parametrize("method", drafting_methods())
def test_every_method_equals_plain_on_quantized_weights(method, tiny_model_dir, spec_dirs, quantized_plain):
    dtype, expected = quantized_plain
    llm = LLM(model=str(tiny_model_dir), dtype=dtype, quantization="q4_0", seed=0, device="cpu",
              speculative_config=spec_configs(spec_dirs)[method])
    assert _tokens(llm.generate(PROMPTS_ALL, PARAMS, use_tqdm=False)) == expected
    assert llm.get_spec_decode_stats()["spec_decode_num_drafts"] > 0
    drafter = getattr(llm.llm_engine.speculator.proposer, "model", None)
    if method in ("eagle", "eagle3", "mtp", "dflash"):  # the drafter runs on the target's kernels
        linears = [m for m in drafter.modules() if isinstance(m, (GGUFLinear, torch.nn.Linear))]
        assert linears and all(isinstance(m, GGUFLinear) and m.qtype == "Q8_0" for m in linears)


@pytest.mark.parametrize("value", ["awq", "Q8_0", 4])
def test_bad_quantization_is_refused_naming_the_field(tiny_model_dir, value):
    with pytest.raises(ValueError, match=r"quantization=.*allowed: \[None, 'gguf', 'q8_0'"):
        LLM(model=str(tiny_model_dir), quantization=value)

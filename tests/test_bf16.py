"""The bf16 CPU path: packed/matvec linears and end-to-end bf16 generation stay close to fp32."""
import pytest
import torch
import torch.nn.functional as F

from draftwise import LLM, SamplingParams
from draftwise.layers.linear import PackedLinear, can_pack

needs_bf16 = pytest.mark.skipif(not can_pack(torch.device("cpu"), torch.bfloat16),
                                reason="oneDNN bf16 not available on this CPU")


@needs_bf16
@pytest.mark.parametrize("num_rows", [1, 3, 17])
@pytest.mark.parametrize("with_bias", [False, True])
def test_packed_linear_matches_fp32(num_rows, with_bias):
    torch.manual_seed(0)
    weight = torch.randn(96, 64).bfloat16()
    bias = torch.randn(96).bfloat16() if with_bias else None
    x = torch.randn(num_rows, 64).bfloat16()
    ref = F.linear(x.float(), weight.float(), None if bias is None else bias.float())
    out = PackedLinear(weight, bias)(x)
    assert out.shape == (num_rows, 96) and out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), ref, rtol=2e-2, atol=5e-2)


def test_bf16_logprobs_close_to_fp32(tiny_model_dir):
    prompts = ["The quick brown fox", "def add(a, b):"]
    params = SamplingParams(temperature=0.0, max_tokens=1, logprobs=5)
    results = {}
    for dtype in ("float32", "bfloat16"):
        llm = LLM(model=str(tiny_model_dir), dtype=dtype)
        results[dtype] = llm.generate(prompts, params, use_tqdm=False)
    for ref, out in zip(results["float32"], results["bfloat16"]):
        ref_top = ref.outputs[0].logprobs[0]
        out_top = out.outputs[0].logprobs[0]
        shared = set(ref_top) & set(out_top)
        assert len(shared) >= 3
        for token in shared:
            assert abs(ref_top[token].logprob - out_top[token].logprob) < 0.1


@pytest.mark.slow
def test_smollm2_bf16_answers_like_fp32():
    # Regression: bf16 norm statistics once turned this answer into "L'Étoile, la Marseillaise".
    # The answer is on a knife's edge: bf16 attention over the prompt (SDPA in bf16, or the paged
    # kernel on bf16 K/V) flips it too, and which of those the start-up measurement picks for a
    # prompt-sized query varies from run to run; the prompt attends in fp32 here, so the test
    # checks the norms it was written for, every run.
    llm = LLM(dtype="bfloat16")
    model = llm.llm_engine.runner.model
    plan = dict(model.kernel_plans.get("attention") or {1: "native"})
    model.set_attention_plan({**plan, 64: "fp32"})
    out = llm.chat([{"role": "user", "content": "What is the capital of France?"}],
                   SamplingParams(temperature=0.0, max_tokens=12), use_tqdm=False)[0]
    assert out.outputs[0].text.startswith("The capital of France is Paris")

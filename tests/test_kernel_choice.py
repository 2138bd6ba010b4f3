"""Kernels (linears; attention: native, fp32 or the paged kernel) chosen per row count by
measurement on this machine, cached, and all correct."""
from __future__ import annotations

import json
import time

import pytest
import torch
import torch.nn.functional as F

from draftwise import LLM, SamplingParams
from draftwise.layers import kernel_choice
from draftwise.layers.kernel_choice import ROW_BUCKETS, AttentionGroup, LinearGroup, choose_kernels, describe
from draftwise.layers.linear import CANDIDATES, PackedLinear, can_pack, plan_by_rows

DTYPES = [torch.float32] + ([torch.bfloat16] if can_pack(torch.device("cpu"), torch.bfloat16) else [])


def _modules(dtype: torch.dtype) -> list[PackedLinear]:
    torch.manual_seed(0)
    return [PackedLinear(torch.randn(48, 32).to(dtype), torch.randn(48).to(dtype)),
            PackedLinear(torch.randn(32, 48).to(dtype), None)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", [1, 2, 5, 70])
def test_every_kernel_computes_the_same_linear(dtype, rows):
    module = _modules(dtype)[0]
    x = torch.randn(rows, 32).to(dtype)
    ref = F.linear(x.float(), module.weight.float(), module.bias.float())
    tol = dict(rtol=2e-2, atol=5e-2) if dtype == torch.bfloat16 else dict(rtol=1e-5, atol=1e-5)
    for kernel in CANDIDATES[dtype]:
        if kernel == "mv" and rows != 1:
            continue
        torch.testing.assert_close(module.run(kernel, x).float(), ref, **tol)


@pytest.mark.parametrize("dtype", DTYPES)
def test_measured_plan_covers_every_bucket_and_is_cached(dtype, tmp_path, monkeypatch):
    modules = _modules(dtype)
    attention_plans = []
    groups = {"layers": LinearGroup(modules), "attention": AttentionGroup(4, 2, 8, dtype, attention_plans.append)}
    plans = choose_kernels(groups, tmp_path)
    assert list(plans) == ["layers", "attention"] and sorted(plans["layers"]) == list(ROW_BUCKETS)
    for bucket, kernel in plans["layers"].items():
        assert kernel in CANDIDATES[dtype] and (kernel != "mv" or bucket == 1)
    assert all(m.plan == plans["layers"] for m in modules)
    assert attention_plans == [plans["attention"]] and set(plans["attention"].values()) <= {"native", "fp32", "paged"}
    (record,) = [json.loads(p.read_text()) for p in tmp_path.glob("*.json")]
    assert record["torch"] == torch.__version__ and "flags" in record and record["times_ms"]["layers"]

    def fail(*args):
        raise AssertionError("a cached plan must not be measured again")

    monkeypatch.setattr(kernel_choice, "measure", fail)
    again = {"layers": LinearGroup(_modules(dtype)), "attention": AttentionGroup(4, 2, 8, dtype, print)}
    assert choose_kernels(again, tmp_path) == plans


def test_default_choice_skips_the_measurement(tmp_path, monkeypatch):
    monkeypatch.setenv(kernel_choice.CHOICE_ENV, "default")
    monkeypatch.setattr(kernel_choice, "measure", lambda *a: pytest.fail("measured"))
    plans = choose_kernels({"layers": LinearGroup(_modules(torch.float32))}, tmp_path)
    assert plans == {"layers": {2: "matmul_t", 3: "packed"}}


def test_plans_dispatch_by_row_count_and_reject_bad_kernels():
    assert plan_by_rows({1: "mv", 4: "linear", 16: "packed"}) == ["mv", "mv"] + ["linear"] * 3 + ["packed"] * 12
    module = _modules(torch.float32)[0]
    with pytest.raises(ValueError, match="kernel plan"):
        module.set_plan({1: "mv"})  # no fp32 matrix-vector kernel
    assert describe({"layers": {1: "mv", 2: "packed", 4: "packed"}}) == "layers: 1 row mv, 2-4+ rows packed"


@pytest.mark.parametrize("dtype", DTYPES)
def test_engine_models_run_the_measured_plan(tiny_model_dir, dtype):
    llm = LLM(model=str(tiny_model_dir), dtype=str(dtype).removeprefix("torch."), device="cpu")
    model = llm.llm_engine.runner.model
    assert set(model.kernel_plans) == {"layers", "head", "attention"}
    linears = [m for m in model.modules() if isinstance(m, PackedLinear)]
    assert linears and all(m.plan == model.kernel_plans["layers"] for m in linears if m is not model.lm_head)


@pytest.mark.skipif(torch.bfloat16 not in DTYPES, reason="oneDNN bf16 not available on this CPU")
def test_every_attention_kernel_of_a_bf16_model_matches_native(tiny_model_dir):
    prompts = ["The quick brown fox", "def add(a, b):"]
    llm = LLM(model=str(tiny_model_dir), dtype="bfloat16", device="cpu")
    model = llm.llm_engine.runner.model
    params = SamplingParams(temperature=0.0, max_tokens=1, logprobs=3)
    outputs = {}
    for kernel in ("native", "fp32", "paged"):
        model.set_attention_plan({1: kernel})
        outputs[kernel] = [o.outputs[0].logprobs[0] for o in llm.generate(prompts, params, use_tqdm=False)]
    for native, *others in zip(outputs["native"], outputs["fp32"], outputs["paged"]):
        for other in others:
            for token in set(native) & set(other):
                assert abs(native[token].logprob - other[token].logprob) < 0.05


def test_a_cached_plan_that_a_recheck_contradicts_is_measured_again(tmp_path, monkeypatch):
    """A plan cached while the machine was busy: at start-up its kernel is timed against the others,
    and where one runs RECHECK_RATIO times faster the plan is measured again and re-cached."""
    modules = _modules(torch.float32)
    slow = {"kernel": "packed"}  # the kernel that is slow on this (simulated) machine
    real_run = PackedLinear.run

    def run(self, kernel, x):
        if kernel == slow["kernel"]:
            time.sleep(0.005)
        return real_run(self, kernel, x)

    monkeypatch.setattr(PackedLinear, "run", run)
    plans = choose_kernels({"layers": LinearGroup(modules)}, tmp_path)
    assert set(plans["layers"].values()) == {"matmul_t"}
    slow["kernel"] = "matmul_t"  # the machine changed: the cached choice is now the slow one
    remeasured = choose_kernels({"layers": LinearGroup(_modules(torch.float32))}, tmp_path)
    assert set(remeasured["layers"].values()) == {"packed"}
    (record,) = [json.loads(p.read_text()) for p in tmp_path.glob("*.json")]
    assert set(record["plans"]["layers"].values()) == {"packed"}  # the cache holds the new plan

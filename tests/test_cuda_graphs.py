"""CUDA graphs on a GPU (skipped without one): the target's decode steps are captured by default
and give the eager engine's greedy tokens (fp32, where the ragged and the
fixed-shape attention agree to rounding), and a replayed graph gives exactly what the same fixed-shape
step gives uncaptured (bf16); captured verify steps are the open case.
``test_static_step.py`` checks the fixed-shape step itself on any device."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import PROMPTS, greedy

from draftwise import LLM
from draftwise.engine.compile_target import attach_static_step

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

MAX_TOKENS = [12, 20, 8, 16, 10, 14, 6, 18]


def _tokens(llm: LLM, prompts=PROMPTS) -> list[list[int]]:
    params = [greedy(n) for n in MAX_TOKENS[:len(prompts)]]
    return [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]


def test_graphs_are_on_by_default_and_give_the_eager_tokens(tiny_model_dir):
    eager = LLM(model=str(tiny_model_dir), dtype="float32", device="cuda", enforce_eager=True)
    graphs = LLM(model=str(tiny_model_dir), dtype="float32", device="cuda")
    assert eager.llm_engine.runner.paged.static_step is None
    assert _tokens(graphs) == _tokens(eager)
    assert graphs.llm_engine.runner.paged.static_step.num_graphs_captured > 0
    off = LLM(model=str(tiny_model_dir), dtype="float32", device="cuda", compilation_config={"cudagraph_mode": "NONE"})
    assert off.llm_engine.runner.paged.static_step is None


def test_speculation_beside_decode_graphs_gives_the_plain_tokens(tiny_model_dir):
    plain = _tokens(LLM(model=str(tiny_model_dir), dtype="float32", device="cuda", enforce_eager=True), PROMPTS[:4])
    spec = {"method": "draft_model", "model": str(tiny_model_dir), "num_speculative_tokens": 3}
    llm = LLM(model=str(tiny_model_dir), dtype="float32", device="cuda", speculative_config=spec)
    assert _tokens(llm, PROMPTS[:4]) == plain
    assert {b.query_len for b in llm.llm_engine.runner.paged.static_step._entries} == {1}  # verify steps run eager


SPECULATION = """
import sys
sys.path.insert(0, "tests")
from conftest import PROMPTS, greedy
from draftwise import LLM
from draftwise.engine.compile_target import attach_static_step
model, params = sys.argv[1], [greedy(n) for n in (12, 20, 8, 16)]
plain = LLM(model=model, dtype="float32", device="cuda", enforce_eager=True).generate(PROMPTS[:4], params)
llm = LLM(model=model, dtype="float32", device="cuda",
          speculative_config={"method": "draft_model", "model": model, "num_speculative_tokens": 3})
engine = llm.llm_engine
attach_static_step(engine.runner.paged, engine.block_manager.num_blocks, engine.runner.paged.static_step.sizes, 4,
                   engine.max_model_len, capture=True)
got = llm.generate(PROMPTS[:4], params)
assert [o.outputs[0].token_ids for o in got] == [o.outputs[0].token_ids for o in plain]
assert any(b.query_len > 1 for b in llm.llm_engine.runner.paged.static_step._entries), "no verify step captured"
"""


@pytest.mark.xfail(reason="on a GPU a verify step on the static step left a sequence's num_computed_tokens (17) "
                   "past its tokens (15) after a rejection; the draft model then got an empty query and SDPA's "
                   "ragged query index ran past q (device-side assert)", strict=False)
def test_captured_verify_steps_give_the_plain_tokens(tiny_model_dir):
    """Verify steps of 4 rows per sequence captured too (not the default): the plain tokens, and a request
    finishing early leaves padding sequences in the bucket. In a child process: a device-side assert
    would end every later CUDA test of this one."""
    result = subprocess.run([sys.executable, "-c", SPECULATION, str(tiny_model_dir)], capture_output=True,
                            text=True, timeout=300, cwd=Path(__file__).parents[1])
    assert result.returncode == 0, result.stderr[-3000:]


def test_replayed_graphs_equal_the_uncaptured_step_in_bf16(tiny_model_dir):
    graphs = LLM(model=str(tiny_model_dir), dtype="bfloat16", device="cuda")
    uncaptured = LLM(model=str(tiny_model_dir), dtype="bfloat16", device="cuda", enforce_eager=True)
    engine = uncaptured.llm_engine
    sizes = graphs.llm_engine.runner.paged.static_step.sizes
    attach_static_step(engine.runner.paged, engine.block_manager.num_blocks, sizes, 1, engine.max_model_len,
                       capture=False)
    assert _tokens(graphs) == _tokens(uncaptured)

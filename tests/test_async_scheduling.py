"""``async_scheduling=True``: the output thread builds the previous step's outputs while each
forward runs; tokens and outputs equal the synchronous engine's, for every drafting
method, with stop strings, ``n > 1`` and streamed (partial-text) outputs."""
from __future__ import annotations

import threading

import pytest
from conftest import PROMPTS, greedy
from test_spec_equivalence import drafting_methods, spec_configs

from draftwise import LLM, SamplingParams
from draftwise.cli import build_parser, engine_kwargs

PARAMS = [greedy(n) for n in (30, 12, 40, 16, 8, 24, 36, 20)]


def _texts_and_ids(outputs):
    return [[(c.text, c.token_ids, c.finish_reason, c.stop_reason) for c in o.outputs] for o in outputs]


def _run_both(model_dir, prompts, params, **kwargs):
    results = []
    for async_scheduling in (False, True):
        llm = LLM(model=str(model_dir), dtype="float32", seed=0, async_scheduling=async_scheduling, **kwargs)
        results.append(_texts_and_ids(llm.generate(prompts, params, use_tqdm=False)))
        assert not llm.llm_engine.has_unfinished_requests()
    return results


def test_plain_decoding_is_unchanged(tiny_model_dir):
    stops = [SamplingParams(temperature=0.0, max_tokens=40, stop=["e", "o "]),
             SamplingParams(temperature=0.8, seed=3, max_tokens=20, n=3),
             SamplingParams(temperature=0.0, max_tokens=25, logprobs=2)]
    sync, overlapped = _run_both(tiny_model_dir, PROMPTS + PROMPTS[:3], PARAMS + stops)
    assert overlapped == sync


@pytest.mark.parametrize("method", drafting_methods())
def test_every_drafting_method_is_unchanged(method, tiny_model_dir, spec_dirs):
    params = PARAMS[:7] + [SamplingParams(temperature=0.0, max_tokens=30, stop=["ab"])]
    sync, overlapped = _run_both(tiny_model_dir, PROMPTS, params, speculative_config=spec_configs(spec_dirs)[method])
    assert overlapped == sync


def test_the_forward_runs_while_the_previous_outputs_are_built(tiny_model_dir):
    """The forward of step N blocks until the engine builds a step's outputs: that can only
    happen when the two overlap (a synchronous engine would time out here). Torch runs on one
    thread only, the caller's; outputs are built on the output thread."""
    llm = LLM(model=str(tiny_model_dir), dtype="float32", seed=0, async_scheduling=True)
    engine = llm.llm_engine
    built, overlapped, threads, output_threads = threading.Event(), [], set(), set()
    execute, make_output = engine.runner.execute, engine.output_processor.make_output

    def slow_execute(*args, **kwargs):
        threads.add(threading.current_thread().name)
        if engine._pending_outputs:  # a previous step's outputs are waiting to be built
            overlapped.append(built.wait(timeout=10))
            built.clear()
        return execute(*args, **kwargs)

    def tracked_make_output(*args, **kwargs):
        output_threads.add(threading.current_thread().name)
        built.set()
        return make_output(*args, **kwargs)

    engine.runner.execute, engine.output_processor.make_output = slow_execute, tracked_make_output
    outputs = llm.generate(PROMPTS[:3], greedy(6), use_tqdm=False)
    assert [len(o.outputs[0].token_ids) for o in outputs] == [6, 6, 6]
    assert overlapped and all(overlapped)
    assert threads == {threading.current_thread().name} and output_threads == {"draftwise-output_0"}


def test_streamed_outputs_arrive_one_step_later_with_the_same_text(tiny_model_dir):
    snapshots = []
    for async_scheduling in (False, True):
        llm = LLM(model=str(tiny_model_dir), dtype="float32", seed=0, async_scheduling=async_scheduling)
        engine = llm.llm_engine
        engine.detokenize_unfinished = True
        engine.add_request("r", PROMPTS[2], greedy(8))
        steps = []
        while engine.has_unfinished_requests():
            steps.append([(o.outputs[0].text, o.finished) for o in engine.step()])
        snapshots.append(steps)
    sync, overlapped = snapshots
    assert overlapped[0] == [] and overlapped[1:] == sync  # each step returns the step before's outputs
    assert sync[-1][0][1] is True


def test_an_aborted_request_leaves_no_pending_output(tiny_model_dir):
    llm = LLM(model=str(tiny_model_dir), dtype="float32", seed=0, async_scheduling=True)
    engine = llm.llm_engine
    engine.add_request("a", PROMPTS[0], greedy(20))
    engine.add_request("b", PROMPTS[1], greedy(3))
    engine.step()
    engine.abort_request("a")
    seen = []
    while engine.has_unfinished_requests():
        seen += [o.request_id for o in engine.step()]
    assert "a" not in seen and seen[-1] == "b"


def test_flag_and_validation():
    args = build_parser().parse_args(["serve", "m", "--async-scheduling"])
    assert engine_kwargs(args)["async_scheduling"] is True
    assert engine_kwargs(build_parser().parse_args(["serve", "m"]))["async_scheduling"] is False
    with pytest.raises(ValueError, match="async_scheduling"):
        LLM(model="unused", async_scheduling="yes")

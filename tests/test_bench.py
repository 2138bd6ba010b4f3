"""`draftwise bench` on the tiny model: table, results.json with every configuration, valid PNGs,
the stability rule, and one clear error per bad argument."""
from __future__ import annotations

import contextlib
import io
import json
import math
import types
from pathlib import Path

import pytest

from draftwise.bench.measure import PassResult, RequestSample
from draftwise.bench.options import BenchOptions
from draftwise.bench.plots import PLOTS
from draftwise.bench.run import Candidate, run_rounds
from draftwise.bench.summary import is_settled
from draftwise.cli import main

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
DEPTHS = [1, 2]
CONFIGS = ["none"] + [f"{m} K={k}" for m in ("ngram", "suffix") for k in DEPTHS]


@pytest.fixture(scope="module")
def prompts_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("bench") / "mine.jsonl"
    lines = [{"prompt": "The quick brown fox jumps over the lazy dog. The quick brown fox"},
             {"messages": [{"role": "user", "content": "Paris is the capital of France. Paris is"}]},
             {"prompt": "unused: --num-prompts 2 keeps the first two"}]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


@pytest.fixture(scope="module")
def bench_run(tiny_model_dir, prompts_file, tmp_path_factory):
    out = tmp_path_factory.mktemp("bench-out")
    argv = ["bench", "--model", str(tiny_model_dir), "--dtype", "float32", "--workload", str(prompts_file),
            "--methods", "none,ngram,suffix", "--num-speculative-tokens", ",".join(map(str, DEPTHS)),
            "--num-prompts", "2", "--max-tokens", "8", "--concurrency", "1,2", "--min-repeats", "1",
            "--max-repeats", "2", "--out", str(out), "--compare", "transformers"]
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        code = main(argv)
    assert code == 0
    return stdout.getvalue(), out


def test_bench_prints_the_table_and_a_recommendation(bench_run):
    text, out = bench_run
    assert "tokens/s" in text and "per-position acceptance" in text and "TTFT ms" in text
    for config in CONFIGS:
        name, _, depth = config.partition(" K=")
        assert any(line.split()[:2] == [name, depth or "-"] for line in text.splitlines())
    assert "draftwise / transformers (concurrency 1):" in text
    recs = text.split("recommendation (fastest measured):\n", 1)[1].splitlines()
    assert [line.split(" at concurrency ")[1][0] for line in recs[:2]] == ["1", "2"]
    results = json.loads((out / "results.json").read_text())
    assert [r["concurrency"] for r in results["recommendations"]] == [1, 2]
    assert all(r["configuration"] in CONFIGS for r in results["recommendations"])


def test_results_json_has_every_configuration_with_sane_numbers(bench_run, prompts_file):
    _, out = bench_run
    results = json.loads((out / "results.json").read_text())
    rows = results["measurements"]
    mine = [r for r in rows if r["backend"] == "draftwise"]
    assert sorted((r["configuration"], r["concurrency"]) for r in mine) == sorted(
        (c, level) for c in CONFIGS for level in (1, 2))
    assert {r["workload"] for r in rows} == {str(prompts_file)}
    for r in mine:
        assert math.isfinite(r["tokens_per_s"]) and r["tokens_per_s"] > 0
        assert 1 <= r["repeats"] <= 2 and len(r["passes_tokens_per_s"]) == r["repeats"] and r["spread"] >= 0
        assert r["num_output_tokens"] > 0 and r["ttft_ms"] > 0 and r["tpot_ms"] > 0 and r["itl_ms"] > 0
        assert r["speedup"] > 0
        if r["method"] == "none":
            assert r["acceptance_rate"] is None and r["outputs_match_none"] is None and r["rows_per_token"] == 1
            continue
        # rows per token: one per step and sequence plus the drafts, over the tokens the steps gave
        drafted, accepted = r["num_draft_tokens"], r["num_accepted_tokens"]
        total = r["num_output_tokens"] * r["repeats"]
        assert r["rows_per_token"] == pytest.approx((total - accepted + drafted) / total)
        assert r["outputs_match_none"] == 2  # float32 greedy: speculation never changes the output
        assert 0 <= r["acceptance_rate"] <= 1 and 1 <= r["mean_acceptance_length"] <= r["num_speculative_tokens"] + 1
        per_pos = r["per_position_acceptance"]
        assert len(per_pos) == r["num_speculative_tokens"] and all(0 <= p <= 1 for p in per_pos)
        assert per_pos == sorted(per_pos, reverse=True)  # a draft position is accepted only after the ones before
    hf = sorted(r["configuration"] for r in rows if r["backend"] == "transformers")
    assert hf == ["transformers generate"] + [f"transformers prompt lookup K={k}" for k in DEPTHS]
    assert all(r["outputs_match_none"] == 2 and r["tokens_per_s"] > 0 for r in rows if r["backend"] == "transformers")
    assert len(results["transformers_ratios"]) == 1 + len(DEPTHS)
    assert set(results["engines"]) == set(CONFIGS)


def test_plots_are_valid_pngs(bench_run):
    from matplotlib.image import imread
    from PIL import Image

    _, out = bench_run
    for name in PLOTS:
        path = out / name
        assert path.read_bytes()[:8] == PNG_SIGNATURE
        with Image.open(path) as image:
            image.verify()
        height, width, channels = imread(path).shape
        assert height > 100 and width > 100 and channels in (3, 4)


# Relative standard error of the mean: 2 passes a, b -> |a - b| / (a + b).
@pytest.mark.parametrize("rates, expected", [
    ([10.0, 10.4], 2),  # 2.0% <= 3%
    ([12.0, 13.0, 12.6], 3),  # 4.0%, then 2.3%
    ([11.0, 12.2, 12.0, 12.0], 4),  # one slow pass: 5.2%, 3.2%, 2.2% (max - min would never shrink)
    ([10.0, 14.0, 10.0, 14.0, 10.0, 14.0], 5),  # never stable: stops at max_repeats
])
def test_passes_repeat_until_the_mean_is_pinned_down(rates, expected):
    needed = next(n for n in range(1, len(rates) + 1) if is_settled(rates[:n], 2, 5, 0.03))
    assert needed == expected


def test_rounds_interleave_candidates_and_drop_settled_ones():
    order = []

    def candidate(name: str, rates: list[float]) -> Candidate:
        it = iter(rates)

        def run_pass() -> PassResult:
            order.append(name)
            return PassResult(100 / next(it), [RequestSample(0, [0] * 100, None, None, [])], spec=None)
        return Candidate(dict(workload="w", label=name, backend="draftwise", method=name,
                              num_speculative_tokens=None, concurrency=1), run_pass)

    options = BenchOptions(workloads=["w"], methods=["none"], depths=[1], concurrency=[1], out=Path("."))
    bar = types.SimpleNamespace(set_description=lambda text: None, set_postfix_str=lambda text: None,
                                update=lambda n: None)
    rows = run_rounds([candidate("a", [10, 10]), candidate("b", [10, 11, 10.6]), candidate("c", [10, 10])],
                      options, bar)
    assert order == ["a", "b", "c", "b", "c", "a", "b"]  # the second round starts at b; a and c settle there
    assert [len(r.passes_tokens_per_s) for r in rows] == [2, 3, 2]


def test_labels_define_variants_at_their_own_depth():
    """A labelled --speculative-config is a configuration of its own, beside its method's; one with
    its own num_speculative_tokens runs at that depth only."""
    from draftwise.bench.options import _spec_options, configurations

    spec = _spec_options(['{"method": "ngram", "prompt_lookup_min": 2}',
                          '{"method": "ngram", "label": "ngram-long", "prompt_lookup_min": 4, "num_speculative_tokens": 9}'])
    options = BenchOptions(workloads=["w"], methods=["none", "ngram", "ngram-long"], depths=[1, 3], concurrency=[1],
                           out=Path("."), spec_options=spec)
    found = {c.label: c.speculative_config for c in configurations(options)}
    assert list(found) == ["none", "ngram K=1", "ngram K=3", "ngram-long K=9"]
    assert found["ngram K=3"] == {"prompt_lookup_min": 2, "method": "ngram", "num_speculative_tokens": 3}
    assert found["ngram-long K=9"] == {"prompt_lookup_min": 4, "method": "ngram", "num_speculative_tokens": 9}


BAD = [
    (["--methods", "none,magic"], "unknown method 'magic'"),
    (["--concurrency", "4", "--num-prompts", "2"], "--concurrency 4 needs at least as many prompts"),
    (["--speculative-config", "{bad"], "--speculative-config is not valid JSON"),
    (["--speculative-config", "[1]"], "--speculative-config must be a JSON object"),
    (["--additional-config", "{bad"], "--additional-config is not valid JSON"),
    (["--speculative-config", '{"method": "ngram", "label": "a,b"}'], '"label" must be a name without commas'),
    (["--speculative-config", '{"method": "ngram", "label": "x"}', "-sc", '{"method": "suffix", "label": "x"}'],
     "given twice for 'x'"),
    (["--speculative-config", '{"method": "magic", "label": "x"}', "--methods", "none,x"], "magic"),
    (["--speculative-config", '{"method": "suffix"}', "--methods", "none,ngram"], "not in --methods"),
    (["--speculative-config", '{"method": "ngram", "prompt_lookup_max": -1}'], "prompt_lookup_max"),
    (["--methods", "none,draft_model"], "needs 'model'"),
    (["--compare", "vllm"], "--compare: unknown value 'vllm'"),
    (["--min-repeats", "3", "--max-repeats", "2"], "--min-repeats <= --max-repeats"),
    (["--workload", "mt-bench"], "unknown workload 'mt-bench'"),
    (["--temperature", "-1"], "--temperature must be >= 0"),
]


@pytest.mark.parametrize("extra, message", BAD, ids=[b[1][:30] for b in BAD])
def test_bad_arguments_are_one_clear_line(extra, message, tmp_path, capsys):
    code = main(["bench", "--workload", "chat", "--num-prompts", "2", "--out", str(tmp_path), *extra])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("draftwise: error:") and message in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "results.json").exists()


@pytest.mark.parametrize("flag, value", [("--num-speculative-tokens", "0"), ("--concurrency", "1,x"),
                                         ("--methods", ",")])
def test_malformed_lists_are_argparse_errors(flag, value, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["bench", flag, value])
    assert exc.value.code == 2
    assert f"argument {flag}" in capsys.readouterr().err

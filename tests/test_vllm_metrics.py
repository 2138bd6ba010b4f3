"""vLLM's metric shapes: ``LLM.get_metrics()`` read as vLLM's examples read it, ``/metrics`` with
``vllm:*`` names and types, and the periodic log lines with vLLM's text, on a timer."""
from __future__ import annotations

import asyncio
import logging
import re
import time
import urllib.request

import pytest
from conftest import PROMPTS, SERVED_NAME, greedy
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from draftwise import LLM
from draftwise.metrics.prometheus import SnapshotCollector
from draftwise.metrics.reader import Counter, Gauge, Histogram, Metric, Vector
from draftwise.metrics.stat_logger import StatLogger
from draftwise.server.async_engine import AsyncEngine

SPEC = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 2}
BURST = PROMPTS + ["a b c a b c a b c a b c"]  # ngram drafts for most; a few drafts are accepted
NON_SPEC = {"vllm:prompt_tokens": Counter, "vllm:generation_tokens": Counter, "vllm:request_success": Counter,
            "vllm:num_requests_running": Gauge, "vllm:num_requests_waiting": Gauge,
            "vllm:kv_cache_usage_perc": Gauge, "vllm:prefix_cache_queries": Counter,
            "vllm:prefix_cache_hits": Counter, "vllm:time_to_first_token_seconds": Histogram,
            "vllm:inter_token_latency_seconds": Histogram, "vllm:e2e_request_latency_seconds": Histogram}


@pytest.fixture(scope="module")
def ngram_run(tiny_model_dir):
    """A fresh ngram engine after one ``generate`` of BURST (greedy, 40 tokens each, no EOS)."""
    llm = LLM(model=str(tiny_model_dir), dtype="float32", speculative_config=SPEC)
    outputs = llm.generate(BURST, greedy(40, ignore_eos=True), use_tqdm=False)
    return llm, outputs


def one(metrics: list[Metric], name: str, **labels) -> Metric:
    found = [m for m in metrics if m.name == name and labels.items() <= m.labels.items()]
    assert len(found) == 1, (name, labels, found)
    return found[0]


def test_get_metrics_reads_as_vllms_spec_decode_example(ngram_run):
    llm, outputs = ngram_run
    metrics = llm.get_metrics()
    # The loop of vLLM's examples/offline_inference/spec_decode.py, as written there.
    num_drafts = num_draft_tokens = num_accepted_tokens = 0
    acceptance_counts = [0] * SPEC["num_speculative_tokens"]
    for metric in metrics:
        if metric.name == "vllm:spec_decode_num_drafts":
            assert isinstance(metric, Counter)
            num_drafts += metric.value
        elif metric.name == "vllm:spec_decode_num_draft_tokens":
            assert isinstance(metric, Counter)
            num_draft_tokens += metric.value
        elif metric.name == "vllm:spec_decode_num_accepted_tokens":
            assert isinstance(metric, Counter)
            num_accepted_tokens += metric.value
        elif metric.name == "vllm:spec_decode_num_accepted_tokens_per_pos":
            assert isinstance(metric, Vector)
            for pos in range(len(metric.values)):
                acceptance_counts[pos] += metric.values[pos]
    stats = llm.get_spec_decode_stats()
    assert num_drafts == stats["spec_decode_num_drafts"] > 0
    assert num_draft_tokens == stats["spec_decode_num_draft_tokens"]
    assert num_accepted_tokens == stats["spec_decode_num_accepted_tokens"] > 0
    assert acceptance_counts == stats["spec_decode_num_accepted_tokens_per_pos"]
    assert 1 + num_accepted_tokens / num_drafts == pytest.approx(stats["spec_decode_mean_acceptance_length"])


def test_counts_histograms_gauges_and_labels(ngram_run, tiny_model_dir):
    llm, outputs = ngram_run
    metrics = llm.get_metrics()
    for name, kind in NON_SPEC.items():
        assert all(type(m) is kind for m in metrics if m.name == name) and any(m.name == name for m in metrics)
    assert all(m.labels["model_name"] == str(tiny_model_dir) and m.labels["engine"] == "0" for m in metrics)
    num_requests, num_tokens = len(BURST), 40 * len(BURST)
    assert one(metrics, "vllm:generation_tokens").value == num_tokens
    assert one(metrics, "vllm:prompt_tokens").value == sum(len(o.prompt_token_ids) for o in outputs)
    assert one(metrics, "vllm:request_success", finished_reason="length").value == num_requests
    assert {m.labels["finished_reason"] for m in metrics if m.name == "vllm:request_success"} == {
        "stop", "length", "abort", "error", "repetition"}
    for name in ("vllm:time_to_first_token_seconds", "vllm:e2e_request_latency_seconds",
                 "vllm:request_generation_tokens"):
        assert one(metrics, name).count == num_requests, name
    itl = one(metrics, "vllm:inter_token_latency_seconds")
    assert itl.count == num_tokens - num_requests  # one per token after each request's first
    assert one(metrics, "vllm:request_generation_tokens").sum == num_tokens
    for hist in (m for m in metrics if isinstance(m, Histogram)):
        counts = list(hist.buckets.values())
        assert counts == sorted(counts) and hist.buckets["+Inf"] == hist.count, hist.name  # cumulative
    e2e = one(metrics, "vllm:e2e_request_latency_seconds")
    assert e2e.sum >= one(metrics, "vllm:time_to_first_token_seconds").sum > 0
    assert [one(metrics, f"vllm:{g}").value for g in ("num_requests_running", "num_requests_waiting")] == [0, 0]
    assert one(metrics, "vllm:kv_cache_usage_perc").value == 0.0


def test_plain_engine_lists_vllms_metrics_without_spec_counters(tiny_llm):
    tiny_llm.generate("Hello", greedy(4), use_tqdm=False)
    names = {m.name for m in tiny_llm.get_metrics()}
    assert set(NON_SPEC) <= names
    assert not any(name.startswith("vllm:spec_decode") for name in names)
    # (the shared engine may have run structured outputs: only the grammar's draft counters then)
    assert not any(key.startswith("spec_decode") for key in tiny_llm.get_spec_decode_stats())


def test_an_aborted_request_counts_as_abort(tiny_llm):
    engine = tiny_llm.llm_engine
    before = one(engine.get_metrics(), "vllm:request_success", finished_reason="abort").value
    engine.add_request("to-abort", PROMPTS[4], greedy(50))
    engine.step()
    engine.abort_request("to-abort")
    metrics = engine.get_metrics()
    assert one(metrics, "vllm:request_success", finished_reason="abort").value == before + 1
    assert one(metrics, "vllm:num_requests_running").value == 0
    assert one(metrics, "vllm:kv_cache_usage_perc").value == 0.0


def _as_vllm_reader(text: str) -> dict:
    """Prometheus text read back as vLLM's reader reads its registry: {(name, extra labels): value}."""
    values = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            extra = tuple(sorted((k, v) for k, v in s.labels.items() if k not in ("model_name", "engine")))
            values[(s.name, extra)] = s.value
    return values


def test_prometheus_view_equals_get_metrics(ngram_run):
    llm, _ = ngram_run
    registry = CollectorRegistry()
    registry.register(SnapshotCollector(lambda: llm.llm_engine.stats.snapshot("served")))
    text = generate_latest(registry).decode()
    samples = _as_vllm_reader(text)
    for metric in llm.get_metrics():
        extra = tuple(sorted((k, v) for k, v in metric.labels.items() if k not in ("model_name", "engine")))
        if isinstance(metric, Vector):
            for pos, value in enumerate(metric.values):
                assert samples[(metric.name + "_total", (("position", str(pos)),))] == value
        elif isinstance(metric, Counter):
            assert samples[(metric.name + "_total", extra)] == metric.value, metric.name
        elif isinstance(metric, Gauge):
            assert samples[(metric.name, extra)] == metric.value, metric.name
        else:
            assert samples[(metric.name + "_count", extra)] == metric.count
            assert samples[(metric.name + "_sum", extra)] == pytest.approx(metric.sum)
            for le, count in metric.buckets.items():
                assert samples[(metric.name + "_bucket", (("le", le),))] == count
    assert 'model_name="served"' in text and 'engine="0"' in text


def test_server_metrics_have_vllms_names_and_types(api_server):
    import openai
    from conftest import API_KEY

    client = openai.OpenAI(base_url=api_server + "/v1", api_key=API_KEY, max_retries=0, timeout=120)
    client.completions.create(model=SERVED_NAME, prompt=BURST[-1], max_tokens=40, temperature=0,
                              extra_body={"ignore_eos": True})
    deadline = time.monotonic() + 30
    while True:  # the engine records the finished request before the response is sent; running drops after
        with urllib.request.urlopen(api_server + "/metrics", timeout=10) as resp:
            text = resp.read().decode()
        if re.search(r"^vllm:num_requests_running\{[^}]*\} 0\.0$", text, re.M):
            break
        assert time.monotonic() < deadline, text
        time.sleep(0.1)
    # vLLM's names for everything vLLM has; draftwise's one addition keeps its own prefix
    own = {line.split("{")[0] for line in text.splitlines() if line.startswith("draftwise:")}
    assert own == {"draftwise:spec_decode_draft_limits_total"}, own
    assert 'reason="full"' in text
    types = {family.name: family.type for family in text_string_to_metric_families(text)}
    # prometheus-client (vLLM's too) writes a counter's TYPE line with the sample name, ``_total`` included
    assert "# TYPE vllm:spec_decode_num_drafts_total counter" in text.splitlines()
    assert "# TYPE vllm:e2e_request_latency_seconds histogram" in text.splitlines()
    for name in ("spec_decode_num_drafts", "spec_decode_num_draft_tokens", "spec_decode_num_accepted_tokens",
                 "spec_decode_num_accepted_tokens_per_pos", "prompt_tokens", "generation_tokens",
                 "request_success", "prefix_cache_queries", "prefix_cache_hits"):
        assert types[f"vllm:{name}"] == "counter", name
    for name in ("num_requests_running", "num_requests_waiting", "kv_cache_usage_perc"):
        assert types[f"vllm:{name}"] == "gauge", name
    for name in ("time_to_first_token_seconds", "inter_token_latency_seconds", "e2e_request_latency_seconds"):
        assert types[f"vllm:{name}"] == "histogram", name
    samples = _as_vllm_reader(text)
    assert all(f'model_name="{SERVED_NAME}"' in line and 'engine="0"' in line
               for line in text.splitlines() if line.startswith("vllm:"))
    drafts, draft_tokens = (samples[(f"vllm:spec_decode_num_{n}_total", ())] for n in ("drafts", "draft_tokens"))
    accepted = samples[("vllm:spec_decode_num_accepted_tokens_total", ())]
    per_pos = [v for (name, _), v in samples.items() if name == "vllm:spec_decode_num_accepted_tokens_per_pos_total"]
    assert 0 < drafts <= draft_tokens <= 3 * drafts and len(per_pos) == 3 and sum(per_pos) == accepted
    finished = sum(v for (name, _), v in samples.items() if name == "vllm:request_success_total")
    assert samples[("vllm:e2e_request_latency_seconds_count", ())] <= finished
    assert samples[("vllm:e2e_request_latency_seconds_bucket", (("le", "+Inf"),))] == samples[
        ("vllm:e2e_request_latency_seconds_count", ())]
    assert samples[("vllm:generation_tokens_total", ())] >= 40


# ---------------------------------------------------------------------- log lines
class FakeClock:
    def __init__(self):
        self.now = time.monotonic()

    def __call__(self) -> float:
        return self.now


def _log_lines(caplog, level=logging.INFO) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= level
            and r.getMessage().startswith(("Engine 000:", "SpecDecoding metrics:"))]


def test_log_lines_after_a_burst_have_vllms_text(tiny_model_dir, caplog):
    llm = LLM(model=str(tiny_model_dir), dtype="float32", speculative_config=SPEC)
    engine, clock, interval = llm.llm_engine, FakeClock(), 5.0
    engine.stats.logger = StatLogger(engine.stats, "CPU", engine.speculator.logger, interval, clock)
    with caplog.at_level(logging.DEBUG, logger="draftwise"):
        llm.generate(BURST, greedy(40, ignore_eos=True), use_tqdm=False)  # within one interval
        for i in range(4):  # three idle intervals, then one second (not yet due)
            clock.now += interval if i < 3 else 1.0
            engine.stats.record_idle(engine)
    stats, metrics = llm.get_spec_decode_stats(), llm.get_metrics()
    prompt = sum(len(p) for p in llm.get_tokenizer()(BURST).input_ids)
    cached = one(metrics, "vllm:prompt_tokens_cached").value
    hits, queries = (one(metrics, f"vllm:prefix_cache_{n}").value for n in ("hits", "queries"))
    tail = "Running: 0 reqs, Waiting: 0 reqs, CPU KV cache usage: 0.0%" + (
        f", Prefix cache hit rate: {100 * hits / queries:.1f}%" if queries else "")
    per_pos = ", ".join(f"{c / stats['spec_decode_num_drafts']:.3f}"
                        for c in stats["spec_decode_num_accepted_tokens_per_pos"])
    spec_line = _log_lines(caplog)[0]
    assert spec_line.startswith(f"SpecDecoding metrics: Mean acceptance length: "
                                f"{stats['spec_decode_mean_acceptance_length']:.2f}, Accepted throughput: ")
    assert spec_line.endswith(
        f"Accepted: {stats['spec_decode_num_accepted_tokens']} tokens, "
        f"Drafted: {stats['spec_decode_num_draft_tokens']} tokens, Per-position acceptance rate: {per_pos}, "
        f"Avg Draft acceptance rate: {100 * stats['spec_decode_acceptance_rate']:.1f}%")
    assert _log_lines(caplog)[1:] == [  # the generate call's end flushed the acceptance line
        f"Engine 000: Avg prompt throughput: {(prompt - cached) / interval:.1f} tokens/s, "
        f"Avg generation throughput: {40 * len(BURST) / interval:.1f} tokens/s, {tail}",
        f"Engine 000: Avg prompt throughput: 0.0 tokens/s, Avg generation throughput: 0.0 tokens/s, {tail}"]
    idle = [r for r in caplog.records if r.getMessage().startswith("Engine 000:") and r.levelno == logging.DEBUG]
    assert len(idle) == 1  # an idle interval after an idle one logs at DEBUG, as in vLLM


def test_server_loop_logs_the_interval_that_ends_a_burst(tiny_model_dir, caplog):
    """The engine loop's timer: with no step after the burst, its last interval is logged anyway (with
    the acceptance line), then one zero line, then nothing at INFO however long the loop idles."""
    llm = LLM(model=str(tiny_model_dir), dtype="float32", speculative_config=SPEC)
    engine, interval = llm.llm_engine, 1.0  # a step never stalls that long mid-burst
    engine.stats.logger = StatLogger(engine.stats, "CPU", engine.speculator.logger, interval)
    async_engine = AsyncEngine(engine)

    async def burst() -> None:
        async def one_request(i: int) -> None:
            handle = await async_engine.add_request(f"r{i}", BURST[i], greedy(40, ignore_eos=True))
            async for _ in handle.outputs():
                pass
        await asyncio.gather(*(one_request(i) for i in range(len(BURST))))

    with caplog.at_level(logging.INFO, logger="draftwise"):
        async_engine.start()
        try:
            asyncio.run(burst())
            time.sleep(3.5 * interval)  # the interval that ends the burst, a zero one, a DEBUG one
        finally:
            async_engine.stop()
    lines = _log_lines(caplog)
    engine_lines = [line for line in lines if line.startswith("Engine 000:")]
    zero = "Avg prompt throughput: 0.0 tokens/s, Avg generation throughput: 0.0 tokens/s"
    assert zero not in engine_lines[0] and zero in engine_lines[-1]
    assert [zero in line for line in engine_lines].count(True) == 1, lines
    assert lines[-1] == engine_lines[-1]  # nothing after the zero line
    accepted = [int(re.search(r"Accepted: (\d+) tokens", line).group(1)) for line in lines
                if line.startswith("SpecDecoding metrics:")]
    drafted = [int(re.search(r"Drafted: (\d+) tokens", line).group(1)) for line in lines
               if line.startswith("SpecDecoding metrics:")]
    stats = llm.get_spec_decode_stats()
    assert sum(accepted) == stats["spec_decode_num_accepted_tokens"] > 0  # every interval was logged
    assert sum(drafted) == stats["spec_decode_num_draft_tokens"]
    assert all("CPU KV cache usage:" in line for line in engine_lines)


def test_disable_log_stats_logs_nothing(tiny_model_dir, caplog):
    llm = LLM(model=str(tiny_model_dir), dtype="float32", speculative_config=SPEC, disable_log_stats=True)
    assert llm.llm_engine.stats.logger is None
    with caplog.at_level(logging.DEBUG, logger="draftwise"):
        llm.generate(BURST, greedy(40, ignore_eos=True), use_tqdm=False)
        llm.llm_engine.stats.record_idle(llm.llm_engine)
    assert _log_lines(caplog, logging.DEBUG) == []
    assert one(llm.get_metrics(), "vllm:spec_decode_num_drafts").value > 0  # the metrics are still there

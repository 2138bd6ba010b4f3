"""One engine on one GGUF file in a fresh process: start-up, peak memory, prefill and decode speed.

    python benchmarks/scale_runner.py draftwise GGUF RESULT.json [--n-ctx 4096] [--threads 2]
    .venv-llamacpp/bin/python benchmarks/scale_runner.py llamacpp GGUF RESULT.json ...

``bench_scale.py`` starts it once per engine and file. Each engine holds a KV cache of ``--n-ctx``
tokens (draftwise: one sequence of ``max_model_len`` tokens). Timed from the top of the process
(imports included) to the model ready: ``startup_s``; then, on random token ids, greedy with EOS ignored:
``prefill_tps`` (a ``--prefill``-token prompt), ``decode_tps`` (``--decode`` tokens after a
16-token prompt) and ``decode_deep_tps`` (the same after ``--depth`` tokens of context); with
``--long-prefill`` / ``--long-depth``, ``prefill_long_tps`` and ``decode_long_tps`` likewise.
``peak_rss_mb`` is the process's maximum resident set at the end. The llama.cpp side runs
llama-cpp-python (its Python loop adds ~1 ms a token: ``bench_scale.py`` takes llama.cpp's
speeds from its C++ ``llama-bench`` when given one, and only start-up and memory from here, after
a warm-up that reads every weight: ``--no-speed``).
"""
from __future__ import annotations

import time

_START = time.perf_counter()

import argparse  # noqa: E402
import json  # noqa: E402
import random  # noqa: E402
import resource  # noqa: E402
from pathlib import Path  # noqa: E402


def draftwise_engine(path: str, args):
    from draftwise import LLM, SamplingParams

    llm = LLM(model=path, max_model_len=args.n_ctx, max_num_seqs=1, enable_prefix_caching=False)
    ready = time.perf_counter()
    vocab = llm.llm_engine.hf_config.vocab_size

    def run(prompt_len: int, max_tokens: int) -> tuple[float, float]:
        """(seconds to the first token, seconds of the tokens after it) of one request."""
        ids = [random.randrange(1000, vocab) for _ in range(prompt_len)]
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
        out = llm.generate({"prompt_token_ids": ids}, params, use_tqdm=False)[0]
        m = out.metrics
        return m.first_token_time - m.arrival_time, m.finished_time - m.first_token_time
    return ready, run


def llamacpp_engine(path: str, args):
    from llama_cpp import Llama

    llm = Llama(model_path=path, n_threads=args.threads, n_threads_batch=args.threads, n_ctx=args.n_ctx,
                n_batch=512, verbose=False)
    ready = time.perf_counter()
    vocab = llm.n_vocab()

    def run(prompt_len: int, max_tokens: int) -> tuple[float, float]:
        ids = [random.randrange(1000, vocab) for _ in range(prompt_len)]
        llm.reset()
        start = time.perf_counter()
        llm.eval(ids)
        first = time.perf_counter()
        for _ in range(max_tokens - 1):
            llm.eval([random.randrange(1000, vocab)])
        return first - start, time.perf_counter() - first
    return ready, run


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("engine", choices=("draftwise", "llamacpp"))
    parser.add_argument("gguf")
    parser.add_argument("out")
    parser.add_argument("--n-ctx", type=int, default=4096)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--prefill", type=int, default=1024)
    parser.add_argument("--decode", type=int, default=64)
    parser.add_argument("--depth", type=int, default=2048)
    parser.add_argument("--long-prefill", type=int, default=0, help="a second, longer prompt to time (0: none)")
    parser.add_argument("--long-depth", type=int, default=0, help="decode after this much context too (0: none)")
    parser.add_argument("--no-speed", action="store_true", help="start-up and memory only")
    args = parser.parse_args()
    random.seed(0)
    ready, run = (draftwise_engine if args.engine == "draftwise" else llamacpp_engine)(args.gguf, args)
    result = {"engine": args.engine, "gguf": args.gguf, "startup_s": ready - _START}
    run(16, 4)  # warm-up: every weight read once
    if args.no_speed:
        result["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        Path(args.out).write_text(json.dumps(result, indent=1))
        return
    prefill_s, _ = run(args.prefill, 1)
    _, decode_s = run(16, args.decode + 1)
    _, deep_s = run(args.depth, args.decode + 1) if args.depth else (0.0, 0.0)
    long_prefill_s, _ = run(args.long_prefill, 1) if args.long_prefill else (0.0, 0.0)
    _, long_s = run(args.long_depth, args.decode + 1) if args.long_depth else (0.0, 0.0)
    result.update(prefill_tps=args.prefill / prefill_s, decode_tps=args.decode / decode_s,
                  decode_deep_tps=args.decode / deep_s if deep_s else None,
                  prefill_long_tps=args.long_prefill / long_prefill_s if long_prefill_s else None,
                  decode_long_tps=args.decode / long_s if long_s else None,
                  peak_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()

"""The ``draftwise`` command line. Subcommands: ``generate``, ``serve``, ``bench``, ``make-data``, ``train-draft``.

``draftwise generate --model M --prompt "..." [--max-tokens N --temperature T ...]``
prints the generated text, then a line with the token count and speed.
``draftwise serve [MODEL] [--host H --port P -sc JSON ...]`` runs the
OpenAI-compatible server (see ``draftwise.server``). ``draftwise bench ...`` measures
speculative methods and depths on a workload (see ``draftwise.bench``).
``draftwise make-data`` / ``draftwise train-draft`` train a drafter (see ``draftwise.train``).
Bad values exit with status 2 and one line saying what is wrong.
"""
from __future__ import annotations

import argparse
import sys
import time

from .config import RequestLimits
from .validate import add_compilation_args, compilation_flag, json_flag


SERVE_DECODE_STALL_FACTOR = 3.0  # a server's streams: ITL p99 within ~3x p50 while prompts arrive


def _stall_factor(text: str) -> float | None:
    if text.lower() in ("off", "none"):
        return None
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a number >= 1 or 'off', got {text!r}") from None


def _add_engine_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=None,
                        help="local HF directory, .gguf file, or a bundled name (default: SmolLM2-135M-Instruct)")
    parser.add_argument("--dtype", default="auto", help="auto, float32, bfloat16, float16")
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda")
    parser.add_argument("--max-model-len", type=int, default=None)
    parser.add_argument("--max-num-seqs", type=int, default=256)
    parser.add_argument("--max-num-batched-tokens", type=int, default=None)
    parser.add_argument("--kv-cache-memory-bytes", type=int, default=None)
    parser.add_argument("--tensor-parallel-size", "-tp", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--speculative-config", "-sc", default=None, help="JSON speculative config")
    parser.add_argument("--additional-config", default=None, help="JSON additional config")
    add_compilation_args(parser)
    parser.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=None,
                        help="share the KV of common prompt prefixes between requests (default: on)")
    parser.add_argument("--async-scheduling", action="store_true",
                        help="build the previous step's outputs on a worker thread while each forward runs")
    parser.add_argument("--decode-stall-factor", type=_stall_factor, default=None, metavar="FACTOR|off",
                        help="while sequences decode, bound the prefill joining a step so the step takes at most "
                             f"this many times the decode-only step (default: {SERVE_DECODE_STALL_FACTOR:g} for "
                             "serve, off elsewhere)")
    limits = parser.add_argument_group("per-request caps (a request past them is refused, 400 on the server)")
    limits.add_argument("--max-n", type=int, default=RequestLimits.max_n, help="choices (sequences) per request")
    limits.add_argument("--max-logprobs", type=int, default=RequestLimits.max_logprobs,
                        help="top logprobs per token (vLLM's flag)")
    limits.add_argument("--max-stop-strings", type=int, default=RequestLimits.max_stop_strings,
                        help="stop strings per request")
    limits.add_argument("--max-stop-string-length", type=int, default=RequestLimits.max_stop_string_length,
                        help="characters per stop string")


def engine_kwargs(args: argparse.Namespace) -> dict:
    """``LLM``/``EngineConfig`` keyword arguments from the engine flags (JSON flags parsed)."""
    return dict(model=args.model, dtype=args.dtype, device=args.device, seed=args.seed,
                max_model_len=args.max_model_len, max_num_seqs=args.max_num_seqs,
                max_num_batched_tokens=args.max_num_batched_tokens,
                kv_cache_memory_bytes=args.kv_cache_memory_bytes, tensor_parallel_size=args.tensor_parallel_size,
                speculative_config=json_flag("--speculative-config", args.speculative_config),
                additional_config=json_flag("--additional-config", args.additional_config),
                compilation_config=compilation_flag(args.compilation_config), enforce_eager=args.enforce_eager,
                async_scheduling=args.async_scheduling, enable_prefix_caching=args.enable_prefix_caching,
                decode_stall_factor=args.decode_stall_factor, max_n=args.max_n, max_logprobs=args.max_logprobs,
                max_stop_strings=args.max_stop_strings, max_stop_string_length=args.max_stop_string_length)


def _add_sampling_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--top-k", type=int, default=0)
    parser.add_argument("--min-p", type=float, default=0.0)
    parser.add_argument("--sampling-seed", type=int, default=None)
    parser.add_argument("--ignore-eos", action="store_true")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="draftwise", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="generate text for one prompt and print the speed")
    _add_engine_args(gen)
    _add_sampling_args(gen)
    gen.add_argument("--prompt", required=True)
    gen.add_argument("--chat", action="store_true", help="apply the model's chat template to the prompt")
    serve = sub.add_parser("serve", help="run the OpenAI-compatible HTTP server")
    serve.add_argument("model_tag", nargs="?", default=None, metavar="MODEL", help="same as --model")
    _add_engine_args(serve)
    serve.set_defaults(decode_stall_factor=SERVE_DECODE_STALL_FACTOR)
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--served-model-name", nargs="+", default=None,
                       help="name(s) clients use in 'model' (default: the model argument)")
    from .server.options import add_server_args

    add_server_args(serve)
    serve.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    from .bench import add_bench_args

    add_bench_args(sub.add_parser("bench", help="measure speculative methods and depths on a workload"))
    from .train.cli import add_make_data_args, add_train_args

    add_make_data_args(sub.add_parser("make-data", help="generate drafter training data with the target"))
    add_train_args(sub.add_parser("train-draft", help="train an eagle3/eagle/medusa/mtp drafter"))
    return parser


def cmd_generate(args: argparse.Namespace) -> int:
    from . import LLM, SamplingParams

    llm = LLM(**engine_kwargs(args))
    params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p,
                            top_k=args.top_k, min_p=args.min_p, seed=args.sampling_seed,
                            ignore_eos=args.ignore_eos)
    start = time.perf_counter()
    if args.chat:
        out = llm.chat([{"role": "user", "content": args.prompt}], params, use_tqdm=False)[0]
    else:
        out = llm.generate(args.prompt, params, use_tqdm=False)[0]
    elapsed = time.perf_counter() - start
    completion = out.outputs[0]
    print(completion.text)
    num = len(completion.token_ids)
    print(f"\n[{num} tokens in {elapsed:.2f} s: {num / elapsed:.1f} tokens/s, "
          f"finish_reason={completion.finish_reason}]", file=sys.stderr)
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    from .server.launch import run_server

    if args.model_tag is not None:
        if args.model is not None and args.model != args.model_tag:
            raise ValueError(f"two models given: {args.model_tag!r} and --model {args.model!r}")
        args.model = args.model_tag
    return run_server(args, engine_kwargs(args))


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "bench":
            from .bench import cmd_bench

            return cmd_bench(args, sys.argv[1:] if argv is None else argv)
        from .train.cli import cmd_make_data, cmd_train_draft

        commands = {"generate": cmd_generate, "serve": cmd_serve, "make-data": cmd_make_data,
                    "train-draft": cmd_train_draft}
        return commands[args.command](args)
    except ValueError as exc:  # bad user input: one clear line, no traceback
        print(f"draftwise: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

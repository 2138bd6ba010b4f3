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
import dataclasses
import sys
import time

from .engine.arg_utils import EngineArgs


SERVE_DECODE_STALL_FACTOR = 2.75  # a server's streams: keeps ITL p99 within 3x p50 while prompts arrive
# (the bound holds at the mixed steps' 95th percentile, so the factor sits a margin below 3)
# vLLM EngineArgs names that are serve's own flags (the server reads them, not the engine)
SERVER_OWN_ARGS = ("served_model_name", "log_level", "per_request_spec_decode_metrics")


def engine_kwargs(args: argparse.Namespace) -> dict:
    """``LLM`` keyword arguments from the engine flags (one per ``EngineArgs`` field, JSON flags parsed)."""
    kwargs = dataclasses.asdict(EngineArgs.from_cli_args(args))
    if getattr(args, "command", None) == "serve":
        for name in SERVER_OWN_ARGS:
            del kwargs[name]
    return kwargs


def with_dashes(argv: list[str]) -> list[str]:
    """``--foo_bar`` (and ``--foo_bar=x``) spelled ``--foo-bar``, as vLLM's parser allows."""
    out = []
    for arg in argv:
        if arg.startswith("--"):
            name, sep, value = arg.partition("=")
            arg = name.replace("_", "-") + sep + value
        out.append(arg)
    return out


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
    EngineArgs.add_cli_args(gen)
    _add_sampling_args(gen)
    gen.add_argument("--prompt", required=True)
    gen.add_argument("--chat", action="store_true", help="apply the model's chat template to the prompt")
    serve = sub.add_parser("serve", help="run the OpenAI-compatible HTTP server")
    serve.add_argument("model_tag", nargs="?", default=None, metavar="MODEL", help="same as --model")
    serve.add_argument("--served-model-name", nargs="+", default=None,
                       help="name(s) clients use in 'model' (default: the model argument)")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    from .server.options import add_server_args, add_vllm_server_flags

    add_server_args(serve)
    serve.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    EngineArgs.add_cli_args(serve)  # (after the server's own flags: vLLM's of the same name are skipped)
    add_vllm_server_flags(serve)
    serve.set_defaults(decode_stall_factor=SERVE_DECODE_STALL_FACTOR)
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
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(with_dashes(argv))
    try:
        if args.command == "bench":
            from .bench import cmd_bench

            return cmd_bench(args, argv)
        from .train.cli import cmd_make_data, cmd_train_draft

        commands = {"generate": cmd_generate, "serve": cmd_serve, "make-data": cmd_make_data,
                    "train-draft": cmd_train_draft}
        return commands[args.command](args)
    except ValueError as exc:  # bad user input: one clear line, no traceback
        print(f"draftwise: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

"""The ``draftwise`` command line. Subcommands: ``generate``.

``draftwise generate --model M --prompt "..." [--max-tokens N --temperature T ...]``
prints the generated text, then a line with the token count and speed.
"""
from __future__ import annotations

import argparse
import json
import sys
import time


def _add_engine_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=None,
                        help="local HF directory, .gguf file, or a bundled name (default: SmolLM2-135M-Instruct)")
    parser.add_argument("--dtype", default="auto", help="auto, float32, bfloat16, float16")
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda")
    parser.add_argument("--max-model-len", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--speculative-config", "-sc", default=None, help="JSON speculative config")


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
    return parser


def cmd_generate(args: argparse.Namespace) -> int:
    from . import LLM, SamplingParams

    spec = json.loads(args.speculative_config) if args.speculative_config else None
    llm = LLM(model=args.model, dtype=args.dtype, device=args.device, seed=args.seed,
              max_model_len=args.max_model_len, speculative_config=spec)
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


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return {"generate": cmd_generate}[args.command](args)
    except ValueError as exc:  # bad user input: one clear line, no traceback
        print(f"draftwise: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

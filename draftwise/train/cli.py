"""Command-line front ends of ``draftwise make-data`` and ``draftwise train-draft``."""
from __future__ import annotations

import argparse
import json

from .make_data import SOURCES


def add_make_data_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=None, help="target model (default: SmolLM2-135M-Instruct)")
    parser.add_argument("--prompts", required=True,
                        help=f"comma-separated sources: {', '.join(SOURCES)} or FILE.jsonl")
    parser.add_argument("--out", required=True, help="new directory for the data")
    parser.add_argument("--max-tokens", type=int, default=256, help="answer length cap per prompt")
    parser.add_argument("--num-samples", type=int, default=None,
                        help="use at most this many prompts; with magpie, the number of conversations (1000)")
    parser.add_argument("--max-num-seqs", type=int, default=64, help="sequences generated in one batch")
    parser.add_argument("--chunk-size", type=int, default=256,
                        help="prompts per resumable chunk (a restarted run goes on after the last finished one)")
    parser.add_argument("--follow-up-fraction", type=float, default=0.3,
                        help="magpie: share of conversations that get a second user turn")
    parser.add_argument("--magpie-opener-fraction", type=float, default=0.0,
                        help="magpie: share of first user turns begun with an opening word (Write, Explain, ...)")
    parser.add_argument("--hidden-dtype", default="bfloat16", help="bfloat16, float16 or float32 on disk")
    parser.add_argument("--layer-ids", default=None,
                        help="comma-separated target layer ids to save (default: 2,L//2,L-3,L)")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--seed", type=int, default=0)


def cmd_make_data(args: argparse.Namespace) -> int:
    from .make_data import make_data

    layer_ids = _int_list("--layer-ids", args.layer_ids) if args.layer_ids else None
    manifest = make_data(args.model, [s for s in args.prompts.split(",") if s], args.out, args.max_tokens,
                         args.num_samples, args.max_num_seqs, layer_ids, args.seed, args.dtype, args.device,
                         args.chunk_size, args.hidden_dtype, args.follow_up_fraction, args.magpie_opener_fraction)
    print(json.dumps({k: v for k, v in manifest.items() if k != "samples"}))
    return 0


def add_train_args(parser: argparse.ArgumentParser) -> None:
    from .loop import TrainOptions

    d = TrainOptions(method="", data="", out="")
    parser.add_argument("--model", default=None, help="target model (default: the one the data was made with)")
    parser.add_argument("--method", required=True, help="eagle3, eagle, medusa or mtp")
    parser.add_argument("--data", required=True, help="a directory written by make-data")
    parser.add_argument("--out", required=True, help="the drafter directory (public layout of the method)")
    parser.add_argument("--epochs", type=int, default=d.epochs)
    parser.add_argument("--lr", type=float, default=d.lr)
    parser.add_argument("--batch-tokens", type=int, default=d.batch_tokens, help="padded tokens per batch")
    parser.add_argument("--ttt-steps", type=int, default=d.ttt_steps,
                        help="draft steps unrolled in training (training-time test)")
    parser.add_argument("--eval-steps", type=int, default=d.eval_steps, help="depths K of the held-out estimate")
    parser.add_argument("--draft-vocab-size", type=int, default=d.draft_vocab_size,
                        help="draft vocabulary size (the most, with --draft-vocab-coverage)")
    parser.add_argument("--draft-vocab-coverage", type=float, default=None,
                        help="pick the fewest most frequent tokens covering this share of answer tokens, e.g. 0.98")
    parser.add_argument("--num-heads", type=int, default=d.num_heads, help="medusa heads")
    parser.add_argument("--num-head-layers", type=int, default=d.num_head_layers, help="residual blocks per head")
    parser.add_argument("--held-out-fraction", type=float, default=d.held_out_fraction)
    parser.add_argument("--warmup-steps", type=int, default=d.warmup_steps)
    parser.add_argument("--export-dtype", default=d.export_dtype, help="bfloat16, float16 or float32")
    parser.add_argument("--aux-layer-ids", default=None,
                        help="eagle3: comma-separated target layers it reads (default 2,L//2,L-3; L = the last output)")
    parser.add_argument("--precision", default=d.precision,
                        help="matrix products in float32, bfloat16 (autocast) or auto (measured at start-up)")
    parser.add_argument("--device", default=d.device, help="cpu, cuda, cuda:N or auto (cuda where present)")
    parser.add_argument("--seed", type=int, default=d.seed)
    parser.add_argument("--resume", action="store_true", help="continue the run saved in --out")


def cmd_train_draft(args: argparse.Namespace) -> int:
    from .loop import TrainOptions, train_draft

    keys = ("method", "data", "out", "model", "epochs", "lr", "batch_tokens", "ttt_steps", "eval_steps",
            "draft_vocab_size", "draft_vocab_coverage", "num_heads", "num_head_layers", "held_out_fraction",
            "warmup_steps", "seed", "resume", "export_dtype", "precision", "device")
    aux = _int_list("--aux-layer-ids", args.aux_layer_ids) if args.aux_layer_ids else None
    summary = train_draft(TrainOptions(**{k: getattr(args, k) for k in keys}, aux_layer_ids=aux))
    last = summary["history"][-1] if summary["history"] else {}
    print(json.dumps({"out": args.out, **{k: v for k, v in summary.items() if k != "history"}, "last_epoch": last}))
    return 0


def _int_list(flag: str, text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"{flag} must be comma-separated integers, got {text!r}") from None

"""``draftwise bench`` flags, validated, and the configurations they expand to.

``add_bench_args(parser)`` declares the flags; comma-separated lists are parsed by argparse
types, so a malformed list is an argparse error naming the flag (exit status 2).
``BenchOptions.from_args(args)`` checks what needs several flags at once and raises
``ValueError`` naming the flag, before any model is loaded. ``configurations(options)``
expands ``--methods`` x ``--num-speculative-tokens``: ``none`` once, every other method once
per depth with its ``--speculative-config`` options merged in, each checked by ``EngineConfig``
as ``LLM`` checks it (so a ``draft_model`` without ``model`` fails at once, not after an hour).

Example: ``--methods none,ngram --num-speculative-tokens 1,3`` gives ``none``, ``ngram K=1``,
``ngram K=3``.

A ``--speculative-config`` with a ``"label"`` defines a variant under that name, usable in
``--methods`` beside the methods themselves (``-sc '{"method": "eagle3", "label": "eagle3+suffix",
"enable_suffix_decoding": true, ...}' --methods none,eagle3+suffix``); one with its own
``num_speculative_tokens`` runs at that depth only, whatever ``--num-speculative-tokens`` says.
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib.util
from dataclasses import dataclass, field
from pathlib import Path

from ..config import EngineConfig
from ..spec_decode.interface import registered_methods
from ..validate import add_compilation_args, compilation_flag, json_flag

COMPARE_CHOICES = ("transformers",)


@dataclass(slots=True, frozen=True)
class Configuration:
    """One engine setting under test: ``none`` (no speculation) or a method at one depth, and with
    structured outputs whether the grammar drafts the tokens it forces (None: no constraints)."""
    method: str
    num_speculative_tokens: int | None = None
    speculative_config: dict | None = None  # what LLM(speculative_config=...) gets
    grammar_drafts: bool | None = None
    name: str | None = None  # a --speculative-config "label" (None: the method's name)

    @property
    def label(self) -> str:
        name = self.name or self.method
        label = name if self.num_speculative_tokens is None else f"{name} K={self.num_speculative_tokens}"
        return label + {None: "", True: " +grammar", False: ""}[self.grammar_drafts]


@dataclass(slots=True)
class BenchOptions:
    workloads: list[str]
    methods: list[str]
    depths: list[int]
    concurrency: list[int]
    out: Path
    model: str | None = None
    dtype: str = "auto"
    device: str = "auto"
    max_tokens: int = 256
    num_prompts: int = 4
    temperature: float = 0.0
    seed: int = 0
    min_repeats: int = 2
    max_repeats: int = 5
    max_rel_error: float = 0.03
    kv_cache_memory_bytes: int | None = None
    additional_config: dict | None = None  # what LLM(additional_config=...) gets, for every configuration
    compilation_config: dict | int | None = None  # likewise LLM(compilation_config=...)
    enforce_eager: bool = False
    compare: list[str] = field(default_factory=list)
    spec_options: dict[str, dict] = field(default_factory=dict)  # method or label -> its speculative_config keys
    structured_outputs: bool = False  # constrain each prompt that has a JSON schema (the json workload) to it
    compact_json: bool = False  # with structured_outputs: no free whitespace (disable_any_whitespace)
    grammar_drafts: list[str] = field(default_factory=lambda: ["on"])  # with structured outputs: on, off or both

    def __post_init__(self) -> None:
        known = ["none", *registered_methods(), *self.spec_options]
        for method in self.methods:
            if method not in known:
                raise ValueError(f"--methods: unknown method {method!r}; choose from {', '.join(dict.fromkeys(known))} "
                                 "(or define a label with --speculative-config)")
        for name in self.spec_options:
            if name not in self.methods:
                raise ValueError(f"--speculative-config for {name!r}, which is not in --methods {self.methods}")
        if self.max_tokens < 1 or self.num_prompts < 1:
            raise ValueError("--max-tokens and --num-prompts must be >= 1")
        if self.num_prompts < max(self.concurrency):
            raise ValueError(f"--concurrency {max(self.concurrency)} needs at least as many prompts: "
                             f"--num-prompts is {self.num_prompts} (each request in flight is a different prompt)")
        if self.temperature < 0:
            raise ValueError(f"--temperature must be >= 0, got {self.temperature}")
        if not 1 <= self.min_repeats <= self.max_repeats:
            raise ValueError(f"need 1 <= --min-repeats <= --max-repeats, got {self.min_repeats} and {self.max_repeats}")
        if self.max_rel_error < 0:
            raise ValueError(f"--max-rel-error must be >= 0, got {self.max_rel_error}")
        for value in self.compare:
            if value not in COMPARE_CHOICES:
                raise ValueError(f"--compare: unknown value {value!r}; choose from {', '.join(COMPARE_CHOICES)}")
        if not self.grammar_drafts or any(value not in ("on", "off") for value in self.grammar_drafts):
            raise ValueError(f"--grammar-drafts takes on, off or on,off; got {','.join(self.grammar_drafts)}")
        if self.compact_json and not self.structured_outputs:
            raise ValueError("--compact-json needs --structured-outputs")
        if self.structured_outputs and self.compare:
            raise ValueError("--structured-outputs cannot be compared with transformers (it has no constraints)")
        if "transformers" in self.compare and importlib.util.find_spec("transformers") is None:
            raise ValueError("--compare transformers needs the transformers package: pip install transformers")

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "BenchOptions":
        return cls(workloads=args.workload, methods=args.methods, depths=args.num_speculative_tokens,
                   concurrency=args.concurrency, out=Path(args.out), model=args.model, dtype=args.dtype,
                   device=args.device, max_tokens=args.max_tokens, num_prompts=args.num_prompts,
                   temperature=args.temperature, seed=args.seed, min_repeats=args.min_repeats,
                   max_repeats=args.max_repeats, max_rel_error=args.max_rel_error,
                   kv_cache_memory_bytes=args.kv_cache_memory_bytes, compare=args.compare or [],
                   additional_config=json_flag("--additional-config", args.additional_config),
                   compilation_config=compilation_flag(args.compilation_config), enforce_eager=args.enforce_eager,
                   spec_options=_spec_options(args.speculative_config or []),
                   structured_outputs=args.structured_outputs, grammar_drafts=args.grammar_drafts,
                   compact_json=args.compact_json)


def configurations(options: BenchOptions) -> list[Configuration]:
    found = []
    for method in options.methods:
        if method == "none":
            found.append(Configuration("none"))
            continue
        extra = dict(options.spec_options.get(method, {}))
        name = method if extra.get("method", method) != method else None
        spec_method = extra.pop("method", method)
        own_depth = extra.pop("num_speculative_tokens", None)
        for depth in options.depths if own_depth is None else [own_depth]:
            raw = {**extra, "method": spec_method, "num_speculative_tokens": depth}
            EngineConfig(speculative_config=raw)  # raises ValueError naming the bad key
            found.append(Configuration(spec_method, depth, raw, name=name))
    if options.structured_outputs:
        found = [dataclasses.replace(config, grammar_drafts=value == "on")
                 for config in found for value in options.grammar_drafts]
    return found


def _spec_options(values: list[str]) -> dict[str, dict]:
    """``{"method": m, key: value, ...}`` JSON objects -> ``{m: {key: value}}``, one per method; one
    with a ``"label"`` -> ``{label: {"method": m, key: value}}``, a variant of its own."""
    found: dict[str, dict] = {}
    for text in values:
        raw = json_flag("--speculative-config", text)
        if not isinstance(raw.get("method"), str):
            raise ValueError(f'--speculative-config must be a JSON object with a "method", got {text!r}')
        label = raw.pop("label", None)
        if label is not None and (not isinstance(label, str) or not label or label == "none" or "," in label):
            raise ValueError(f'--speculative-config: "label" must be a name without commas, other than none; '
                             f"got {label!r}")
        name = label or raw.pop("method")
        if name in found:
            raise ValueError(f"--speculative-config given twice for {name!r}")
        found[name] = raw
    return found


# ---- argparse -----------------------------------------------------------------------------


def _list_type(convert, minimum: int | None = None):
    def parse(text: str) -> list:
        items = [item.strip() for item in text.split(",") if item.strip()]
        try:
            values = [convert(item) for item in items]
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a comma-separated list of {convert.__name__}s, "
                                             f"got {text!r}") from None
        if not values:
            raise argparse.ArgumentTypeError("expected at least one value")
        if minimum is not None and min(values) < minimum:
            raise argparse.ArgumentTypeError(f"values must be >= {minimum}, got {text!r}")
        return list(dict.fromkeys(values))  # drop repeats, keep order
    return parse


def add_bench_args(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--model", default=None, help="local HF directory, .gguf file, or a bundled name (default: SmolLM2-135M)")
    add("--dtype", default="auto", help="auto, float32, bfloat16, float16")
    add("--device", default="auto", help="auto, cpu, cuda")
    add("--workload", type=_list_type(str), default=["code-edit"], metavar="W[,W...]",
        help="humaneval, code-edit, json, chat or a FILE.jsonl; comma-separated for several")
    add("--methods", type=_list_type(str), default=["none", "ngram", "suffix"], metavar="M[,M...]",
        help="none (no speculation), ngram, suffix, draft_model, ... (default: none,ngram,suffix)")
    add("--num-speculative-tokens", type=_list_type(int, 1), default=[1, 3, 5, 7], metavar="K[,K...]",
        help="depths to try for every speculative method (default: 1,3,5,7)")
    add("--speculative-config", "-sc", action="append", metavar="JSON",
        help='extra keys for one method, e.g. \'{"method": "draft_model", "model": "DIR"}\'; repeatable')
    add("--max-tokens", type=int, default=256)
    add("--num-prompts", type=int, default=4, help="prompts per workload")
    add("--concurrency", type=_list_type(int, 1), default=[1], metavar="C[,C...]",
        help="requests in flight at once; one measurement per level (default: 1)")
    add("--temperature", type=float, default=0.0, help="0 = greedy; > 0 samples with a fixed seed per prompt")
    add("--out", default="bench_out", help="folder for results.json and the plots (default: bench_out)")
    add("--compare", type=_list_type(str), default=None, metavar="transformers",
        help="add Hugging Face transformers' generate and prompt lookup on the same weights")
    add("--min-repeats", type=int, default=2, help="passes per measurement at least (default: 2)")
    add("--max-repeats", type=int, default=5, help="passes per measurement at most (default: 5)")
    add("--max-rel-error", type=float, default=0.03,
        help="stop repeating once the standard error of the passes' mean tokens/s is at most this share "
             "of the mean (default: 0.03)")
    add("--seed", type=int, default=0, help="workload order and sampling seeds")
    add("--kv-cache-memory-bytes", type=int, default=None)
    add("--structured-outputs", action="store_true",
        help="constrain each prompt that has a JSON schema (the json workload) to it")
    add("--compact-json", action="store_true",
        help="with --structured-outputs: JSON without free whitespace (disable_any_whitespace)")
    add("--grammar-drafts", type=_list_type(str), default=["on"], metavar="on|off|on,off",
        help="with --structured-outputs: whether the grammar drafts the tokens it forces; on,off runs both")
    add("--additional-config", default=None, metavar="JSON",
        help='engine options for every configuration, e.g. \'{"gguf_weights": "dequantized"}\'')
    add_compilation_args(parser)


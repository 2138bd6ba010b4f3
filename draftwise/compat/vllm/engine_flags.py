"""The engine's command-line flags: one per ``EngineArgs`` field (``draftwise generate`` and ``serve``).

``add_engine_flags`` adds draftwise's own arguments with their help; ``add_vllm_flags`` adds the
rest of vLLM's ``EngineArgs`` names in a group of their own, typed from ``engine_args.py``
(booleans as ``--x`` / ``--no-x``, lists as several values, dicts as JSON) and documented with what
they do here (``arg_rules.py``). ``parse_json_flags`` turns the JSON-valued flags' text into
objects (``ValueError`` naming the flag).
"""
from __future__ import annotations

import argparse
import json

from ...validate import add_compilation_args, compilation_flag, json_flag
from .arg_rules import ACCEPTED, FRONTEND_ACCEPTED, noop_reason
from .engine_args import VLLM_ENGINE_ARGS, VLLM_FRONTEND_ARGS

OWN_JSON_FLAGS = ("speculative_config", "additional_config", "kv_transfer_config", "override_generation_config")


def _stall_factor(text: str) -> float | None:
    if text.lower() in ("off", "none"):
        return None
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a number >= 1 or 'off', got {text!r}") from None


def add_engine_flags(parser: argparse.ArgumentParser, limits) -> None:
    """draftwise's own engine flags; ``limits`` (``config.RequestLimits()``) gives the per-request caps' defaults."""
    add = parser.add_argument
    add("--model", default=None,
        help="local HF directory, .gguf file, or a bundled name (default: SmolLM2-135M-Instruct)")
    add("--tokenizer", default=None, help="tokenizer directory (default: the model's)")
    add("--dtype", default="auto", help="auto, float32, bfloat16, float16")
    add("--quantization", "-q", default=None,
        help="weight-only quantization at load on CPU: q8_0, q4_0, q4_1 (a GGUF model keeps its own blocks)")
    add("--device", default="auto", help="auto, cpu, cuda")
    add("--max-model-len", type=int, default=None)
    add("--max-num-seqs", type=int, default=256)
    add("--max-num-batched-tokens", type=int, default=None)
    add("--kv-cache-memory-bytes", type=int, default=None)
    add("--gpu-memory-utilization", type=float, default=None,
        help="on a GPU: the share of its memory for the weights and the KV cache")
    add("--tensor-parallel-size", "-tp", type=int, default=1,
        help="shard the model over this many ranks (worker processes, or Ray actors)")
    add("--distributed-executor-backend", default=None, choices=("mp", "ray", "uni"),
        help="how the tensor-parallel ranks start: mp (processes here, the default), ray (a Ray cluster)")
    add("--seed", type=int, default=0)
    add("--speculative-config", "-sc", default=None, help="JSON speculative config")
    add("--additional-config", default=None, help="JSON additional config")
    add("--kv-transfer-config", default=None, help="JSON KV transfer config (extract_hidden_states)")
    add("--generation-config", default="auto",
        help="default sampling parameters: 'auto' (the model's generation_config.json), 'vllm' (none), or a "
             "directory holding one")
    add("--override-generation-config", default=None, help="JSON: sampling defaults that win over the model's")
    add_compilation_args(parser)
    add("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=None,
        help="share the KV of common prompt prefixes between requests (default: on)")
    add("--async-scheduling", action=argparse.BooleanOptionalAction, default=False,
        help="build the previous step's outputs on a worker thread while each forward runs")
    add("--disable-log-stats", action=argparse.BooleanOptionalAction, default=False,
        help="no periodic throughput and acceptance log lines")
    add("--decode-stall-factor", type=_stall_factor, default=None, metavar="FACTOR|off",
        help="while sequences decode, bound the prefill joining a step so the step takes at most this many "
             "times the decode-only step (default: 2.75 for serve, off elsewhere)")
    caps = parser.add_argument_group("per-request caps (a request past them is refused, 400 on the server)")
    caps.add_argument("--max-n", type=int, default=limits.max_n, help="choices (sequences) per request")
    caps.add_argument("--max-logprobs", type=int, default=limits.max_logprobs,
                      help="top logprobs per token (vLLM's flag)")
    caps.add_argument("--max-stop-strings", type=int, default=limits.max_stop_strings,
                      help="stop strings per request")
    caps.add_argument("--max-stop-string-length", type=int, default=limits.max_stop_string_length,
                      help="characters per stop string")


def add_vllm_flags(parser: argparse.ArgumentParser, names: list[str], frontend: bool = False) -> None:
    """One flag per vLLM argument in ``names`` (those a parser already has are left as they are); of
    vLLM's server (``VLLM_FRONTEND_ARGS``) with ``frontend``."""
    table = VLLM_FRONTEND_ARGS if frontend else VLLM_ENGINE_ARGS
    group = parser.add_argument_group(f"vLLM {'server' if frontend else 'engine'} arguments (accepted as vLLM "
                                      "does; docs/vllm-compatibility.md)")
    for name in names:
        flag = "--" + name.replace("_", "-")
        if flag in parser._option_string_actions:
            continue
        default, kind, _ = table[name]
        group.add_argument(flag, default=default, help=_help(name, frontend), **_typing(kind))


def _typing(kind) -> dict:
    if kind == "bool":
        return {"action": argparse.BooleanOptionalAction}
    if kind in ("int", "float", "str"):
        return {"type": {"int": int, "float": float, "str": str}[kind]}
    if kind == "list":
        return {"nargs": "*", "type": _scalar}
    if isinstance(kind, tuple):
        return {"type": type(kind[0]), "choices": kind}
    return {"type": str, "metavar": "JSON"}  # dict / any: parse_json_flags reads it


def _help(name: str, frontend: bool = False) -> str:
    accepted = FRONTEND_ACCEPTED if frontend else ACCEPTED
    if name in accepted:
        allowed, why = accepted[name]
        return f"only {', '.join(map(repr, allowed))} here: {why}"
    return f"no effect here: {noop_reason(name)}"


def _scalar(text: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def parse_json_flags(values: dict) -> dict:
    """``values`` (name -> flag value) with the JSON flags' text parsed."""
    out = dict(values)
    for name, value in values.items():
        if not isinstance(value, str):
            continue
        flag = "--" + name.replace("_", "-")
        kind = _vllm_kind(name)
        if name == "compilation_config":
            out[name] = compilation_flag(value)
        elif name in OWN_JSON_FLAGS or kind == "dict":
            out[name] = json_flag(flag, value)
        elif kind == "any":
            out[name] = _scalar(value)
    return out


def _vllm_kind(name: str):
    """The kind vLLM gives ``name`` (an engine or a server argument), None for none of vLLM's."""
    entry = VLLM_ENGINE_ARGS.get(name) or VLLM_FRONTEND_ARGS.get(name)
    return entry[1] if entry else None

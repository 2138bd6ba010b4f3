"""Checks shared by every config: ``SpeculativeConfig``, the proposers' ``Options``, the verify
config, and the command line's JSON-object flags and compilation flags (``-O``).

Each raises ``ValueError`` naming the key (under ``prefix``, by default
``speculative_config``) or the flag, the value and what is allowed.

``as_bool`` / ``read_bools`` are the one place a config's switches are read the way vLLM's
(pydantic) configs read them: ``"False"``, ``"true"``, ``"yes"``, ``1``, ``"0"`` ... become bools.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import types
import typing

PREFIX = "speculative_config"


def check_int(key: str, value, lo: int, hi: int | None = None, prefix: str = PREFIX) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < lo or (hi is not None and value > hi):
        allowed = f"an int >= {lo}" if hi is None else f"an int in [{lo}, {hi}]"
        raise ValueError(f"{prefix}[{key!r}]={value!r} is invalid: must be {allowed}")


def check_float(key: str, value, lo: float, hi: float | None = None, lo_open: bool = False,
                prefix: str = PREFIX) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    ok = ok and (value > lo if lo_open else value >= lo) and (hi is None or value <= hi)
    if not ok:
        low = f"> {lo}" if lo_open else f">= {lo}"
        allowed = f"a number {low}" + (f" and <= {hi}" if hi is not None else "")
        raise ValueError(f"{prefix}[{key!r}]={value!r} is invalid: must be {allowed}")


def check_bool(key: str, value, prefix: str = PREFIX) -> None:
    if not isinstance(value, bool):
        raise ValueError(f"{prefix}[{key!r}]={value!r} is invalid: must be true or false")


# The spellings pydantic's lax mode (hence vLLM's configs) reads as a bool, compared lower-cased.
TRUE_STRINGS = ("1", "on", "t", "true", "y", "yes")
FALSE_STRINGS = ("0", "off", "f", "false", "n", "no")


def as_bool(key: str, value, prefix: str = PREFIX) -> bool:
    """``value`` read as vLLM reads a boolean: a bool, 0 / 1, or one of ``TRUE_STRINGS`` /
    ``FALSE_STRINGS`` in any case ("False", "true", "YES"); anything else raises naming ``key``."""
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.lower() in TRUE_STRINGS + FALSE_STRINGS:
        return value.lower() in TRUE_STRINGS
    raise ValueError(f"{prefix}[{key!r}]={value!r} is invalid: must be true or false (also read: 0 / 1 and the "
                     f"strings {list(TRUE_STRINGS + FALSE_STRINGS)}, in any case)")


def bool_fields(cls) -> list[str]:
    """The fields of dataclass ``cls`` typed ``bool`` or ``bool | None``."""
    hints = typing.get_type_hints(cls)
    return [f.name for f in dataclasses.fields(cls) if _is_bool_type(hints.get(f.name))]


def _is_bool_type(hint) -> bool:
    if hint is bool:
        return True
    args = typing.get_args(hint)
    return typing.get_origin(hint) in (typing.Union, types.UnionType) and bool in args and \
        set(args) <= {bool, type(None)}


def read_bools(cls, values: dict, prefix: str = PREFIX) -> dict:
    """``values`` (keyword arguments of dataclass ``cls``) with those of its bool fields read by
    ``as_bool``; ``None`` stays ``None`` where the field allows it."""
    out, hints = dict(values), typing.get_type_hints(cls)
    for name in bool_fields(cls):
        if name in out and not (out[name] is None and type(None) in typing.get_args(hints[name])):
            out[name] = as_bool(name, out[name], prefix)
    return out


def check_choice(key: str, value, choices, prefix: str = PREFIX) -> None:
    if value not in choices:
        raise ValueError(f"{prefix}[{key!r}]={value!r} is invalid; allowed: {list(choices)}")


def parse_json(name: str, text: str):
    """``text`` parsed as JSON; ValueError names ``name`` (a flag or a config) and quotes the text."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{name} is not valid JSON ({exc.msg}): {text!r}") from None


def json_flag(flag: str, text: str | None) -> dict | None:
    """A JSON-object flag (``--speculative-config`` etc.) parsed; ValueError names the flag."""
    if text is None:
        return None
    raw = parse_json(flag, text)
    if not isinstance(raw, dict):
        raise ValueError(f"{flag} must be a JSON object, got {text!r}")
    return raw


def add_compilation_args(parser: argparse.ArgumentParser) -> None:
    """``--compilation-config`` / ``-O`` and ``--enforce-eager``, for every command that builds an engine."""
    parser.add_argument("--compilation-config", "-O", default=None,
                        help="JSON compilation config, or a mode: -O3 compiles the forward, -O0 runs eager")
    parser.add_argument("--enforce-eager", action="store_true", help="never compile the forward")


def compilation_flag(text: str | None) -> dict | int | None:
    """``-O3`` / ``-O 3`` (a compilation mode) or ``--compilation-config '{...}'`` (a JSON object)."""
    if text is not None and text.strip().isdigit():
        return int(text)
    return json_flag("--compilation-config", text)

"""Small checks shared by ``SpeculativeConfig``, the proposers' ``Options`` and the verify config.

Each raises ``ValueError`` naming the key (under ``prefix``, by default
``speculative_config``), the value and what is allowed.
"""
from __future__ import annotations

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


def check_choice(key: str, value, choices, prefix: str = PREFIX) -> None:
    if value not in choices:
        raise ValueError(f"{prefix}[{key!r}]={value!r} is invalid; allowed: {list(choices)}")

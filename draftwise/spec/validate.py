"""Small checks shared by ``SpeculativeConfig`` and the proposers' ``Options``.

Each raises ``ValueError`` naming the key, the value and what is allowed.
"""
from __future__ import annotations

PREFIX = "speculative_config"


def check_int(key: str, value, lo: int, hi: int | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < lo or (hi is not None and value > hi):
        allowed = f"an int >= {lo}" if hi is None else f"an int in [{lo}, {hi}]"
        raise ValueError(f"{PREFIX}[{key!r}]={value!r} is invalid: must be {allowed}")


def check_float(key: str, value, lo: float, hi: float | None = None, lo_open: bool = False) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    ok = ok and (value > lo if lo_open else value >= lo) and (hi is None or value <= hi)
    if not ok:
        low = f"> {lo}" if lo_open else f">= {lo}"
        allowed = f"a number {low}" + (f" and <= {hi}" if hi is not None else "")
        raise ValueError(f"{PREFIX}[{key!r}]={value!r} is invalid: must be {allowed}")


def check_bool(key: str, value) -> None:
    if not isinstance(value, bool):
        raise ValueError(f"{PREFIX}[{key!r}]={value!r} is invalid: must be true or false")


def check_choice(key: str, value, choices) -> None:
    if value not in choices:
        raise ValueError(f"{PREFIX}[{key!r}]={value!r} is invalid; allowed: {list(choices)}")

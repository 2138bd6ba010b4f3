"""``StructuredOutputsParams``: what a request's output must match (vLLM's fields and rules).

Exactly one constraint: ``json`` (a JSON schema, as a dict or its text), ``regex``, ``choice``
(a list of strings), ``grammar`` (EBNF/GBNF or Lark text), ``json_object=True`` (any JSON object)
or ``structural_tag``. Options: ``disable_any_whitespace`` (JSON without free whitespace),
``disable_additional_properties`` (objects take only their schema's properties) and
``whitespace_pattern``. Shape errors (no constraint, two of them, a wrong type) raise
``ValueError`` naming the field here; whether a schema, regex or grammar compiles is checked when
the request is added (``draftwise/structured/``).
"""
from __future__ import annotations

import json
from dataclasses import dataclass

_CONSTRAINTS = ("json", "regex", "choice", "grammar", "json_object", "structural_tag")


@dataclass
class StructuredOutputsParams:
    json: str | dict | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    disable_any_whitespace: bool = False
    disable_additional_properties: bool = False
    whitespace_pattern: str | None = None
    structural_tag: str | None = None

    def __post_init__(self) -> None:
        given = [name for name in _CONSTRAINTS if getattr(self, name) is not None]
        if len(given) != 1:
            raise ValueError(f"StructuredOutputsParams needs exactly one of {list(_CONSTRAINTS)}, got "
                             f"{given or 'none'}")
        _expect(self.json is None or isinstance(self.json, (str, dict)), "json", self.json, "a dict or its JSON text")
        for name in ("regex", "grammar", "structural_tag", "whitespace_pattern"):
            value = getattr(self, name)
            _expect(value is None or isinstance(value, str), name, value, "a string")
        _expect(self.choice is None or (isinstance(self.choice, (list, tuple)) and self.choice
                                        and all(isinstance(c, str) for c in self.choice)),
                "choice", self.choice, "a non-empty list of strings")
        _expect(self.json_object in (None, True), "json_object", self.json_object, "True (or None)")
        for name in ("disable_any_whitespace", "disable_additional_properties"):
            _expect(isinstance(getattr(self, name), bool), name, getattr(self, name), "True or False")
        if isinstance(self.json, str):
            try:
                json.loads(self.json)
            except json.JSONDecodeError as exc:
                raise ValueError(f"StructuredOutputsParams.json is not valid JSON ({exc.msg})") from None

    @property
    def kind(self) -> str:
        """The constraint given: one of ``json``, ``regex``, ``choice``, ``grammar``, ``json_object``,
        ``structural_tag``."""
        return next(name for name in _CONSTRAINTS if getattr(self, name) is not None)


def _expect(ok: bool, name: str, value, allowed: str) -> None:
    if not ok:
        text = repr(value)
        text = text if len(text) <= 80 else text[:80] + "..."
        raise ValueError(f"StructuredOutputsParams.{name}={text} is invalid: must be {allowed}")

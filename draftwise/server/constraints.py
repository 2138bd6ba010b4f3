"""A request's output constraint: ``response_format``, ``structured_outputs`` and forced tool calls
resolved into one ``StructuredOutputsParams`` (``SamplingParams.structured_outputs``).

Sources, mapped as vLLM maps them:

- OpenAI's ``response_format``: ``{"type": "json_object"}`` -> ``json_object=True``;
  ``{"type": "json_schema", "json_schema": {"name", "schema", ...}}`` -> ``json=schema``;
  vLLM's ``{"type": "structural_tag", ...}`` -> ``structural_tag=`` that object as JSON text;
  ``{"type": "text"}`` constrains nothing.
- vLLM's ``structured_outputs`` (extra body): ``StructuredOutputsParams``' fields by name
  (``json``, ``regex``, ``choice``, ``grammar``, ``json_object``, ``structural_tag``, and the options
  ``disable_any_whitespace``, ``disable_additional_properties``, ``whitespace_pattern``).
- ``tools`` with ``tool_choice`` ``"required"`` or a named function (``tools.py``).

At most one source may constrain the output: two are a 400 naming both. Options given in
``structured_outputs`` without a constraint of their own apply to the one from ``response_format``
or the tools. An error in a constraint is a 400 naming the request field it came from
(``response_format.json_schema.schema``, ``structured_outputs.regex``, ``tools``, ...): shape errors
here, compile errors when the engine adds the request (``Constraint.error_param`` reads the
``StructuredOutputsParams.<field>`` the engine's ``ValueError`` names).
"""
from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass, field
from typing import Any

from ..compat.vllm.request_fields import unknown_field
from ..structured.params import StructuredOutputsParams
from .errors import APIError
from .protocol import ResponseFormat, _SamplingRequest

KINDS = ("json", "regex", "choice", "grammar", "json_object", "structural_tag")
FIELDS = tuple(f.name for f in dataclasses.fields(StructuredOutputsParams))
_NAMED = re.compile(r"StructuredOutputsParams\.(\w+)")


@dataclass
class Source:
    """One request field that constrains the output."""

    name: str  # how a conflict names it: "response_format", "structured_outputs.regex", "tool_choice"
    fields: dict[str, Any]  # StructuredOutputsParams keyword arguments
    params: dict[str, str] = field(default_factory=dict)  # StructuredOutputsParams field -> request param
    param: str = ""  # the request param for an error that names no field (default: ``name``)


@dataclass
class Constraint:
    params: StructuredOutputsParams
    sources: dict[str, str]  # StructuredOutputsParams field -> the request param it came from
    param: str  # the request param for an error that names no field

    def error_param(self, message: str) -> str | None:
        """The request field an engine error about this constraint is about; None if the message is
        not about it."""
        if "StructuredOutputsParams" not in message:
            return None
        named = _NAMED.search(message)
        return self.sources.get(named.group(1), self.param) if named else self.param


def resolve(request: _SamplingRequest, tool_source: Source | None = None) -> Constraint | None:
    """The request's constraint, None if it asks for none; ``APIError`` (400) for a conflict or a
    malformed one."""
    own, options = _from_structured_outputs(request.structured_outputs)
    sources = [s for s in (_from_response_format(request.response_format), own, tool_source) if s is not None]
    if len(sources) > 1:
        names = " and ".join(s.name for s in sources)
        raise APIError(400, f"{names} each constrain the output; a request takes one constraint",
                       param=sources[1].name)
    if not sources and request.structured_outputs is None:
        return None
    source = sources[0] if sources else Source("structured_outputs", {})
    kwargs = {**source.fields, **options}
    params = {**source.params, **{name: f"structured_outputs.{name}" for name in options}}
    fallback = source.param or source.name
    try:
        built = StructuredOutputsParams(**kwargs)
    except ValueError as exc:
        named = _NAMED.search(str(exc))
        raise APIError(400, str(exc), param=params.get(named.group(1), fallback) if named else fallback) from None
    return Constraint(built, params, fallback)


def _from_response_format(response_format: ResponseFormat | None) -> Source | None:
    if response_format is None or response_format.type == "text":
        if response_format is not None and response_format.json_schema is not None:
            raise APIError(400, "response_format.json_schema is read only with type 'json_schema'",
                           param="response_format.json_schema")
        return None
    if response_format.type == "json_object":
        return Source("response_format", {"json_object": True}, {"json_object": "response_format"})
    if response_format.type == "json_schema":
        if response_format.json_schema is None:
            raise APIError(400, "response_format of type 'json_schema' needs its json_schema field "
                           '({"name": ..., "schema": {...}})', param="response_format.json_schema")
        param = "response_format.json_schema.schema"
        return Source("response_format", {"json": response_format.json_schema.json_schema}, {"json": param}, param)
    tag = json.dumps(response_format.model_dump(exclude_none=True))
    return Source("response_format", {"structural_tag": tag}, {"structural_tag": "response_format"})


def _from_structured_outputs(body: dict[str, Any] | None) -> tuple[Source | None, dict[str, Any]]:
    """``(the constraint it holds or None, its other fields)``: the fields named by a constraint kind go
    with it; options given alone apply to another source's constraint."""
    if body is None:
        return None, {}
    for name in body:
        if name not in FIELDS:
            raise APIError(400, unknown_field(f"structured_outputs.{name}") + f" (fields: {list(FIELDS)})",
                           param=f"structured_outputs.{name}")
    given = {name: value for name, value in body.items() if value is not None}
    kinds = [name for name in KINDS if name in given]
    if not kinds:
        return None, given
    if len(kinds) > 1:
        names = " and ".join(f"structured_outputs.{name}" for name in kinds)
        raise APIError(400, f"{names} each constrain the output; structured_outputs takes one of {list(KINDS)}",
                       param=f"structured_outputs.{kinds[1]}")
    params = {name: f"structured_outputs.{name}" for name in given}
    return Source(f"structured_outputs.{kinds[0]}", given, params, "structured_outputs"), {}

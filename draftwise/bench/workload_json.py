"""The ``json`` benchmark workload: 16 described records to return as JSON, each with its schema.

The records are data, in ``workload_json.json`` beside this module. ``load_json()`` gives one chat
prompt per record; ``BenchPrompt.schema`` is the JSON schema its answer must follow (every listed
key required, no others, strings bounded), which the benchmark passes as
``StructuredOutputsParams(json=schema)`` when it constrains outputs. A field's type is a JSON
schema type (``string``, ``integer``, ``number``, ``boolean``) or a one-element list for an array
of that type.
"""
from __future__ import annotations

import json
from pathlib import Path

MAX_STRING = 80  # characters: keeps a wandering answer bounded
MAX_ITEMS = 6
DATA = Path(__file__).with_name("workload_json.json")  # [{"kind", "record", "fields": {key: type}}]


def records() -> list[tuple[str, str, dict]]:
    """(what it describes, the description, {key: JSON type or [item type]}) per record."""
    return [(r["kind"], r["record"], r["fields"]) for r in json.loads(DATA.read_text(encoding="utf-8"))]


def schema(fields: dict) -> dict:
    """The JSON schema of a record: every key required, no other keys, strings and arrays bounded."""
    return {"type": "object", "properties": {key: _property(kind) for key, kind in fields.items()},
            "required": list(fields), "additionalProperties": False}


def _property(kind: str | list[str]) -> dict:
    if isinstance(kind, list):
        return {"type": "array", "items": _property(kind[0]), "maxItems": MAX_ITEMS}
    out = {"type": kind}
    if kind == "string":
        out["maxLength"] = MAX_STRING
    return out


def prompt_text(kind: str, record: str) -> str:
    return (f"Produce a JSON object describing {kind}: {record}. Use snake_case keys, numbers as numbers and lists "
            "where there are several values. Reply with only the JSON.")

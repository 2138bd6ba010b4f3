"""``StructuredOutputsParams`` -> the llguidance grammar text that constrains a request.

Backend: llguidance, not xgrammar. Both compile a schema in milliseconds and fill a next-token
mask in microseconds, negligible against a step. llguidance has no heavy
dependencies (xgrammar pulls triton and apache-tvm-ffi), gives the tokens the grammar forces
as token ids (``LLMatcher.compute_ff_tokens``; xgrammar only gives a jump-forward string, and
those ids are what grammar drafts are made of), and fills the masks of draft rows in one call
(``fill_next_token_bitmask_par_with_draft_tokens``).

``grammar_text(params)`` maps each constraint to a grammar:

* ``json``: the schema (a dict or its text); ``disable_any_whitespace`` allows no free whitespace
  (compact ``,`` and ``:`` separators), ``whitespace_pattern`` is the regex free whitespace must
  match, ``disable_additional_properties`` adds ``additionalProperties: false`` to every object
  schema with ``properties`` that does not say otherwise.
* ``json_object``: any JSON object (the schema ``{"type": "object"}``, same whitespace options).
* ``regex``: the regex (Rust ``regex`` syntax), matched in full.
* ``choice``: exactly one of the strings.
* ``grammar``: GBNF/EBNF (llama.cpp's syntax, converted to Lark) or Lark text.
* ``structural_tag``: vLLM's JSON ``{"structures": [{"begin", "schema", "end"}], "triggers": [...]}``:
  free text in which each ``begin`` (it starts with one of the triggers) is followed by JSON
  valid for its schema and then ``end``.

``grammar_text`` raises ``ValueError`` naming the field (``StructuredOutputsParams.json`` ...)
when the constraint cannot be turned into a grammar, and ``validate(field, text)`` when the
schema, regex or grammar does not compile; it checks without a tokenizer
(``LLMatcher.validate_grammar``, well under a millisecond for a small schema); the engine skips it for a grammar
already compiled.
The grammar text is the constraint's canonical form: the same schema, given as a dict or as
text in any formatting, gives the same text (the compile cache's key).
"""
from __future__ import annotations

import copy
import json

import llguidance

from .params import StructuredOutputsParams

_MAX_ERROR_CHARS = 300  # grammar errors can quote whole grammars: keep messages short
# Schema keywords whose values map names to sub-schemas, and those holding sub-schemas themselves.
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SUBSCHEMAS = ("items", "prefixItems", "additionalItems", "contains", "additionalProperties",
               "unevaluatedProperties", "unevaluatedItems", "propertyNames", "not", "if", "then", "else",
               "allOf", "anyOf", "oneOf")


def validate(field: str, text: str) -> None:
    """``ValueError`` naming ``StructuredOutputsParams.<field>`` unless ``text`` compiles."""
    error = llguidance.LLMatcher.validate_grammar(text)
    if error:
        raise _invalid(field, error)


def grammar_text(params: StructuredOutputsParams) -> str:
    """The llguidance grammar for ``params`` (not validated: see ``validate``)."""
    field = params.kind
    try:
        if field in ("json", "json_object"):
            return _json_grammar(params)
        if field == "regex":
            return llguidance.grammar_from("regex", params.regex)
        if field == "choice":
            return llguidance.grammar_from("choice", json.dumps(list(params.choice)))
        if field == "grammar":
            return llguidance.grammar_from("grammar", params.grammar)
        return _structural_tag_grammar(params)
    except (ValueError, TypeError, KeyError, AssertionError) as exc:
        raise _invalid(field, str(exc) or type(exc).__name__) from None


def _json_grammar(params: StructuredOutputsParams) -> str:
    schema = {"type": "object"} if params.json_object else params.json
    if isinstance(schema, str):
        schema = json.loads(schema)
    if schema is True:  # the boolean schema that admits any JSON value
        schema = {}
    if params.disable_additional_properties:
        schema = closed_objects(schema)
    return llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=_json_options(params))


def _json_options(params: StructuredOutputsParams) -> dict:
    """llguidance's JSON options (a schema's own ``x-guidance`` still overrides them, as in llguidance)."""
    if params.disable_any_whitespace:
        return {"whitespace_flexible": False, "item_separator": ",", "key_separator": ":"}
    if params.whitespace_pattern is not None:
        return {"whitespace_pattern": params.whitespace_pattern}
    return {"whitespace_flexible": True}


def closed_objects(schema):
    """A copy of ``schema`` in which every object schema with ``properties`` (or
    ``patternProperties``) and no ``additionalProperties`` takes no other property."""
    schema = copy.deepcopy(schema)
    _close(schema)
    return schema


def _close(node) -> None:
    if isinstance(node, list):
        for item in node:
            _close(item)
        return
    if not isinstance(node, dict):
        return
    for key in _SCHEMA_MAPS:
        if isinstance(node.get(key), dict):
            for sub in node[key].values():
                _close(sub)
    for key in _SUBSCHEMAS:
        if isinstance(node.get(key), (dict, list)):
            _close(node[key])
    if "additionalProperties" not in node and any(isinstance(node.get(k), dict)
                                                  for k in ("properties", "patternProperties")):
        node["additionalProperties"] = False


def _structural_tag_grammar(params: StructuredOutputsParams) -> str:
    spec = json.loads(params.structural_tag)
    if not isinstance(spec, dict) or not isinstance(spec.get("structures"), list) \
            or not isinstance(spec.get("triggers"), list) or not spec["structures"]:
        raise ValueError('expected a JSON object {"structures": [{"begin", "schema", "end"}, ...], '
                         '"triggers": [...]}')
    tags = []
    for item in spec["structures"]:
        begin = item["begin"]
        trigger = next((t for t in spec["triggers"] if isinstance(t, str) and t and begin.startswith(t)), None)
        if trigger is None:
            raise ValueError(f"no trigger of {spec['triggers']} starts the structure's begin {begin!r}")
        schema = item["schema"]
        if params.disable_additional_properties:
            schema = closed_objects(schema)
        tags.append(llguidance.StructTag(trigger=trigger, begin=begin, grammar=schema, end=item["end"]))
    return llguidance.LLMatcher.grammar_from_lark(llguidance.StructTag.to_grammar(tags))


def _invalid(field: str, error: str) -> ValueError:
    error = " ".join(error.split())
    if len(error) > _MAX_ERROR_CHARS:
        error = error[:_MAX_ERROR_CHARS] + "..."
    return ValueError(f"StructuredOutputsParams.{field} is invalid: {error}")

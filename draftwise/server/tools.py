"""Chat's ``tools``, ``tool_choice`` and ``parallel_tool_calls``: checked, and turned into the
constraint that makes the model write the call (``constraints.Source``).

- ``tool_choice="none"``: the tools reach the chat template only; the output is plain text.
- ``"required"``: the output is constrained to a JSON array of calls, each ``{"name": <one of the
  tools>, "parameters": <its parameters schema>}`` (vLLM's format): at least one call, at most one
  with ``parallel_tool_calls=false``. The tools' ``$defs`` move to the array's schema, so their
  ``$ref``s still resolve; a name defined twice differently is a 400 naming the tool.
- a named function ``{"type": "function", "function": {"name": N}}``: the output is constrained to
  N's ``parameters`` schema (any JSON object when the tool has none).
- ``"auto"`` (OpenAI's default when tools are given) lets the model choose between text and a call
  written in its own format, read back by a parser for that format. draftwise reads the Hermes format
  (``<tool_call>`` blocks: Qwen2.5, Qwen3, Hermes 2/3; ``hermes_tool_parser.py``), so ``"auto"`` is
  accepted when the chat template takes tools and writes ``<tool_call>`` (``ToolPlan.parser`` is then
  ``"hermes"``; the output is unconstrained). Otherwise it is a 400 naming ``tool_choice`` whose
  message says why: the template does not take tools, or writes calls in a format with no parser.

The checks follow vLLM's: ``tools: []`` is refused, a ``tool_choice`` other than ``"none"`` without
tools is refused, a named function must be one of the tools. Whatever the choice, the tools go to
the chat template as sent (``apply_chat_template(tools=...)``; a template that does not read them
renders as without).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .constraints import Source
from .errors import APIError
from .hermes_tool_parser import template_writes_hermes
from .protocol import ChatCompletionRequest
from .tool_protocol import ChatTool

_ANY_OBJECT = {"type": "object", "properties": {}}
_NAMED_FORM = '{"type": "function", "function": {"name": ...}}'


@dataclass
class ToolPlan:
    template_tools: list[dict]  # what the chat template gets
    required: bool = False  # tool_choice "required"
    function: str | None = None  # the function tool_choice names
    schema: dict | None = None  # what a forced call's output must match
    schema_param: str = "tools"  # the request field an error in that schema names
    parser: str | None = None  # tool_choice "auto": the format the model's calls are read in ("hermes")

    @property
    def forced(self) -> bool:
        """The output is a tool call (``"required"`` or a named function), not text."""
        return self.required or self.function is not None

    @property
    def names(self) -> frozenset[str]:
        """The names of the functions the model may call."""
        return frozenset(tool["function"]["name"] for tool in self.template_tools)

    def source(self) -> Source | None:
        if not self.forced:
            return None
        return Source("tool_choice", {"json": self.schema}, {"json": self.schema_param}, self.schema_param)


def plan_tools(request: ChatCompletionRequest, template_takes_tools: bool,
               tool_parser: str | None = None) -> ToolPlan | None:
    """What the request's tools ask for (None: no tools); ``APIError`` (400) naming the field otherwise.
    ``tool_parser`` is the format the chat template's calls are read in (``template_tool_parser``)."""
    tools, choice = request.tools, request.tool_choice
    if tools is not None and not tools:
        raise APIError(400, "tools must not be an empty array: give at least one tool or leave tools out",
                       param="tools")
    if choice is None:
        choice = "auto" if tools else "none"
    if choice == "none":
        return ToolPlan(template_tools(tools)) if tools else None
    if not tools:
        raise APIError(400, f"tool_choice={_show(choice)} needs tools: give the tools the model may call",
                       param="tool_choice")
    if choice == "auto":
        if tool_parser is None:
            raise APIError(400, _auto_refusal(template_takes_tools), param="tool_choice")
        return ToolPlan(template_tools(tools), parser=tool_parser)
    if choice == "required":
        return ToolPlan(template_tools(tools), required=True, schema=_calls_schema(tools, request.parallel_tool_calls))
    name = _named_function(choice)
    index = next((i for i, tool in enumerate(tools) if tool.function.name == name), None)
    if index is None:
        known = [tool.function.name for tool in tools]
        raise APIError(400, f"tool_choice names the function {name!r}, which is not one of the tools {known}",
                       param="tool_choice.function.name")
    return ToolPlan(template_tools(tools), function=name, schema=tools[index].function.parameters or _ANY_OBJECT,
                    schema_param=f"tools.{index}.function.parameters")


def template_takes_tools(tokenizer) -> bool:
    """The model's chat template (any of them, when it has several) reads ``tools``."""
    template = getattr(tokenizer, "chat_template", None) or ""
    texts = template.values() if isinstance(template, dict) else [template]
    return any("tools" in text for text in texts)


def template_tool_parser(tokenizer) -> str | None:
    """The format the model's chat template has it write tool calls in, when draftwise reads it:
    ``"hermes"`` (the template takes tools and writes ``<tool_call>`` blocks); None otherwise."""
    template = getattr(tokenizer, "chat_template", None) or ""
    texts = template.values() if isinstance(template, dict) else [template]
    return "hermes" if any(template_writes_hermes(text) for text in texts) else None


def template_tools(tools: list[ChatTool]) -> list[dict]:
    """The tools as the chat template gets them: as sent, unset fields left out."""
    return [tool.model_dump(exclude_none=True) for tool in tools]


def _named_function(choice: Any) -> str:
    """The function a named ``tool_choice`` names; ``APIError`` for any other value."""
    if not isinstance(choice, dict):
        raise APIError(400, f'tool_choice={_show(choice)} is invalid: send "none", "required", "auto" or '
                       f"a named function {_NAMED_FORM}", param="tool_choice")
    if choice.get("type", "function") != "function" or set(choice) - {"type", "function"}:
        raise APIError(400, f"tool_choice={_show(choice)} is invalid: a named function is {_NAMED_FORM}",
                       param="tool_choice")
    function = choice.get("function")
    if not isinstance(function, dict) or set(function) - {"name"}:
        raise APIError(400, f"tool_choice.function={_show(function)} is invalid: it is {{\"name\": ...}}",
                       param="tool_choice.function")
    name = function.get("name")
    if not isinstance(name, str) or not name:
        raise APIError(400, f"tool_choice.function.name={_show(name)} is invalid: it is the name of one of "
                       "the tools", param="tool_choice.function.name")
    return name


def _calls_schema(tools: list[ChatTool], parallel_tool_calls: bool | None) -> dict:
    """The JSON schema of ``"required"``'s output: an array of ``{"name", "parameters"}`` calls."""
    defs: dict[str, Any] = {}
    calls = []
    for i, tool in enumerate(tools):
        parameters = dict(tool.function.parameters or _ANY_OBJECT)
        own_defs = parameters.pop("$defs", None) or {}
        if not isinstance(own_defs, dict):
            raise APIError(400, "$defs of a tool's parameters must be an object",
                           param=f"tools.{i}.function.parameters.$defs")
        for name, schema in own_defs.items():
            if defs.setdefault(name, schema) != schema:
                raise APIError(400, f"$defs.{name} is defined differently by two tools; tool_choice='required' "
                               "needs one definition per name", param=f"tools.{i}.function.parameters.$defs")
        calls.append({"properties": {"name": {"type": "string", "enum": [tool.function.name]},
                                     "parameters": parameters},
                      "required": ["name", "parameters"]})
    schema: dict[str, Any] = {"type": "array", "minItems": 1, "items": {"type": "object", "anyOf": calls}}
    if parallel_tool_calls is False:
        schema["maxItems"] = 1
    if defs:
        schema["$defs"] = defs
    return schema


def _auto_refusal(template_takes_tools: bool) -> str:
    why = ("this model's chat template takes tools, but does not write calls in the Hermes <tool_call> format, "
           "the only one draftwise has a parser for" if template_takes_tools else "this model's chat template "
           "does not take tools")
    return (f"tool_choice='auto' (the default when tools are given) lets the model choose between text and a "
            f"call in its own format: {why}. Send tool_choice='required' or a named function {_NAMED_FORM} "
            "(the call is then constrained to the tools' JSON schemas), or 'none'")


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:80] + "..."

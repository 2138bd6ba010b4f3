"""Tool calling on the wire: chat's ``tools`` entries and the calls a response carries (OpenAI's shapes).

A request's ``tools`` are ``{"type": "function", "function": {"name", "description", "parameters",
"strict"}}`` (other keys pass through to the chat template as sent). A response's
``message.tool_calls[]`` are ``{"id", "type": "function", "function": {"name", "arguments"}}`` with
``arguments`` JSON text; a stream sends ``delta.tool_calls[]`` as ``{"index", "id", "type",
"function": {"name", "arguments"}}`` on a call's first delta, then ``{"index", "function":
{"arguments"}}`` pieces (unset fields are left out of the chunk).
"""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class FunctionDefinition(BaseModel):
    model_config = ConfigDict(extra="allow")  # the chat template gets the tool as sent

    name: str = Field(min_length=1)
    description: str | None = None
    parameters: dict[str, Any] | None = None  # a JSON schema; none: the call takes an empty object
    strict: bool | None = None


class ChatTool(BaseModel):
    """One entry of chat's ``tools``: OpenAI's ``{"type": "function", "function": {...}}``."""
    model_config = ConfigDict(extra="allow")  # the chat template gets the tool as sent

    type: Literal["function"] = "function"
    function: FunctionDefinition


class FunctionCall(BaseModel):
    name: str
    arguments: str  # JSON text, valid for the function's parameters schema when the call completed


class ToolCall(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class DeltaFunctionCall(BaseModel):
    name: str | None = None  # the call's first delta only
    arguments: str | None = None  # the next piece of the arguments' JSON text


class DeltaToolCall(BaseModel):
    index: int  # the call's place in message.tool_calls
    id: str | None = None  # the call's first delta only
    type: Literal["function"] | None = None
    function: DeltaFunctionCall | None = None

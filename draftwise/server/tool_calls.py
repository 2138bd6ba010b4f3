"""The calls in a forced tool-call output (``tools.ToolPlan``): whole, or as stream deltas.

A named function's output is its arguments: one call whose ``arguments`` is the text as written
(no call if the text is blank). ``"required"``'s output is a JSON array ``[{"name": ...,
"parameters": {...}}, ...]``: one call per element whose name and parameters are complete, its
``arguments`` the parameters' JSON text exactly as written, so a stream's argument pieces join into
the text the whole response carries. A stream announces a call (``index``, ``id``, ``type``,
``function.name`` and the arguments so far) once its name is complete and its parameters have begun,
then sends each new piece of its arguments. ``scan_calls`` reads any prefix of an array as it reads
the whole, so what was sent stays a prefix of what is sent later; text that is not such an array
yields no call. ``finish_reason`` is ``"tool_calls"`` when ``"required"`` calls ended on a stop, as
vLLM and OpenAI set it (a named function's call keeps ``"stop"``). Call ids are vLLM's form,
``chatcmpl-tool-<hex>``.

``tool_choice="auto"`` (``ToolPlan.parser``, Hermes ``<tool_call>`` blocks; ``hermes_tool_parser.py``):
the output is text and calls. A finished output gives ``content`` (None when only calls) and the calls;
a stream sends the text as content as it is decided and each call whole, once its block closes (one
delta with ``id``, ``type``, ``name`` and all its ``arguments``). ``finish_reason`` is ``"tool_calls"``
whenever a call was read, as vLLM sets it for ``"auto"``.
"""
from __future__ import annotations

import json
import uuid
from dataclasses import dataclass

from . import hermes_tool_parser as hermes
from .tool_protocol import DeltaFunctionCall, DeltaToolCall, FunctionCall, ToolCall
from .tools import ToolPlan

_WHITESPACE = " \t\n\r"


def new_call_id() -> str:
    return f"chatcmpl-tool-{uuid.uuid4().hex}"


def whole_calls(plan: ToolPlan, text: str) -> list[ToolCall]:
    """The calls a finished output holds."""
    if plan.function is not None:
        return [ToolCall(id=new_call_id(), function=FunctionCall(name=plan.function, arguments=text))] \
            if text.strip() else []
    return [ToolCall(id=new_call_id(), function=FunctionCall(name=span.name, arguments=text[span.start:span.end]))
            for span in scan_calls(text) if span.name is not None and span.end is not None]


def finish_reason(plan: ToolPlan | None, reason: str | None, called: bool) -> str | None:
    """The choice's ``finish_reason``: ``"tool_calls"`` for ``"required"`` calls that ended on a stop, and
    for ``"auto"`` calls however the output ended."""
    if plan is not None and called and (plan.parser is not None or plan.required and reason == "stop"):
        return "tool_calls"
    return reason


def parsed_message(plan: ToolPlan, text: str) -> tuple[str | None, list[ToolCall]]:
    """``"auto"``: the content and the calls of a finished output."""
    parsed = hermes.parse(text, plan.names)
    return parsed.content, [ToolCall(id=new_call_id(), function=FunctionCall(name=call.name, arguments=call.arguments))
                            for call in parsed.calls]


class ParsedStream:
    """``"auto"``: one choice's content and tool-call deltas, fed the output text as it is released."""

    def __init__(self, plan: ToolPlan):
        self.plan = plan
        self.reader = hermes.HermesStream(plan.names)
        self.count = 0  # calls sent

    @property
    def called(self) -> bool:
        return self.count > 0

    def feed(self, delta: str, last: bool) -> tuple[str, list[DeltaToolCall]]:
        """The content and the calls decided by ``delta`` (and, when ``last``, by the output's end)."""
        pieces = self.reader.feed(delta) + (self.reader.finish() if last else [])
        content, calls = "", []
        for piece in pieces:
            if isinstance(piece, str):
                content += piece
            else:
                calls.append(_announce(self.count, piece.name, piece.arguments))
                self.count += 1
        return content, calls


class CallStream:
    """One choice's tool-call deltas, fed the output text as it is released."""

    def __init__(self, plan: ToolPlan):
        self.plan = plan
        self.scanner = CallScanner()
        self.sent: list[int] = []  # per announced call: where the arguments sent so far end in the text

    @property
    def called(self) -> bool:
        return bool(self.sent)

    def feed(self, delta: str) -> list[DeltaToolCall]:
        start = len(self.scanner.text)
        if self.plan.function is not None:
            self.scanner.text += delta  # a named call's text is its arguments: nothing to scan
            return self._named(start)
        out = []
        spans = self.scanner.feed(delta)
        text = self.scanner.text
        for index, span in enumerate(spans):
            if span.name is None or span.start is None:
                break  # the array's elements come in order: none after this one is ready
            end = len(text) if span.end is None else span.end
            if index == len(self.sent):
                out.append(_announce(index, span.name, text[span.start:end]))
                self.sent.append(end)
            elif end > self.sent[index]:
                out.append(_more(index, text[self.sent[index]:end]))
                self.sent[index] = end
        return out

    def _named(self, start: int) -> list[DeltaToolCall]:
        text = self.scanner.text
        if len(text) == start:
            return []
        if not self.sent:
            self.sent.append(len(text))
            return [_announce(0, self.plan.function, text)]
        self.sent[0] = len(text)
        return [_more(0, text[start:])]


def _announce(index: int, name: str, arguments: str) -> DeltaToolCall:
    return DeltaToolCall(index=index, id=new_call_id(), type="function",
                         function=DeltaFunctionCall(name=name, arguments=arguments))


def _more(index: int, arguments: str) -> DeltaToolCall:
    return DeltaToolCall(index=index, function=DeltaFunctionCall(arguments=arguments))


# ---------------------------------------------------------------------- reading a (partial) call array
@dataclass
class CallSpan:
    name: str | None = None  # set once the name's string is complete
    start: int | None = None  # where the parameters' value starts in the text
    end: int | None = None  # where it ends (None: still being written)


class CallScanner:
    """Reads ``[{"name": ..., "parameters": ...}, ...]`` one character at a time, so a stream costs its
    length once; ``spans`` are the elements read so far. Reading stops for good at the array's end or
    at text that is not such an array."""

    def __init__(self):
        self.text = ""
        self.spans: list[CallSpan] = []
        self.depth = 0  # containers open; a call object's members are at depth 2
        self.string_start: int | None = None  # the opening quote of the string being read
        self.escaped = False
        self.state = "key"  # at depth 2: key, colon, value, string, container, scalar or after
        self.key: str | None = None
        self.value_start = 0
        self.stopped = False

    def feed(self, delta: str) -> list[CallSpan]:
        start = len(self.text)
        self.text += delta
        for i in range(start, len(self.text)):
            if self.stopped:
                break
            if self.string_start is not None:
                self._in_string(i)
            else:
                self._read(i, self.text[i])
        return self.spans

    def _in_string(self, i: int) -> None:
        char = self.text[i]
        if self.escaped:
            self.escaped = False
        elif char == "\\":
            self.escaped = True
        elif char == '"':
            start, self.string_start = self.string_start, None
            if self.depth == 2 and self.state == "key":
                self.key, self.state = _string(self.text[start:i + 1]), "colon"
            elif self.depth == 2 and self.state == "string":
                self._end_value(i + 1)

    def _read(self, i: int, char: str) -> None:
        at_members = self.depth == 2
        if at_members and self.state == "scalar" and char in _WHITESPACE + ",]}":
            self._end_value(i)
        if char in _WHITESPACE:
            return
        if char == '"':
            self.string_start = i
            if at_members and self.state == "value":
                self._begin_value(i, "string")
        elif char in "[{":
            self._open(i, char)
        elif char in "]}":
            self._close(i)
        elif at_members and char == ":" and self.state == "colon":
            self.state = "value"
        elif at_members and char == ",":
            self.state, self.key = "key", None
        elif at_members and self.state == "value":
            self._begin_value(i, "scalar")

    def _open(self, i: int, char: str) -> None:
        if self.depth == 0 and char != "[" or self.depth == 1 and char != "{":
            self.stopped = True
            return
        if self.depth == 1:
            self.spans.append(CallSpan())
            self.state, self.key = "key", None
        elif self.depth == 2 and self.state == "value":
            self._begin_value(i, "container")
        self.depth += 1

    def _close(self, i: int) -> None:
        self.depth -= 1
        if self.depth == 2 and self.state == "container":
            self._end_value(i + 1)
        elif self.depth <= 0:
            self.stopped = True  # the array is complete (or was never one)

    def _begin_value(self, i: int, kind: str) -> None:
        self.value_start, self.state = i, kind
        if self.key == "parameters":
            self.spans[-1].start = i

    def _end_value(self, end: int) -> None:
        span = self.spans[-1]
        if self.key == "parameters":
            span.end = end
        elif self.key == "name" and self.state == "string":
            span.name = _string(self.text[self.value_start:end])
        self.state = "after"


def scan_calls(text: str) -> list[CallSpan]:
    """The call elements of the (possibly unfinished) array ``text`` starts with."""
    return CallScanner().feed(text)


def _string(literal: str) -> str | None:
    try:
        value = json.loads(literal)
    except ValueError:
        return None
    return value if isinstance(value, str) else None

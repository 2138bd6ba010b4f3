"""Tool calls written in the Hermes format (vLLM's ``hermes`` tool parser: Qwen2.5, Qwen3, Hermes 2/3),
read from unconstrained output for ``tool_choice="auto"``: pure functions over text.

A call is a block ``<tool_call>{"name": N, "arguments": {...}}</tool_call>`` (whitespace around the
JSON allowed; a model writes several blocks for several calls). A block becomes a call when its JSON
is an object whose ``name`` is one of the tools' names and whose ``arguments`` is an object (absent:
``{}``); its ``arguments`` are then re-serialised as JSON text (non-ASCII kept). A block that does not
parse, or names no tool, stays text. A block left open at the end of the output counts as if closed
(generation may stop before ``</tool_call>``, or inside it).

``content`` is the text outside the call blocks; it is None when there are calls and that text is
blank, as vLLM answers when the model wrote only calls. ``HermesStream`` reads the same output in
pieces: text that could still begin ``<tool_call>`` is held back until decided, a block is held until
it closes (or the output ends), and blank text is held until non-blank text comes, so the pieces it
releases join into exactly what ``parse`` gives for the whole text.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

START = "<tool_call>"
END = "</tool_call>"


@dataclass(frozen=True)
class ParsedCall:
    name: str
    arguments: str  # JSON text of an object


@dataclass
class Parsed:
    content: str | None
    calls: list[ParsedCall]


def template_writes_hermes(template: str) -> bool:
    """A chat template that renders tools and asks for Hermes ``<tool_call>`` blocks."""
    return "tools" in template and START in template


def read_block(body: str, names: frozenset[str] | set[str]) -> ParsedCall | None:
    """The call a block's body holds; None when it is not a call of one of the tools."""
    try:
        value = json.loads(body)
    except ValueError:
        return None
    if not isinstance(value, dict) or value.get("name") not in names:
        return None
    arguments = value.get("arguments", {})
    if not isinstance(arguments, dict):
        return None
    return ParsedCall(value["name"], json.dumps(arguments, ensure_ascii=False))


def parse(text: str, names: frozenset[str] | set[str]) -> Parsed:
    """The content and calls of a finished output."""
    stream = HermesStream(names)
    return join(stream.feed(text) + stream.finish())


def join(pieces: list[str | ParsedCall]) -> Parsed:
    """The released pieces of a stream, whole."""
    calls = [piece for piece in pieces if isinstance(piece, ParsedCall)]
    content = "".join(piece for piece in pieces if isinstance(piece, str))
    return Parsed(None if calls and not content else content, calls)


def held_prefix(text: str, tag: str) -> int:
    """How many characters at the end of ``text`` could be the beginning of ``tag``."""
    for size in range(min(len(text), len(tag) - 1), 0, -1):
        if tag.startswith(text[-size:]):
            return size
    return 0


class HermesStream:
    """Reads one output as it grows: ``feed`` the new text, ``finish`` at the end. Each returns the
    pieces now decided, in order: text (``str``) and calls (``ParsedCall``)."""

    def __init__(self, names: frozenset[str] | set[str]):
        self.names = frozenset(names)
        self.pending = ""  # text not decided yet
        self.blank = ""  # blank text held until non-blank content comes (or the end)
        self.sent_text = False  # non-blank content was released
        self.called = False

    def feed(self, delta: str) -> list[str | ParsedCall]:
        self.pending += delta
        out: list[str | ParsedCall] = []
        while self.pending:
            start = self.pending.find(START)
            if start < 0:
                keep = held_prefix(self.pending, START)
                self._text(out, self.pending[:len(self.pending) - keep])
                self.pending = self.pending[len(self.pending) - keep:]
                break
            self._text(out, self.pending[:start])
            self.pending = self.pending[start:]
            end = self.pending.find(END, len(START))
            if end < 0:
                break  # the block is still being written
            self._block(out, self.pending[len(START):end], self.pending[:end + len(END)])
            self.pending = self.pending[end + len(END):]
        return out

    def finish(self) -> list[str | ParsedCall]:
        out: list[str | ParsedCall] = []
        if self.pending.startswith(START):
            body = self.pending[len(START):]
            self._block(out, body[:len(body) - held_prefix(body, END)], self.pending)
        else:
            self._text(out, self.pending)
        self.pending = ""
        if self.blank and not self.called:
            out.append(self.blank)  # no calls: the blank text is the content
        self.blank = ""
        return out

    def _block(self, out: list[str | ParsedCall], body: str, raw: str) -> None:
        call = read_block(body, self.names)
        if call is None:
            self._text(out, raw)
            return
        self.called = True
        out.append(call)

    def _text(self, out: list[str | ParsedCall], text: str) -> None:
        if not text:
            return
        if not self.sent_text and not text.strip():
            self.blank += text
            return
        out.append(self.blank + text)
        self.blank, self.sent_text = "", True

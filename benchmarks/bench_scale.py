"""Models at real sizes against llama.cpp: start-up, memory, prefill and decode on the same GGUF.

    python benchmarks/bench_scale.py --llamacpp-python .venv-llamacpp/bin/python \
        [--llama-bench PATH] [--files llama-3.2-1b:Q4_0,llama-3.1-8b:Q4_K_M] [--out FILE.json]

Each file is a random-weight GGUF in a real model's shapes (``scripts/make_shaped_gguf.py``,
written once into the cache), read through once so both engines find it in the page cache. For
each file, one after the other in fresh processes (``scale_runner.py``): draftwise's default path,
then llama.cpp through llama-cpp-python (start-up and peak memory, and speeds when no
``llama-bench`` is given); with ``--llama-bench``, llama.cpp's speeds come from its own C++ tool
(prefill of ``--prefill`` tokens, ``--decode`` tokens generated at depth 0 and ``--depth``). The
``--long-files`` are also timed at long context (a ``--long-prefill``-token prompt, decode at
``--long-depth``), both engines then holding ``--long-n-ctx`` tokens. Both engines get 2 threads
and a KV cache of ``--n-ctx`` tokens. Prints one table with the ratios draftwise / llama.cpp and
writes the figures as JSON. With ``--ik-llama-bench``, ik_llama.cpp's speeds too (its own
llama-bench, weights repacked at load: ``-rtr 1``), with the ratios draftwise / ik_llama.cpp.

Start-up is then timed ``--startup-repeats`` more times per engine, llama.cpp first this time (the
engine that runs first after the file is read through also pays for touching memory no process
has used yet); ``startup_s`` is each engine's fastest start (every one in ``startup_runs_s``), each
draftwise start on an empty model cache (a first load).
"""
from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
RUNNER = HERE / "scale_runner.py"
DEFAULT_FILES = "llama-3.2-1b:Q4_0,llama-3.2-1b:Q4_K_M,llama-3.2-3b:Q4_0,llama-3.1-8b:Q4_K_M"
METRICS = ("startup_s", "peak_rss_mb", "prefill_tps", "decode_tps", "decode_deep_tps", "prefill_long_tps",
           "decode_long_tps")
SETTINGS = ("prefill", "decode", "depth", "n_ctx", "long_files", "long_prefill", "long_depth", "long_n_ctx",
            "startup_repeats")
LONG_FILES = "llama-3.2-1b:Q4_0,llama-3.2-1b:Q4_K_M"  # long-context figures cost minutes a file at 3B-8B


def shaped_gguf(spec: str) -> Path:
    """``shape:ftype`` -> the cached random-weight file (written now if absent)."""
    module_path = HERE.parent / "scripts" / "make_shaped_gguf.py"
    spec_obj = importlib.util.spec_from_file_location("make_shaped_gguf", module_path)
    module = importlib.util.module_from_spec(spec_obj)
    sys.modules["make_shaped_gguf"] = module  # its dataclasses look their module up
    spec_obj.loader.exec_module(module)
    shape, ftype = spec.split(":")
    return module.shaped_gguf(shape, ftype)


def run_engine(python: str, engine: str, gguf: Path, args, speed: bool = True, long: bool = False) -> dict:
    """One engine's run in a fresh process; draftwise's on an empty model cache (a first load: the
    config and tokenizer are made from the file, the kernel plans measured). With ``long``, the
    long prompt and the decode at the long depth too, in a cache of ``--long-n-ctx`` tokens."""
    with tempfile.NamedTemporaryFile(suffix=".json") as out, tempfile.TemporaryDirectory() as cache:
        cmd = [python, str(RUNNER), engine, str(gguf), out.name, "--threads", str(args.threads),
               "--prefill", str(args.prefill), "--decode", str(args.decode), "--depth", str(args.depth),
               "--n-ctx", str(args.long_n_ctx if long else args.n_ctx)]
        cmd += ["--long-prefill", str(args.long_prefill), "--long-depth", str(args.long_depth)] if long else []
        cmd += [] if speed else ["--no-speed"]
        subprocess.run(cmd, check=True, env={**os.environ, "DRAFTWISE_CACHE": cache})
        return json.loads(Path(out.name).read_text())


def llama_bench(binary: str, gguf: Path, args, long: bool = False, flags: tuple[str, ...] = (),
                gp_depths: bool = False) -> dict:
    """llama.cpp's own speeds: prefill tokens/s, decode tokens/s at depth 0 and at ``--depth`` (and with
    ``long``, prefill of ``--long-prefill`` tokens and decode at ``--long-depth``). Prompts and
    decodes are separate runs: llama-bench times every prompt at every depth otherwise."""
    base = [binary, "-m", str(gguf), "-t", str(args.threads), "-r", "1", "-o", "json", *flags]
    prompts = [args.prefill] + ([args.long_prefill] if long and args.long_prefill else [])
    depths = [0, args.depth] + ([args.long_depth] if long and args.long_depth else [])
    if gp_depths:  # ik_llama.cpp's llama-bench: no -d; -gp DEPTH,N times N tokens after a DEPTH-token prompt
        decodes = ["-p", "0", "-n", str(args.decode)] + [a for d in depths[1:] for a in ("-gp", f"{d},{args.decode}")]
    else:
        decodes = ["-p", "0", "-n", str(args.decode), "-d", ",".join(map(str, depths))]
    runs = []
    for extra in (["-p", ",".join(map(str, prompts)), "-n", "0"], decodes):
        runs += json.loads(subprocess.run(base + extra, check=True, capture_output=True, text=True).stdout)
    speed = {(r["n_prompt"], r["n_gen"], r["n_depth"]) if "n_depth" in r else
             ((0, r["n_gen"], r["n_prompt"]) if r["n_gen"] else (r["n_prompt"], 0, 0)): r["avg_ts"] for r in runs}
    return {"prefill_tps": speed[(args.prefill, 0, 0)], "decode_tps": speed[(0, args.decode, 0)],
            "decode_deep_tps": speed.get((0, args.decode, args.depth)),
            "prefill_long_tps": speed.get((args.long_prefill, 0, 0)) if long else None,
            "decode_long_tps": speed.get((0, args.decode, args.long_depth)) if long else None}


def read_through(gguf: Path) -> None:
    """Read the whole file once, so both engines start with it in the page cache (the first to run
    would otherwise pay the disk alone)."""
    with open(gguf, "rb") as f:
        while f.read(64 << 20):
            pass


def measure_file(spec: str, args) -> dict:
    gguf = shaped_gguf(spec)
    read_through(gguf)
    long = spec in args.long_files.split(",")
    ours = run_engine(sys.executable, "draftwise", gguf, args, long=long)
    theirs = run_engine(args.llamacpp_python, "llamacpp", gguf, args, speed=not args.llama_bench, long=long)
    if args.llama_bench:
        theirs.update(llama_bench(args.llama_bench, gguf, args, long), speeds_from="llama-bench")
    retime_startup(gguf, args, ours, theirs)
    row = {"file": spec, "size_mb": round(gguf.stat().st_size / 2**20), "draftwise": ours, "llamacpp": theirs}
    row["ratios"] = {m: ours[m] / theirs[m] for m in METRICS if ours.get(m) and theirs.get(m)}
    if args.ik_llama_bench:  # its strongest CPU path: weights repacked at load (-rtr 1)
        ik = llama_bench(args.ik_llama_bench, gguf, args, long, ("-rtr", "1"), gp_depths=True)
        row["ik_llama"] = ik
        row["ratios_ik"] = {m: ours[m] / ik[m] for m in METRICS if ours.get(m) and ik.get(m)}
    print_row(row)
    return row


def retime_startup(gguf: Path, args, ours: dict, theirs: dict) -> None:
    """More starts of each engine, llama.cpp first; each keeps its fastest as ``startup_s``."""
    runs = {"draftwise": [ours["startup_s"]], "llamacpp": [theirs["startup_s"]]}
    for _ in range(args.startup_repeats):
        for engine, python in (("llamacpp", args.llamacpp_python), ("draftwise", sys.executable)):
            runs[engine].append(run_engine(python, engine, gguf, args, speed=False)["startup_s"])
    for engine, result in (("draftwise", ours), ("llamacpp", theirs)):
        result["startup_runs_s"] = runs[engine]
        result["startup_s"] = min(runs[engine])


def print_row(row: dict) -> None:
    ours, theirs, ratio = row["draftwise"], row["llamacpp"], row["ratios"]
    cells = [f"{m} {ours[m]:.1f} vs {theirs[m]:.1f} ({ratio[m]:.2f}x)" for m in METRICS if m in ratio]
    print(f"{row['file']} ({row['size_mb']} MB): " + "; ".join(cells), flush=True)
    if "ik_llama" in row:
        ik, ratio = row["ik_llama"], row["ratios_ik"]
        print("  vs ik_llama.cpp: " + "; ".join(f"{m} {ours[m]:.1f} vs {ik[m]:.1f} ({ratio[m]:.2f}x)"
                                              for m in METRICS if m in ratio), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--llamacpp-python", required=True, help="python of the venv `make llamacpp` built")
    parser.add_argument("--llama-bench", default=None, help="llama.cpp's llama-bench (`make llama-bench`)")
    parser.add_argument("--ik-llama-bench", default=None, help="ik_llama.cpp's llama-bench (`make ik-llama-bench`)")
    parser.add_argument("--files", default=DEFAULT_FILES, help="shape:ftype,... (scripts/make_shaped_gguf.py)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--prefill", type=int, default=1024)
    parser.add_argument("--decode", type=int, default=64)
    parser.add_argument("--depth", type=int, default=2048)
    parser.add_argument("--n-ctx", type=int, default=4096)
    parser.add_argument("--long-files", default=LONG_FILES, help="files also timed at long context")
    parser.add_argument("--long-prefill", type=int, default=4096)
    parser.add_argument("--long-depth", type=int, default=8000, help="below the shapes' 8192 positions")
    parser.add_argument("--long-n-ctx", type=int, default=8192)
    parser.add_argument("--startup-repeats", type=int, default=2, help="more starts per engine, alternated")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    sys.path.insert(0, str(HERE.parent))
    from draftwise.kernels.cpu_info import cpu_signature

    rows = [measure_file(spec, args) for spec in args.files.split(",")]
    today = datetime.date.today().isoformat()
    result = {"date": today, "cpu": cpu_signature(), "threads": args.threads, "command": " ".join(sys.argv),
              "settings": {k: getattr(args, k) for k in SETTINGS},
              "files": rows}
    out = Path(args.out or HERE / "results" / f"scale-{today}.json")
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()

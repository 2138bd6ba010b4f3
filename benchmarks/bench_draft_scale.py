"""The draft-model example at real shapes: a 1B-shaped draft for an 8B-shaped target, its step costs.

    python benchmarks/bench_draft_scale.py [--target llama-3.1-8b:Q4_K_M] [--draft llama-3.2-1b:Q4_0]
        [--context 512] [--out FILE.json]

Both files are random-weight GGUFs in real shapes with one tokenizer (``scripts/make_shaped_gguf.py``,
through ``bench_scale.shaped_gguf``), so the engine runs ``draft_model`` on them as it would on the
real pair, but acceptance means nothing here: what is measured is the cost side. It times the
target's step (forward and logits) at 1-6 rows of one sequence and the draft model's one-row step,
both at ``--context`` tokens of context, and prints the speed-up a chain of ``k`` drafts would give
at acceptance rate ``a`` per draft: ``(1 - a^(k+1)) / (1 - a)`` tokens per step for
``k * draft + verify(k + 1)`` seconds, against ``target(1)`` per token.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from bench_scale import shaped_gguf

from draftwise import LLM, SamplingParams
from draftwise.engine.drafting.step_timing import measure_step_seconds

ACCEPTANCE = (0.5, 0.6, 0.7, 0.8, 0.9)


def projected(target: dict[int, float], draft: float, k: int, acceptance: float) -> float:
    """Speed-up over plain decoding of ``k`` chained drafts accepted at ``acceptance`` each."""
    tokens = (1 - acceptance ** (k + 1)) / (1 - acceptance)
    return tokens * target[1] / (k * draft + target[k + 1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--target", default="llama-3.1-8b:Q4_K_M")
    parser.add_argument("--draft", default="llama-3.2-1b:Q4_0")
    parser.add_argument("--context", type=int, default=512)
    parser.add_argument("--out")
    args = parser.parse_args()
    target_file, draft_file = shaped_gguf(args.target), shaped_gguf(args.draft)
    start = time.perf_counter()
    llm = LLM(model=str(target_file), max_model_len=4096, max_num_seqs=1,
              speculative_config={"method": "draft_model", "model": str(draft_file), "num_speculative_tokens": 5})
    startup = time.perf_counter() - start
    out = llm.generate("The capital of France is", SamplingParams(temperature=0, max_tokens=16), use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 16  # the pair runs end to end
    engine = llm.llm_engine
    target = measure_step_seconds(engine.runner.paged, engine.block_manager, list(range(1, 7)), args.context)
    drafter = engine.speculator.proposer
    draft = measure_step_seconds(drafter.paged, engine.block_manager, [1], args.context)[1]
    rows = {r: round(s * 1e3, 1) for r, s in target.items()}
    print(f"start-up of the pair: {startup:.1f} s; target step ms by rows at {args.context} keys: {rows}; "
          f"draft step {draft * 1e3:.1f} ms ({draft / target[1]:.2f} of a target step)")
    table = {}
    for k in range(1, 6):
        table[k] = {a: round(projected(target, draft, k, a), 2) for a in ACCEPTANCE}
        print(f"k={k}: " + "  ".join(f"a={a}: {x:.2f}x" for a, x in table[k].items()))
    if args.out:
        Path(args.out).write_text(json.dumps({
            "date": time.strftime("%Y-%m-%d"), "target": args.target, "draft": args.draft, "context": args.context,
            "startup_s": round(startup, 1), "target_step_ms": rows, "draft_step_ms": round(draft * 1e3, 1),
            "projected_speedup": table}, indent=1))


if __name__ == "__main__":
    main()

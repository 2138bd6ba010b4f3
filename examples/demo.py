"""Demo: speculative decoding side by side on the bundled SmolLM2-135M-Instruct (``make demo``).

A code-edit prompt (the answer copies most of the prompt) decoded plainly, with ``ngram`` and
with ``suffix``; a chat prompt decoded plainly and with the shipped EAGLE-3 drafter (mixed with
suffix drafts). Greedy, one request at a time; prints tokens/s, the speed-up over plain
decoding, the mean acceptance length, and whether the output equals plain decoding's.
"""
from __future__ import annotations

import time

from draftwise import LLM, SamplingParams

CODE_EDIT = """Rename the function `area` to `rectangle_area` and change nothing else:

```python
def area(width, height):
    \"\"\"Return the area of a rectangle.\"\"\"
    if width < 0 or height < 0:
        raise ValueError("sides must be non-negative")
    return width * height


def describe(width, height):
    return f"A {width} x {height} rectangle has area {area(width, height)}."
```"""
CHAT = "Give me three practical tips for staying focused while studying, one sentence each."
EAGLE3 = {"method": "eagle3", "model": "draftwise/SmolLM2-135M-Instruct-eagle3", "num_speculative_tokens": 3,
          "enable_suffix_decoding": True}
RUNS = [("code edit", CODE_EDIT, None), ("code edit", CODE_EDIT, {"method": "ngram", "num_speculative_tokens": 5}),
        ("code edit", CODE_EDIT, {"method": "suffix"}), ("chat", CHAT, None), ("chat", CHAT, EAGLE3)]


def decode(config: dict | None, prompt: str) -> tuple[list[int], float, float | None]:
    """(output token ids, tokens/s, mean acceptance length) of one greedy request, after a warm-up."""
    llm = LLM(speculative_config=config) if config else LLM()
    params = SamplingParams(temperature=0.0, max_tokens=160)
    messages = [{"role": "user", "content": prompt}]
    llm.chat(messages, SamplingParams(temperature=0.0, max_tokens=8), use_tqdm=False)  # warm-up
    start = time.perf_counter()
    out = llm.chat(messages, params, use_tqdm=False)[0].outputs[0]
    seconds = time.perf_counter() - start
    stats = llm.get_spec_decode_stats()
    return list(out.token_ids), len(out.token_ids) / seconds, stats.get("spec_decode_mean_acceptance_length")


def main() -> None:
    print(f"{'prompt':10s} {'method':8s} {'tokens/s':>9s} {'speed-up':>9s} {'mean acc. len':>14s}  output")
    plain: dict[str, tuple[list[int], float]] = {}
    for name, prompt, config in RUNS:
        ids, speed, accepted = decode(config, prompt)
        method = config["method"] if config else "plain"
        if config is None:
            plain[name] = (ids, speed)
        same = "= plain" if ids == plain[name][0] else "DIFFERS from plain"
        length = f"{accepted:.2f}" if accepted else "-"
        print(f"{name:10s} {method:8s} {speed:9.1f} {speed / plain[name][1]:8.2f}x {length:>14s}  {same}")


if __name__ == "__main__":
    main()

"""The first pass of ``make-data``: the target answers prompts greedily, written as it goes, resumable.

``AnswerLog(path)`` is ``answers.jsonl``: one record per answered prompt, ``{"chunk", "group",
"source", "prompt_token_ids", "answer_token_ids"}`` plus ``"messages"`` for conversations the
target wrote itself. Work runs in chunks of prompts (all of a chunk batched together); a chunk's
records are appended and flushed when it ends, and ``progress.json`` then records it done. A
restarted run drops the records of an unfinished chunk and goes on with the next one, so an
interrupted run and an uninterrupted one write the same records (sampling is seeded per chunk).

Sources: a fixed prompt list (``instruct``, a benchmark workload, a .jsonl file), answered as
given; and ``magpie`` (``magpie.py``), where each chunk draws system prompts, the target writes a
user request under each, duplicates are dropped, the target answers, and a share of the
conversations (``follow_up_fraction``) get a second user turn and answer (same ``group``, so a
held-out split keeps a conversation's turns together).
"""
from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from ..llm import LLM
from ..sampling_params import SamplingParams
from ..bench.workloads import BenchPrompt
from .magpie import Deduplicator, system_prompts, write_user_turns

PROGRESS = "progress.json"


@dataclass
class AnswerPlan:
    """What the answer pass does: ``prompts`` (fixed sources) or ``num_conversations`` (magpie)."""
    prompts: list[BenchPrompt]
    num_conversations: int
    max_tokens: int
    chunk_size: int
    seed: int
    follow_up_fraction: float = 0.3
    opener_fraction: float = 0.0  # magpie: share of first turns begun with an opening word (magpie.OPENERS)

    @property
    def num_chunks(self) -> int:
        total = len(self.prompts) + self.num_conversations
        return (total + self.chunk_size - 1) // self.chunk_size


class AnswerLog:
    def __init__(self, directory: Path) -> None:
        self.path, self.progress_path = directory / "answers.jsonl", directory / PROGRESS
        progress = json.loads(self.progress_path.read_text()) if self.progress_path.exists() else {}
        self.chunks_done = int(progress.get("chunks_done", 0))
        self.seconds = float(progress.get("seconds", 0.0))
        self.records = [r for r in self._read() if r["chunk"] < self.chunks_done]
        with open(self.path, "w") as f:  # drop an unfinished chunk's records
            f.writelines(json.dumps(r) + "\n" for r in self.records)

    def _read(self) -> list[dict]:
        if not self.path.exists():
            return []
        return [json.loads(line) for line in self.path.read_text().splitlines() if line.strip()]

    def finish_chunk(self, records: list[dict], seconds: float) -> None:
        with open(self.path, "a") as f:
            f.writelines(json.dumps(r) + "\n" for r in records)
        self.records.extend(records)
        self.chunks_done += 1
        self.seconds += seconds
        self.progress_path.write_text(json.dumps({"chunks_done": self.chunks_done, "seconds": self.seconds}))


def answer_all(llm: LLM, plan: AnswerPlan, log: AnswerLog) -> list[dict]:
    """Run the chunks ``log`` has not finished; returns every record."""
    dedup = Deduplicator()
    for record in log.records:
        for message in record.get("messages", []):
            if message["role"] == "user":
                dedup.first_time(message["content"])
    bar = tqdm(total=plan.num_chunks, initial=log.chunks_done, desc="answering (chunks)", unit="chunk")
    for chunk in range(log.chunks_done, plan.num_chunks):
        start = time.perf_counter()
        fixed = plan.prompts[chunk * plan.chunk_size:(chunk + 1) * plan.chunk_size]
        num_magpie = min(plan.chunk_size - len(fixed),
                         len(plan.prompts) + plan.num_conversations - chunk * plan.chunk_size - len(fixed))
        records = answer_fixed(llm, fixed, plan.max_tokens, chunk)
        if num_magpie > 0:
            records += answer_magpie(llm, num_magpie, plan, chunk, dedup)
        log.finish_chunk(records, time.perf_counter() - start)
        bar.update(1)
        bar.set_postfix(answer_tokens=sum(len(r["answer_token_ids"]) for r in log.records))
    bar.close()
    return log.records


def greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0)


def answer_fixed(llm: LLM, prompts: list[BenchPrompt], max_tokens: int, chunk: int) -> list[dict]:
    """Greedy answers of ``prompts`` (chat and raw ones in one pass each), in order."""
    chat = [i for i, p in enumerate(prompts) if p.messages is not None]
    raw = [i for i, p in enumerate(prompts) if p.messages is None]
    outputs = {}
    if chat:
        outputs.update(zip(chat, llm.chat([prompts[i].messages for i in chat], greedy(max_tokens), use_tqdm=False)))
    if raw:
        outputs.update(zip(raw, llm.generate([prompts[i].prompt for i in raw], greedy(max_tokens), use_tqdm=False)))
    return [_record(chunk, f"{chunk}/{i}", prompts[i].name, outputs[i]) for i in range(len(prompts))]


def answer_magpie(llm: LLM, num: int, plan: AnswerPlan, chunk: int, dedup: Deduplicator) -> list[dict]:
    """``num`` self-written conversations: a first turn each, a follow-up for a share of them."""
    rng = random.Random(f"{plan.seed}/{chunk}")
    systems = [[{"role": "system", "content": rng.choice(system_prompts())}] for _ in range(num)]
    turns = write_user_turns(llm, systems, seed=rng.randrange(2 ** 31), opener_fraction=plan.opener_fraction)
    firsts = [[*s, {"role": "user", "content": t}] for s, t in zip(systems, turns)
              if t is not None and dedup.first_time(t)]
    answered = _answer_conversations(llm, firsts, [f"{chunk}/m{i}" for i in range(len(firsts))], plan, chunk)
    follow = [(record, text) for record, text, finished in answered
              if finished and rng.random() < plan.follow_up_fraction]
    threads = [[*record["messages"], {"role": "assistant", "content": text}] for record, text in follow]
    turns = write_user_turns(llm, threads, seed=rng.randrange(2 ** 31))
    seconds = [([*thread, {"role": "user", "content": u}], record["group"])
               for thread, u, (record, _) in zip(threads, turns, follow) if u is not None and dedup.first_time(u)]
    answered += _answer_conversations(llm, [c for c, _ in seconds], [g for _, g in seconds], plan, chunk)
    return [record for record, _, _ in answered]


def _answer_conversations(llm: LLM, conversations: list[list[dict]], groups: list[str], plan: AnswerPlan,
                          chunk: int) -> list[tuple[dict, str, bool]]:
    """(record, answer text, whether the answer ended by itself) per conversation."""
    if not conversations:
        return []
    outputs = llm.chat(conversations, greedy(plan.max_tokens), use_tqdm=False)
    answered = []
    for messages, group, output in zip(conversations, groups, outputs):
        record = {**_record(chunk, group, "magpie", output), "messages": messages}
        answered.append((record, output.outputs[0].text, output.outputs[0].finish_reason == "stop"))
    return answered


def _record(chunk: int, group: str, source: str, output) -> dict:
    return {"chunk": chunk, "group": group, "source": source, "prompt_token_ids": list(output.prompt_token_ids),
            "answer_token_ids": list(output.outputs[0].token_ids)}

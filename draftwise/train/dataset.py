"""Training data for ``draftwise train-draft``: what ``make-data`` wrote, in memory, in padded batches.

``load_dataset(dir)`` reads ``manifest.json`` and every sample's ``token_ids`` [T]; a sample's
``hidden_states`` [T, num_layers, H] (the target's states at the manifest's ``layer_ids``) are
read from its file when a batch needs them, so a dataset larger than memory trains. Answer
tokens start at ``num_prompt_tokens``. The held-out split is by ``group`` (a conversation's
turns stay on one side).

``DraftVocab`` is the reduced draft vocabulary: the ``size`` most frequent answer tokens
(ids sorted), with EAGLE-3's maps ``d2t`` (draft id -> target id offset, int64) and ``t2d``
(bool mask over the target vocabulary). ``Batch`` pads samples on the right to the longest
one; ``loss_mask`` [B, T] marks positions ``q`` whose *next* token is an answer token and
exists (``num_prompt_tokens - 1 <= q <= T - 2``): the positions a drafter is scored on.
"""
from __future__ import annotations

import json
import math
import random
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file

from .make_data import MANIFEST


@dataclass
class Sample:
    token_ids: torch.Tensor  # [T] int64
    path: Path  # safetensors file holding hidden_states
    num_prompt_tokens: int
    group: str
    dtype: torch.dtype = torch.float32

    @property
    def hidden_states(self) -> torch.Tensor:  # [T, num_layers, H]
        return load_file(str(self.path))["hidden_states"].to(self.dtype)


@dataclass
class Dataset:
    manifest: dict
    samples: list[Sample]

    @property
    def layer_ids(self) -> list[int]:
        return list(self.manifest["layer_ids"])

    def layer_index(self, layer_id: int, what: str) -> int:
        if layer_id not in self.manifest["layer_ids"]:
            raise ValueError(f"{what} needs the target's hidden states of layer {layer_id}, but the data has only "
                             f"layers {self.layer_ids}; run make-data with --layer-ids including {layer_id}")
        return self.manifest["layer_ids"].index(layer_id)

    def split(self, held_out_fraction: float, seed: int) -> tuple[list[Sample], list[Sample]]:
        """(train, held_out): a seeded split by group, at least one held-out group when there are two or more."""
        groups = sorted({s.group for s in self.samples})
        random.Random(seed).shuffle(groups)
        num_held = max(1, round(held_out_fraction * len(groups))) if len(groups) > 1 and held_out_fraction > 0 else 0
        held = set(groups[:num_held])
        return [s for s in self.samples if s.group not in held], [s for s in self.samples if s.group in held]


def load_dataset(directory: str | Path, dtype: torch.dtype = torch.float32) -> Dataset:
    directory = Path(directory)
    path = directory / MANIFEST
    if not path.is_file():
        raise ValueError(f"--data {directory}: no {MANIFEST} (make one with `draftwise make-data`)")
    manifest = json.loads(path.read_text())
    samples = []
    for index, entry in enumerate(manifest.get("samples", [])):
        path = directory / entry["file"]
        with safe_open(str(path), "pt") as f:
            token_ids = f.get_tensor("token_ids").long()
        samples.append(Sample(token_ids, path, int(entry["num_prompt_tokens"]), str(entry.get("group", index)),
                              dtype))
    samples = [s for s in samples if len(s.token_ids) - s.num_prompt_tokens >= 1]
    if not samples:
        raise ValueError(f"--data {directory} holds no samples with answer tokens")
    return Dataset(manifest, samples)


@dataclass
class DraftVocab:
    draft_ids: torch.Tensor  # [draft_vocab] target ids, sorted
    vocab_size: int

    @classmethod
    def most_frequent(cls, samples: list[Sample], size: int, vocab_size: int) -> "DraftVocab":
        if not 1 <= size <= vocab_size:
            raise ValueError(f"--draft-vocab-size must be in [1, {vocab_size}] (the target's vocabulary), got {size}")
        order = _by_frequency(_answer_counts(samples, vocab_size))
        return cls(torch.sort(order[:size]).values, vocab_size)

    @classmethod
    def covering(cls, samples: list[Sample], coverage: float, max_size: int, vocab_size: int,
                 held_out: list[Sample] | None = None) -> "DraftVocab":
        """The fewest of ``samples``' most frequent answer tokens that cover ``coverage`` of the answer
        tokens of ``held_out`` (of ``samples`` where there is none), at most ``max_size``."""
        if not 0 < coverage <= 1:
            raise ValueError(f"--draft-vocab-coverage must be in (0, 1], got {coverage}")
        counts = _answer_counts(samples, vocab_size)
        order = _by_frequency(counts)
        rank = torch.empty(vocab_size, dtype=torch.int64)
        rank[order] = torch.arange(vocab_size)
        rank[counts == 0] = vocab_size  # never seen in training: no size covers it
        ranks = torch.sort(rank[_answers(held_out or samples)]).values
        needed = int(ranks[max(0, math.ceil(coverage * len(ranks)) - 1)]) + 1
        return cls(torch.sort(order[:max(1, min(needed, max_size, vocab_size))]).values, vocab_size)

    @classmethod
    def from_d2t(cls, d2t: torch.Tensor, vocab_size: int) -> "DraftVocab":
        return cls(torch.arange(len(d2t)) + d2t, vocab_size)

    @property
    def size(self) -> int:
        return len(self.draft_ids)

    @property
    def d2t(self) -> torch.Tensor:  # [draft_vocab] int64 offsets
        return self.draft_ids - torch.arange(self.size)

    @property
    def t2d(self) -> torch.Tensor:  # [vocab] bool
        mask = torch.zeros(self.vocab_size, dtype=torch.bool)
        mask[self.draft_ids] = True
        return mask

    def to_draft(self, token_ids: torch.Tensor) -> torch.Tensor:
        """Target ids -> draft ids, -1 where a token is outside the draft vocabulary."""
        table = torch.full((self.vocab_size,), -1, dtype=torch.int64, device=token_ids.device)
        table[self.draft_ids.to(token_ids.device)] = torch.arange(self.size, device=token_ids.device)
        return table[token_ids]

    def coverage(self, samples: list[Sample]) -> float:
        """Share of answer tokens inside the draft vocabulary."""
        return float(self.t2d[_answers(samples)].float().mean())


def _answers(samples: list[Sample]) -> torch.Tensor:  # [num_answer_tokens] int64, every sample's answer
    return torch.cat([s.token_ids[s.num_prompt_tokens:] for s in samples])


def _answer_counts(samples: list[Sample], vocab_size: int) -> torch.Tensor:  # [vocab_size] int64
    return torch.bincount(_answers(samples), minlength=vocab_size)[:vocab_size]


def _by_frequency(counts: torch.Tensor) -> torch.Tensor:  # [vocab_size] token ids, most frequent first
    """Ties (e.g. unseen tokens) broken by id, so the choice is reproducible."""
    vocab_size = len(counts)
    return torch.argsort(counts * vocab_size + (vocab_size - 1 - torch.arange(vocab_size)), descending=True)


@dataclass
class Batch:
    token_ids: torch.Tensor  # [B, T] int64, 0 past each sample's end
    hidden_states: torch.Tensor  # [B, T, num_layers, H]
    loss_mask: torch.Tensor  # [B, T] bool: positions whose next token is a scored answer token
    lengths: list[int]

    def to(self, device: torch.device) -> "Batch":
        if device.type == "cpu":
            return self
        return Batch(self.token_ids.to(device, non_blocking=True), self.hidden_states.to(device, non_blocking=True),
                     self.loss_mask.to(device, non_blocking=True), self.lengths)


def make_batch(samples: list[Sample]) -> Batch:
    longest = max(len(s.token_ids) for s in samples)
    loaded = [s.hidden_states for s in samples]
    num, layers, hidden = len(samples), loaded[0].shape[1], loaded[0].shape[2]
    ids = torch.zeros(num, longest, dtype=torch.int64)
    states = torch.zeros(num, longest, layers, hidden, dtype=loaded[0].dtype)
    mask = torch.zeros(num, longest, dtype=torch.bool)
    for b, (s, hidden_states) in enumerate(zip(samples, loaded)):
        length = len(s.token_ids)
        ids[b, :length] = s.token_ids
        states[b, :length] = hidden_states
        mask[b, max(s.num_prompt_tokens - 1, 0):length - 1] = True
    return Batch(ids, states, mask, [len(s.token_ids) for s in samples])


def prefetched(groups: list[list[Sample]], device: torch.device) -> Iterator[Batch]:
    """``make_batch`` of each group on ``device``, the next one read from disk in a thread while
    the caller computes on this one."""
    if not groups:
        return
    with ThreadPoolExecutor(max_workers=1) as pool:
        pending = pool.submit(make_batch, groups[0])
        for following in groups[1:] + [None]:
            batch = pending.result()
            if following is not None:
                pending = pool.submit(make_batch, following)
            yield batch.to(device)


def batches(samples: list[Sample], max_tokens: int, seed: int | None) -> list[list[Sample]]:
    """Groups of samples of similar length with at most ``max_tokens`` padded tokens each;
    group order shuffled by ``seed`` (None: kept in length order, for evaluation)."""
    ordered = sorted(samples, key=lambda s: len(s.token_ids))
    groups, current = [], []
    for s in ordered:
        if current and (len(current) + 1) * len(s.token_ids) > max_tokens:
            groups.append(current)
            current = []
        current.append(s)
    if current:
        groups.append(current)
    if seed is not None:
        random.Random(seed).shuffle(groups)
    return groups

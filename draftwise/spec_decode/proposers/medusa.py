"""``medusa``: extra heads on the target's last hidden state, head ``i`` guessing token ``i + 1`` ahead.

Head ``i`` = residual blocks ``x + SiLU(W x + b)`` then its own lm_head, all
reading the same final-norm hidden state of the target; drafts are each
head's top-1 (a chain, as vLLM). No KV cache and no drafter forward over the
context: the row the target computed at position ``num_tokens - 2`` is all
it reads. With ``speculative_token_tree`` (Medusa's tree attention), node
``(r_1, ..., r_d)`` is head ``d - 1``'s rank-``r_d`` candidate: the heads see
only the root's state, so a node's candidates do not depend on its parent; the
tree's depth may not exceed the head count.

Checkpoints (``model``, a local directory; without ``model``, the target's own
directory): ``medusa_lm_head.safetensors`` or ``medusa_lm_head.pt`` when the
directory has one (heads shipped beside a target's weights), else every weight
file of a directory whose tensors are Medusa heads:
- original FasterDecoding/Medusa: ``medusa_head.{i}.{j}.linear.{weight,bias}``
  for ``j < medusa_num_layers`` and ``medusa_head.{i}.{medusa_num_layers}.weight``
  (the lm_head), or the same names without ``medusa_head.`` (the state dict
  ``medusa_lm_head.pt`` holds); config ``medusa_num_heads``, ``medusa_num_layers``;
- vLLM: ``blocks.{i}.layers.{j}.weight`` (``.bias`` with ``medusa_fc_bias``),
  ``lm_heads.{i}.weight``, and ``token_map`` when ``truncated_vocab_size``
  makes the heads' vocabulary a subset of the target's.
No heads found raises ``ValueError`` saying where heads are looked for.
``num_heads`` (optional) is the head count: it must match the checkpoint's and
bounds and defaults ``num_speculative_tokens``, which otherwise defaults to the
checkpoint's head count and may not exceed it.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from ...validate import PREFIX, check_int
from ..drafter_checkpoint import DrafterCheckpoint, declared_config, load_drafter, tensor_names, weight_files
from ..drafter_modules import check_width, input_dtype, linear, place
from ..drafter_networks import medusa_head
from ..interface import DraftBatch, ProposeBatch, Proposer, ProposerNeeds, register


class MedusaHeads(nn.Module):
    def __init__(self, ckpt: DrafterCheckpoint, hidden: int, vocab: int):
        super().__init__()
        ckpt.tensors = {_named(k): v for k, v in ckpt.tensors.items()}
        original = any(k.startswith("medusa_head.") for k in ckpt.tensors)
        num_heads, num_layers = _count(list(ckpt.tensors), ckpt.what)
        head_vocab = ckpt.get(f"medusa_head.0.{num_layers}.weight" if original else "lm_heads.0.weight").shape[0]
        self.blocks = nn.ModuleList()
        self.lm_heads = nn.ModuleList()
        for i in range(num_heads):
            if original:
                names = [(f"medusa_head.{i}.{j}.linear.weight", f"medusa_head.{i}.{j}.linear.bias")
                         for j in range(num_layers)]
                head = f"medusa_head.{i}.{num_layers}.weight"
            else:
                names = [(f"blocks.{i}.layers.{j}.weight", f"blocks.{i}.layers.{j}.bias") for j in range(num_layers)]
                head = f"lm_heads.{i}.weight"
            self.blocks.append(nn.ModuleList(linear(ckpt, w, hidden, hidden, bias=b) for w, b in names))
            self.lm_heads.append(linear(ckpt, head, head_vocab, hidden))
        if "token_map" in ckpt.tensors:
            token_map = ckpt.get("token_map", (head_vocab,)).to(torch.int64)
        else:
            check_width(ckpt, "the heads' vocabulary size", head_vocab, vocab)
            token_map = torch.arange(vocab)
        self.register_buffer("token_map", token_map, persistent=False)

    def forward(self, hidden: torch.Tensor,  # [num_rows, H]
                num_heads: int, k: int = 1) -> torch.Tensor:  # [num_rows, heads, k] each head's top-k, best first
        dtype = input_dtype(self.lm_heads[0])
        out = []
        for blocks, lm_head in zip(self.blocks[:num_heads], self.lm_heads[:num_heads]):
            logits = lm_head(medusa_head(blocks, hidden.to(dtype)))
            out.append(logits.argmax(dim=-1, keepdim=True) if k == 1 else logits.topk(k, dim=-1).indices)
        return self.token_map[torch.stack(out, dim=1)]


HEADS_FILES = ("medusa_lm_head.safetensors", "medusa_lm_head.pt")  # beside a target's weights
_ORIGINAL = r"medusa_head\.(\d+)\.(\d+)\."
_VLLM = r"blocks\.(\d+)\.layers\.(\d+)\."
MISSING_HEADS = (f"{PREFIX}: method 'medusa' needs Medusa heads: pass {PREFIX}['model'] (a directory with medusa "
                 "heads) or put medusa_lm_head.{pt,safetensors} beside the target")


def _named(name: str) -> str:
    """Original heads as ``medusa_lm_head.pt`` stores them (``{i}.{j}.linear.weight``) get their
    ``medusa_head.`` prefix back."""
    return "medusa_head." + name if re.match(r"\d+\.\d+\.", name) else name


def _count(names: list[str], what: str) -> tuple[int, int]:
    names = [_named(k) for k in names]
    original = any(k.startswith("medusa_head.") for k in names)
    found = [tuple(map(int, m.groups())) for k in names if (m := re.match(_ORIGINAL if original else _VLLM, k))]
    if not found:
        raise ValueError(f"{what} has neither medusa_head.{{i}}.{{j}}.linear.* (original Medusa) nor "
                         "blocks.{i}.layers.{j}.* (vLLM) tensors")
    num_heads = 1 + max(i for i, _ in found)
    num_layers = 1 + max(j for _, j in found)
    if original:
        num_layers = num_layers - 1  # the last index of each head is its lm_head
    return num_heads, num_layers


def heads_files(model: str | None) -> list[Path] | None:
    """The files holding ``model``'s Medusa heads: a ``HEADS_FILES`` file, or None for all the
    directory's weight files (they hold heads, or ``model`` is no directory and loading says so)."""
    if not model:
        raise ValueError(MISSING_HEADS)
    path = Path(model).expanduser()
    if not path.is_dir():
        return None
    for name in HEADS_FILES:
        if (path / name).is_file():
            return [path / name]
    names = [_named(n) for file in weight_files(path) for n in tensor_names(file)]
    if not any(re.match(_ORIGINAL, n) or re.match(_VLLM, n) for n in names):
        raise ValueError(f"{MISSING_HEADS}; {str(path)!r} has no {' or '.join(HEADS_FILES)} and its weights are "
                         "no Medusa heads (medusa_head.{i}.{j}.* or blocks.{i}.layers.{j}.* tensors)")
    return None


@register
class MedusaProposer(Proposer):
    method = "medusa"
    needs = ProposerNeeds(hidden_states=True)
    drafter_in_target = True  # ``model`` defaults to the target's directory (heads beside its weights)
    drafts_trees = True

    @dataclass
    class Options:
        num_heads: int | None = None  # the checkpoint's head count, as a Medusa practitioner's config says it

        def __post_init__(self) -> None:
            if self.num_heads is not None:
                check_int("num_heads", self.num_heads, 1)

    @classmethod
    def check_config(cls, config) -> None:
        num_heads = config.options.num_heads
        declared = _declared_heads(config.model, heads_files(config.model))
        _check_num_heads(num_heads, declared, f"{PREFIX}['model']={config.model!r}")
        _check_num_tokens(_depth(config), num_heads or declared, "the Medusa checkpoint")

    @classmethod
    def default_num_speculative_tokens(cls, options, model) -> int | None:
        files = heads_files(model)
        return options.num_heads or _declared_heads(model, files)

    def __init__(self, config, target):
        super().__init__(config, target)
        ckpt = load_drafter(config.model, self.method, files=heads_files(config.model))
        self.heads = place(MedusaHeads(ckpt, target.hf_config.hidden_size, target.vocab_size), target)
        _check_num_heads(self.options.num_heads, len(self.heads.lm_heads), ckpt.what)
        _check_num_tokens(_depth(config), len(self.heads.lm_heads), ckpt.what)

    @torch.inference_mode()
    def propose(self, batch: ProposeBatch) -> DraftBatch:
        target = batch.target_hidden
        index = {seq.seq_id: i for i, seq in enumerate(target.seqs)} if target is not None else {}
        rows, owners = [], []
        for n, (seq, limit) in enumerate(zip(batch.seqs, batch.max_num_drafts)):
            i = index.get(seq.seq_id)
            if limit <= 0 or i is None:
                continue
            row = target.cu_num_tokens[i] + seq.num_tokens - 2 - target.starts[i]
            if target.cu_num_tokens[i] <= row < target.cu_num_tokens[i + 1]:
                rows.append(row)
                owners.append(n)
        drafts: list[list[int]] = [[] for _ in batch.seqs]
        tree = self.config.token_tree
        if rows:
            limits = [batch.max_num_drafts[n] for n in owners]
            num_heads = max(limits) if tree is None else max(tree.depths[:max(limits)])
            k = 1 if tree is None else tree.max_children
            ids = self.heads(target.hidden_states[torch.tensor(rows)], num_heads, k).tolist()  # [rows, heads, k]
            for n, row_ids, limit in zip(owners, ids, limits):
                if tree is None:
                    drafts[n] = [candidates[0] for candidates in row_ids[:limit]]
                else:
                    drafts[n] = [row_ids[d - 1][r] for d, r in zip(tree.depths[:limit], tree.ranks[:limit])]
        return DraftBatch.from_lists(drafts, parents=list(tree.parents) if tree is not None else None)


def _declared_heads(model: str | None, files: list[Path] | None) -> int | None:
    """The head count a Medusa config declares, else the count in the heads file(s) named."""
    config = declared_config(model)
    value = config.get("medusa_num_heads")
    if value is None and config.get("model_type") == "medusa":
        value = config.get("num_heads")  # vLLM's MedusaConfig
    if value is None and files:
        value = _count([n for file in files for n in tensor_names(file)], f"{PREFIX}['model']={model!r}")[0]
    return value if isinstance(value, int) else None


def _check_num_heads(num_heads: int | None, found: int | None, where: str) -> None:
    if num_heads is not None and found is not None and num_heads != found:
        raise ValueError(f"{PREFIX}['num_heads']={num_heads} is invalid: {where} has {found} Medusa heads")


def _depth(config) -> tuple[str, int]:
    """(the key, the heads the drafts need): one per draft of a chain, one per depth of a tree."""
    if config.token_tree is None:
        return "num_speculative_tokens", config.num_speculative_tokens
    return "speculative_token_tree", config.token_tree.max_depth


def _check_num_tokens(need: tuple[str, int], num_heads: int | None, where: str) -> None:
    key, depth = need
    if num_heads is None or depth <= num_heads:
        return
    if key == "num_speculative_tokens":
        raise ValueError(f"{PREFIX}['num_speculative_tokens']={depth} is invalid: {where} has {num_heads} "
                         "heads (at most one draft per head)")
    raise ValueError(f"{PREFIX}[{key!r}] is {depth} deep, which needs {depth} heads: {where} has {num_heads} "
                     "heads (one per depth)")

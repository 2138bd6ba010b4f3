"""The proposer seam: one protocol every speculative method implements, and its registry.

A proposer turns the state of the running sequences into draft tokens for the
next step. The engine never branches on a method's name: it reads the
proposer's ``needs`` (token ids only, the target's last hidden state, some of
its intermediate hidden states, a KV cache of its own in the shared paged
pool) and gives it exactly that.

Life cycle, once per engine step, after the step's tokens were appended:

1. ``propose(batch)`` for the running sequences that will decode next step.
   ``batch.max_num_drafts[i]`` is already clipped to ``num_speculative_tokens``,
   ``max_model_len`` (the target's, and the drafter's when the config sets one),
   ``max_tokens``, the config's batch-size limits and free KV slots; a proposer
   returns at most that many drafts per sequence (zero is fine: "no draft this
   step"; a proposer that ingests the target's rows still sees them).
2. The engine verifies the drafts in the next target forward and rolls back
   rejected positions (``BlockManager.rollback``). Proposers with their own
   KV cache roll back lazily: ``seq.spec.drafter_num_computed_tokens`` is clipped
   to the positions whose tokens the drafter saw and that were accepted.
3. ``on_finished(seq)`` when a sequence finishes, aborts or is preempted, so
   per-sequence state (trees, caches) is released.

A method is one file in ``draftwise/spec_decode/proposers/`` that subclasses
``Proposer`` and decorates it with ``@register``; its method-specific keys of
``speculative_config`` are the fields of its nested ``Options`` dataclass.
"""
from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import torch

if TYPE_CHECKING:
    from ..paged import KVCacheSpec
    from ..sequence import Sequence
    from .config import SpeculativeConfig


@dataclass(frozen=True)
class ProposerNeeds:
    """What a proposer reads from the target besides token ids."""
    hidden_states: bool = False  # the target's final-norm hidden state of each computed row
    aux_layer_ids: tuple[int, ...] = ()  # inputs of these target layers, for each computed row
    kv_cache: bool = False  # a KV cache of its own, addressed by the sequences' block tables
    kv_reads_next_token: bool = False  # its K/V at position p depends on token p + 1 (EAGLE's input shift)
    # False: it must see the target's states at every prompt position, or keeps per-sequence state
    # outside its KV blocks, so a prefix found in the cache would leave it short: caching turns off.
    prefix_cacheable: bool = True


@dataclass
class TargetInfo:
    """What the engine tells a proposer about the target model and the KV pool."""
    model: Any  # the target DecoderLM (embeddings and lm_head may be shared)
    hf_config: Any
    tokenizer: Any
    device: torch.device
    dtype: torch.dtype
    vocab_size: int
    max_model_len: int
    block_size: int
    tensor_parallel_size: int = 1
    model_path: Any = None  # the target's local directory (MTP layers live in its checkpoint)
    kv_transfer: Any = None  # KVTransferConfig: where extract_hidden_states writes
    executor: Any = None  # the tensor-parallel executor (distributed/executor.py) when tensor_parallel_size > 1
    gguf_weights: str = "dequantized"  # a GGUF drafter's linears as the target's: "quantized" keeps its blocks


@dataclass
class TargetHidden:
    """Hidden states of the target rows computed this step (only when a proposer needs them)."""
    hidden_states: torch.Tensor  # [num_tokens, hidden_size] fp32, final norm applied
    aux_hidden_states: list[torch.Tensor]  # each [num_tokens, hidden_size]
    cu_num_tokens: list[int]  # [num_seqs + 1]: rows of seqs[i] are cu[i]:cu[i+1]
    seqs: list["Sequence"]  # every sequence scheduled this step, in row order
    starts: list[int]  # position of the first row of seqs[i] (rows are consecutive positions)

    def subset(self, seq_ids: set[int]) -> "TargetHidden":
        """The rows of the sequences in ``seq_ids`` alone."""
        keep = [i for i, seq in enumerate(self.seqs) if seq.seq_id in seq_ids]
        spans = [torch.arange(self.cu_num_tokens[i], self.cu_num_tokens[i + 1]) for i in keep]
        rows = torch.cat(spans).to(self.hidden_states.device) if spans else torch.zeros(0, dtype=torch.int64)
        cu = [0]
        for span in spans:
            cu.append(cu[-1] + len(span))
        return TargetHidden(self.hidden_states[rows], [aux[rows] for aux in self.aux_hidden_states], cu,
                            [self.seqs[i] for i in keep], [self.starts[i] for i in keep])


@dataclass
class ProposeBatch:
    seqs: list["Sequence"]
    max_num_drafts: list[int]  # per sequence: the most drafts it may receive this step
    target_hidden: TargetHidden | None = None


_NO_DRAFTS: dict[int, torch.Tensor] = {}  # num_seqs -> an empty [num_seqs, 0] tensor (it holds nothing to change)


@dataclass
class DraftBatch:
    """Drafts for the sequences of a ``ProposeBatch``, in the same order."""
    token_ids: torch.Tensor  # [num_seqs, max_num_drafts] int64 (CPU), -1 past num_draft_tokens
    num_draft_tokens: list[int]
    probs: torch.Tensor | None = None  # [num_seqs, max_num_drafts, vocab] draft distribution, or
    # None: the drafts are one-hot (greedy drafters, ngram, suffix)
    # Optional per sequence: the proposer's estimate that its first i + 1 drafts are all accepted
    # (non-increasing); the engine cuts drafts whose expected gain does not pay for their rows.
    confidence: list[list[float]] | None = None
    # Tree drafts: the parent of each draft (-1: the root), shared by every sequence, which holds a
    # prefix of it (token_tree.py); None: each sequence's drafts are a chain.
    parents: list[int] | None = None

    @classmethod
    def from_lists(cls, drafts: list[list[int]], probs: torch.Tensor | None = None,
                   confidence: list[list[float]] | None = None, parents: list[int] | None = None) -> "DraftBatch":
        nums = [len(d) for d in drafts]
        width = max(nums, default=0)
        if width == 0:  # (most steps of a sequence whose drafts do not pay: no tensor op)
            ids = _NO_DRAFTS.get(len(drafts))
            if ids is None:
                ids = _NO_DRAFTS.setdefault(len(drafts), torch.empty((len(drafts), 0), dtype=torch.int64))
        else:  # one tensor from padded rows (a copy per row would cost more than the step's drafting)
            ids = torch.tensor([d + [-1] * (width - n) for d, n in zip(drafts, nums)], dtype=torch.int64)
        return cls(ids, nums, probs, confidence, parents)


class Proposer(ABC):
    """Base class of every speculative method (see the module docstring for the contract)."""
    method: ClassVar[str]
    needs: ClassVar[ProposerNeeds] = ProposerNeeds()
    drafter_in_target: ClassVar[bool] = False  # True: ``model`` defaults to the target's directory (MTP, Medusa)
    shards_drafter: ClassVar[bool] = False  # True: draft_tensor_parallel_size > 1 shards it over the ranks
    drafts_trees: ClassVar[bool] = False  # True: it drafts config.token_tree (speculative_token_tree)

    @dataclass
    class Options:
        """Method-specific keys of ``speculative_config`` (none by default)."""

    def __init__(self, config: "SpeculativeConfig", target: TargetInfo):
        self.config = config
        self.options = config.options
        self.target = target

    @classmethod
    def default_num_speculative_tokens(cls, options, model: str | None) -> int | None:
        """Used when ``num_speculative_tokens`` is omitted (``model``: the drafter path, if any);
        None makes it required."""
        return None

    @classmethod
    def check_config(cls, config: "SpeculativeConfig") -> None:
        """Method-specific checks of the common keys (e.g. whether ``model`` is required)."""

    def kv_cache_spec(self) -> "KVCacheSpec | None":
        """The shape of this proposer's own KV cache (``needs.kv_cache``), None without one.
        The engine's ``KVPool`` sizes it together with the target's and allocates it."""
        return None

    def warm_up(self, block_manager) -> None:
        """Run the drafter once at start-up (on a throw-away sequence of ``block_manager``), so what a
        first forward sets up is not paid by a request, nor priced as drafting. Nothing by default."""

    def bind_kv_cache(self, kv_cache: torch.Tensor) -> None:
        """Receive the pool's tensor for ``kv_cache_spec``,
        ``[num_layers, 2, num_blocks * block_size, num_kv_heads, head_dim]``."""
        self.kv_cache = kv_cache

    @abstractmethod
    def propose(self, batch: ProposeBatch) -> DraftBatch:
        ...

    def drafting_seconds(self, depth: int) -> float:
        """Seconds this proposer spends per step to draft ``depth`` tokens deep, beyond the work it
        does every step anyway (ingesting the target's rows): its drafter forwards, measured. The
        draft-length policy adds it to the step's cost; lookups (ngram, suffix) cost ~0."""
        return 0.0

    def catch_up_seconds(self, seqs: list["Sequence"]) -> list[float]:
        """Per sequence, the seconds its drafter must first spend on positions it skipped before it
        can draft again (a draft model's K/V of the prompt, or of the steps it was withheld), beyond
        ``drafting_seconds``; paid once, then drafting costs only that. 0 where nothing lags."""
        return [0.0] * len(seqs)

    def observe(self, seq: "Sequence", num_drafts: int, num_accepted: int) -> None:
        """``seq``'s last ``num_drafts`` drafts were verified and ``num_accepted`` of them accepted."""

    def source_stats(self) -> dict:
        """Counters beyond the engine's (e.g. per draft source), merged into ``get_spec_decode_stats``."""
        return {}

    def on_finished(self, seq: "Sequence") -> None:
        """Release any state kept for ``seq`` (finished, aborted or preempted)."""

    def tracked_seq_ids(self) -> set[int]:
        """Sequences this proposer keeps state for (empty once every request has finished)."""
        return set()


_REGISTRY: dict[str, type[Proposer]] = {}


def register(cls: type[Proposer]) -> type[Proposer]:
    if not dataclasses.is_dataclass(cls.Options):
        raise TypeError(f"{cls.__name__}.Options must be a dataclass")
    _REGISTRY[cls.method] = cls
    return cls


def registered_methods() -> list[str]:
    _load_proposers()
    return sorted(_REGISTRY)


def proposer_class(method: str) -> type[Proposer] | None:
    _load_proposers()
    return _REGISTRY.get(method)


def _load_proposers() -> None:
    """Import every module of ``draftwise.spec_decode.proposers`` once, so each registers itself."""
    import importlib
    import pkgutil

    from . import proposers

    for info in pkgutil.iter_modules(proposers.__path__):
        importlib.import_module(f"{proposers.__name__}.{info.name}")

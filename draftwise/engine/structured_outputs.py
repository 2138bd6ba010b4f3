"""The engine's side of structured outputs (``SamplingParams.structured_outputs``).

A constrained request goes through:

1. ``check(params)`` in ``add_request``, before any state changes: the constraint's grammar
   text, or ``ValueError`` naming the field (``structured/grammar.py``); a grammar compiled
   before is not validated again.
2. ``hold(seqs, text)``: with the grammar compiled (a cache hit) every sequence gets its own
   matcher and goes to the scheduler at once; otherwise the grammar compiles on the compiler's
   worker thread while the sequences wait outside the scheduler, so other requests keep
   stepping. ``admit()``, at the start of each step, hands over the sequences whose grammar
   compiled since, and the requests whose grammar failed to build.
3. ``step_masks`` (called by ``ModelRunner``): one token bitmask for the step's rows of
   constrained sequences: row ``j`` of a sequence is its grammar's state after its drafts
   ``[0, j)``; the sampler applies it before sampling and verification. A step without
   constrained sequences computes nothing.
4. ``on_appended(result)`` after the step's tokens were appended: each matcher consumes its
   sequence's new output tokens (accepted drafts and the sampled token; rejected drafts never
   reached it), those of sequences a stop rule just finished included, grammar drafts are
   counted, and a sequence whose grammar is complete finishes with ``finish_reason="stop"``. A
   token the grammar refuses (the masks rule that out) is returned as a ``GrammarRefusal``: the
   engine cuts the output before it and fails the request (``finish_reason="error"``, a 500 on
   the server), so no output ever leaves with text outside its constraint.
5. ``draft(seqs)`` after the proposer, if any, drafted: each constrained sequence's drafts
   become the grammar's (``GrammarState.draft``: forced tokens for free, the proposer's drafts
   where they continue validly, cut at the first the grammar forbids), whether or not the
   engine speculates. A cut draft that carried probabilities leaves its row ``q`` for the
   sampler (``SpecDecodeMetadata.residual_probs``), so sampling stays lossless.
6. ``release(seq)`` when a sequence finishes, aborts or fails.

Preemption keeps a sequence's output tokens, so its matcher stays where it is.
"""
from __future__ import annotations

import functools
import logging
import time
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass, field

import llguidance
import llguidance.hf
import torch
from transformers import PreTrainedTokenizerFast

from ..sampling_params import SamplingParams
from ..sequence import Sequence
from ..structured.bitmask import fill_bitmask
from ..structured.compiler import GrammarCompiler
from ..structured.grammar import grammar_text, validate
from ..structured.matcher import GrammarDraft, GrammarState
from .model_runner import StepResult

logger = logging.getLogger("draftwise")

MAX_GRAMMAR_DRAFTS = 16  # drafts per sequence and step without a speculator (with one: num_speculative_tokens)


@dataclass
class GrammarMasks:
    """What ``step_masks`` gives the model runner for one step."""
    rows: torch.Tensor  # [num_masked] int64 logits rows of the constrained sequences
    bitmask: torch.Tensor  # [num_masked, ceil(vocab / 32)] int32
    residual_probs: list[torch.Tensor | None] | None  # per sampling sequence, the cut draft's q


@dataclass
class _SeqGrammar:
    state: GrammarState
    drafted: GrammarDraft | None = None  # the drafts set for the next step
    draft_ids: list[int] | None = None  # the list given as seq.spec.draft_token_ids
    residual: torch.Tensor | None = None  # [vocab] q of the proposer's draft the grammar cut


@dataclass
class GrammarRefusal:
    """A sequence whose grammar refused one of its emitted tokens."""
    seq: Sequence
    num_valid: int  # its leading output tokens the grammar admits
    reason: str  # llguidance's error

    def error(self) -> RuntimeError:
        first_line = self.reason.splitlines()[0] if self.reason else "no reason given"
        return RuntimeError(f"output token {self.num_valid} is outside the request's structured-output "
                            f"constraint ({first_line})")


@dataclass
class _Waiting:
    seqs: list[Sequence]
    future: Future


@dataclass
class GrammarDraftStats:
    num_draft_tokens: int = 0  # grammar-forced drafts verified
    num_accepted_tokens: int = 0  # of those, accepted
    seconds: float = 0.0  # host time of the steps' grammar work: masks, drafts, advancing the matchers

    def as_dict(self) -> dict:
        return {"grammar_num_draft_tokens": self.num_draft_tokens,
                "grammar_num_accepted_tokens": self.num_accepted_tokens, "grammar_seconds": self.seconds}


def _timed(method):
    """A step method of ``StructuredOutputs`` whose time counts in ``stats.seconds``."""
    @functools.wraps(method)
    def timed(self, *args, **kwargs):
        start = time.perf_counter()
        try:
            return method(self, *args, **kwargs)
        finally:
            self.stats.seconds += time.perf_counter() - start
    return timed


@dataclass
class StructuredOutputs:
    tokenizer: object  # the engine's Hugging Face tokenizer
    vocab_size: int  # the model's logits width
    eos_token_ids: set[int]
    max_model_len: int
    max_drafts: int | None = None  # per sequence and step, proposer's and grammar's together (None: MAX_GRAMMAR_DRAFTS)
    states: dict[int, _SeqGrammar] = field(default_factory=dict)  # seq_id -> its grammar
    waiting: list[_Waiting] = field(default_factory=list)
    stats: GrammarDraftStats = field(default_factory=GrammarDraftStats)
    used: bool = False  # a constrained request was added
    grammar_drafts: bool = True  # False: the grammar validates a proposer's drafts but drafts nothing itself

    def __post_init__(self) -> None:
        self.compiler = GrammarCompiler(self._make_tokenizer)
        self._executor: llguidance.LLExecutor | None = None

    def _make_tokenizer(self) -> llguidance.LLTokenizer:
        width = max(self.vocab_size, len(self.tokenizer))
        return llguidance.hf.from_tokenizer(self.tokenizer, n_vocab=width, eos_token=sorted(self.eos_token_ids))

    # ------------------------------------------------------------------ requests
    def check(self, params: SamplingParams) -> str | None:
        """The grammar text of ``params``' constraint (None without one); ``ValueError`` naming the field."""
        constraint = params.structured_outputs
        if constraint is None:
            return None
        if not isinstance(self.tokenizer, PreTrainedTokenizerFast):
            raise ValueError("SamplingParams.structured_outputs is not supported with this model: its tokenizer "
                             f"({type(self.tokenizer).__name__}) is not a fast tokenizer")
        text = grammar_text(constraint)
        if not self.compiler.knows(text):
            validate(constraint.kind, text)
        return text

    def hold(self, seqs: list[Sequence], text: str | None) -> list[Sequence]:
        """The sequences the scheduler may take now; the others wait for their grammar."""
        if text is None:
            return seqs
        self.used = True
        template = self.compiler.lookup(text)
        if template is None:
            self.waiting.append(_Waiting(list(seqs), self.compiler.submit(text)))
            return []
        for seq in seqs:
            self.states[seq.seq_id] = _SeqGrammar(GrammarState(template.deep_copy()))
        return seqs

    def admit(self) -> tuple[list[Sequence], list[tuple[str, Exception]]]:
        """(sequences whose grammar compiled since the last call, (request id, error) of failed ones)."""
        ready, failed = [], []
        for entry in [w for w in self.waiting if w.future.done()]:
            self.waiting.remove(entry)
            try:
                template = entry.future.result()
            except Exception as exc:  # the grammar validated but does not build with this tokenizer
                failed.append((entry.seqs[0].request_id, exc))
                continue
            for seq in entry.seqs:
                self.states[seq.seq_id] = _SeqGrammar(GrammarState(template.deep_copy()))
            ready.extend(entry.seqs)
        return ready, failed

    def wait_for_compile(self, timeout: float) -> None:
        """Block up to ``timeout`` seconds for a grammar being compiled (an idle engine's step)."""
        if self.waiting:
            wait([w.future for w in self.waiting], timeout, FIRST_COMPLETED)

    def release(self, seq: Sequence) -> None:
        self.states.pop(seq.seq_id, None)
        for entry in self.waiting:
            if seq in entry.seqs:
                entry.seqs.remove(seq)
        self.waiting = [w for w in self.waiting if w.seqs]

    def spec_stats(self) -> dict:
        """``grammar_num_draft_tokens`` and ``grammar_num_accepted_tokens`` once a constrained request ran."""
        return self.stats.as_dict() if self.used else {}

    # ------------------------------------------------------------------ steps
    @_timed
    def step_masks(self, seqs: list[Sequence], drafts: list[list[int]]) -> GrammarMasks | None:
        """The token bitmask of a step's sampling rows (``len(drafts[i]) + 1`` rows per sequence)."""
        if not self.states:
            return None
        entries, rows, residual, first = [], [], [], 0
        for seq, draft in zip(seqs, drafts):
            rec = self.states.get(seq.seq_id)
            if rec is not None:
                entries.append((rec.state.matcher, len(rows), list(draft)))
                rows.extend(range(first, first + len(draft) + 1))
            residual.append(self._residual(seq, rec, draft))
            first += len(draft) + 1
        if not entries:
            return None
        if self._executor is None:
            self._executor = llguidance.LLExecutor()
        bitmask = fill_bitmask(self._executor, entries, len(rows), max(self.vocab_size, len(self.tokenizer)))
        return GrammarMasks(torch.tensor(rows, dtype=torch.int64), bitmask,
                            residual if any(q is not None for q in residual) else None)

    @staticmethod
    def _residual(seq: Sequence, rec: _SeqGrammar | None, draft: list[int]) -> torch.Tensor | None:
        """The cut draft's q, if the drafts set with it are the ones verified, all of them."""
        if rec is None or rec.residual is None or seq.spec.draft_token_ids is not rec.draft_ids:
            return None
        return rec.residual if len(draft) == len(rec.draft_ids) else None

    @_timed
    def on_appended(self, result: StepResult) -> tuple[list[Sequence], list[GrammarRefusal]]:
        """Advance the matchers over every token the step appended, finished sequences' too; return
        the sequences whose grammar completed (``finish_reason="stop"``) and those whose grammar
        refused a token (the masks rule that out: the engine fails their request)."""
        finished, refused = [], []
        for seq, num_drafts, num_accepted in zip(result.seqs, result.num_draft_tokens, result.num_accepted):
            rec = self.states.get(seq.seq_id)
            if rec is None:
                continue
            if num_drafts and rec.drafted is not None:
                verified = rec.drafted.from_grammar[:num_drafts]
                self.stats.num_draft_tokens += sum(verified)
                self.stats.num_accepted_tokens += sum(verified[:num_accepted])
            rec.drafted = None
            num_valid = rec.state.advance(seq.output_token_ids)
            if num_valid is not None:
                refused.append(GrammarRefusal(seq, num_valid, rec.state.error))
            elif seq.finish_reason is None and rec.state.is_done:
                seq.finish_reason, seq.finished_time = "stop", time.time()
                finished.append(seq)
        return finished, refused

    @_timed
    def draft(self, seqs: list[Sequence]) -> list[tuple[Sequence, Exception]]:
        """Replace each running constrained sequence's drafts with the grammar's (``GrammarState.draft``);
        returns the sequences whose drafting raised, with the exception (the engine fails their request)."""
        failed = []
        for seq in seqs:
            rec = self.states.get(seq.seq_id)
            if rec is None or seq.finish_reason is not None:
                continue
            try:
                self._draft_one(seq, rec)
            except Exception as exc:
                seq.spec.clear_drafts()
                failed.append((seq, exc))
        return failed

    def _draft_one(self, seq: Sequence, rec: _SeqGrammar) -> None:
        seq.spec.tree_to_chain()  # the grammar follows one path: a tree keeps its first-choice chain
        proposed = seq.spec.draft_token_ids
        cap = max(self.max_drafts or MAX_GRAMMAR_DRAFTS, len(proposed)) if self.grammar_drafts else len(proposed)
        request_cap = seq.params.num_speculative_tokens  # the request's own cap holds for the grammar's too
        limit = min(cap, seq.num_draft_slots(self.max_model_len), cap if request_cap is None else request_cap)
        out = rec.state.draft(proposed, limit, self.grammar_drafts) if limit > 0 else GrammarDraft()
        self._set_drafts(seq, rec, out, proposed)

    @staticmethod
    def _set_drafts(seq: Sequence, rec: _SeqGrammar, out: GrammarDraft, proposed: list[int]) -> None:
        probs = seq.spec.draft_probs  # [len(proposed), vocab] or None (one-hot drafts)
        common = next((i for i, (a, b) in enumerate(zip(proposed, out.token_ids)) if a != b),
                      min(len(proposed), len(out.token_ids)))
        rec.residual = probs[len(out.token_ids)] if out.cut and probs is not None else None
        num = len(out.token_ids)
        new_probs = None
        if probs is not None and num:  # the proposer's q where its draft is kept, one-hot where the grammar's
            one_hot = torch.nn.functional.one_hot(torch.tensor(out.token_ids, device=probs.device),
                                                  probs.shape[-1]).to(probs.dtype)
            kept = torch.cat([probs[:num], probs.new_zeros(max(0, num - probs.shape[0]), probs.shape[-1])])
            forced = torch.tensor(out.from_grammar, device=probs.device)[:, None]
            new_probs = torch.where(forced, one_hot, kept)
        # A drafter's own K/V holds its drafts' positions: keep only those the final drafts share.
        seq.spec.cut_drafts(out.token_ids, new_probs, seq.num_tokens + common)
        rec.draft_ids = out.token_ids
        rec.drafted = out

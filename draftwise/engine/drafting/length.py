"""How many drafts each sequence gets: only as many as pay for their rows in this batch.

Verifying drafts adds rows to the target forward. Where extra rows are nearly
free (a GPU, bf16 on AMX, a small batch) long drafts cost nothing; on an AVX2
CPU in fp32, or in a batch large enough that the step is compute-bound, each
row costs nearly a token's worth of time, and drafts that will be rejected
make decoding slower than plain. ``DraftLengthPolicy`` prices drafts for the
whole batch with two estimates:

* ``StepCostModel.seconds(num_rows, num_keys)`` (``step_cost.py``): the time
  of a step of that many rows reading that many keys, learned from the
  engine's own steps without prefill. Each row reads its sequence's whole
  context, so a draft of a long sequence costs more than one of a short one
  (though less than its first row, which brought those keys into the caches:
  ``further_key_share``).
* the expected gain of each draft: the chance that it and every draft before
  it are accepted. By default ``alpha ** (j + 1)`` for a sequence's
  ``(j + 1)``-th draft, where ``alpha`` is the sequence's own acceptance rate
  (a decayed count of its verified drafts, ``accepted / tried``, pulled by
  ``PSEUDO`` pseudo-trials towards the method's acceptance on this traffic,
  the policy's ``prior`` below, capped at ``PRIOR``; steps in which a sequence
  got no drafts decay its counts slowly, so a sequence whose drafts failed is
  probed again after a while, sooner where the method does well: EAGLE-3's
  bundled head, accepting ~25% on code edits, was probed at 0.5 and verified
  drafts that 8 sequences could not pay for). A sequence that has verified
  nothing yet starts at the policy's ``prior``, uncapped: what the method
  achieves on this traffic, the decayed acceptance of every verified draft of
  every sequence (from ``PRIOR``).
  With a fixed 0.5, ngram on chat, which accepts ~35-40%, gave every new
  sequence drafts that a 32-sequence batch could not pay for. Proposers that
  estimate it per draft (``DraftBatch.confidence``) refine the choice once
  their drafts are known.

Where nothing is worth drafting the estimates would stop learning, and a
method that fails on some traffic would never be retried on other traffic.
So after ``PROBE_EVERY`` steps in which every draft was withheld, one
sequence gets a single draft: a probe costing one row (and, for a drafter
with its own K/V, catching up on the positions it skipped: the sequence whose
drafter lags least is probed, then the least known), not the whole batch
re-probed at once.

A drafter that keeps its own K/V (a draft model) must first run the positions
it skipped: a new sequence's prompt, the steps it was withheld. That catch-up
is paid once and then serves every later step, so it is weighed against the
steps the sequence has left: a sequence whose catch-up
(``Proposer.catch_up_seconds``) exceeds ``CATCH_UP_SHARE`` of its remaining
tokens' plain decode time gets no drafts, and a probe waits until its
catch-up is at most ``PROBE_SHARE`` of the time spent without drafts since the
last one (a draft model as costly as the target, whose catch-up of a prompt
cost as much as the target's prefill, then never pays it).

``allocate`` then picks the drafts that maximise the batch's expected tokens
per second. Every sequence that decodes yields one token; the base rows
(those decodes) cost ``seconds(base, keys)``; adding ``m`` drafts yields
``sum(gains)`` more tokens for ``seconds(base + m, keys + their keys)`` plus
the proposer's own time to draft that deep (``Proposer.drafting_seconds(depth)``,
measured: a model-based drafter runs a forward per draft, which at one request
can cost more than the rows). Drafts are ranked by gain per second of their
own (a row's share of the step plus its keys): a sequence's gains shrink and
its keys grow with depth, so every prefix of the ranking holds a prefix of
each sequence's drafts, and the best ``m`` is found in one pass. With one sequence this
is the classic rule (draft ``k`` tokens while
``(1 + alpha + ... + alpha^k) / cost(1 + k)`` still rises); in a batch large
enough that rows are not free, speculation steps aside on its own.

With a token tree (``speculative_token_tree``) a sequence's drafts are a breadth-first prefix of
the tree, ``alpha`` is the chance of accepting one more depth (``observe`` is given the depth
verified), and a node at depth ``d`` gains ``alpha ** d`` shared among the tree's nodes of that
depth (made non-increasing along the prefix), so the tree's gains sum to a chain's of its depth.

A batch keeps the drafts it was priced to for the next ``REPRICE_EVERY - 1`` steps while it
stays the same (the same sequences, caps and catch-ups) and no draft was verified: every draft
withheld, or none found by a lookup (ngram finding no match). Its estimates then move by a
few percent a step, and pricing it again every step would cost a share of the very steps
in which speculation gains nothing. The withheld sequences' evidence still fades and the
probe counter still moves on those steps.

The choice only changes speed: verification is lossless whatever the length.
"""
from __future__ import annotations

from collections.abc import Callable
from itertools import accumulate
from typing import NamedTuple

import numpy as np

from ...sequence import Sequence
from ...spec_decode.token_tree import TokenTree
from .step_cost import StepCostModel

FEW_DRAFTS = 16  # up to this many drafts in a batch are priced one by one, more in one numpy pass
PRIOR = 0.5  # acceptance assumed before any draft was verified
PRIOR_PSEUDO = 4.0  # weight of PRIOR in the policy's prior, in trials
PRIOR_DECAY = 0.995  # per verified draft of any sequence
REPRICE_EVERY = 4  # a batch keeps its drafts this many steps, unless it changes or drafts are verified
PROBE_EVERY = 100  # steps that withheld every draft before one sequence gets a probe
PSEUDO = 1.0  # weight of the policy's prior in a sequence's estimate, in trials
DECAY = 0.92  # per verified draft: evidence older than ~12 drafts fades
WITHHELD_DECAY = 0.97  # per step without drafts: a failing sequence is probed again after ~40 steps

CATCH_UP_SHARE = 0.05  # a drafter's catch-up may cost this share of the decode steps left to its sequence
PROBE_SHARE = 0.05  # ... and a probe's, this share of the time spent without drafts since the last probe

DraftingSeconds = Callable[[int], float]  # depth -> the proposer's seconds to draft that deep
CatchUp = list[tuple[float, int]]  # per sequence: (its drafter's catch-up seconds, tokens it may still generate)


def _free(depth: int) -> float:
    return 0.0


class _Priced(NamedTuple):
    """A batch as the policy last priced it."""
    batch: tuple  # (seq ids, max_num_drafts, catch-up seconds)
    chosen: tuple[int, ...]  # drafts per sequence
    step_seconds: float  # the predicted step without drafts


class DraftLengthPolicy:
    def __init__(self, step_cost: StepCostModel, tree: TokenTree | None = None):
        self.step_cost = step_cost
        self.tree = tree
        self.accepted = 0.0  # decayed accepted drafts, over every sequence
        self.tried = 0.0  # decayed trials (as ``observe`` counts them), over every sequence
        self.idle_steps = 0  # steps in a row that withheld every draft
        self.idle_seconds = 0.0  # their predicted time
        self._priced: _Priced | None = None  # the last batch priced
        self._reprice_in = 0  # steps left before that batch is priced again

    @property
    def prices_rows(self) -> bool:
        """False while drafts are free or cannot be priced yet (every draft is then kept)."""
        return self.step_cost.ready and not self.step_cost.free

    def limits(self, seqs: list[Sequence], max_num_drafts: list[int], num_base_rows: int,
               drafting_seconds: DraftingSeconds = _free, catch_up: CatchUp | None = None) -> list[int]:
        """Cut each ``max_num_drafts[i]`` to what ``seqs[i]``'s acceptance rate makes worth
        verifying in a step of ``num_base_rows`` rows before drafts (one decode row per sequence).
        ``catch_up``: per sequence, (seconds its drafter must first spend on skipped positions, the
        tokens it may still generate); a sequence whose catch-up exceeds ``CATCH_UP_SHARE`` of the
        steps left to it gets none (see the module docstring)."""
        if not self.prices_rows:
            return list(max_num_drafts)
        batch = (tuple(seq.seq_id for seq in seqs), tuple(max_num_drafts), tuple(c for c, _ in catch_up or ()))
        if self._reprice_in > 0 and self._priced.batch == batch:  # the same batch, nothing verified since
            self._reprice_in -= 1
            return self._withhold(seqs, max_num_drafts, list(self._priced.chosen), self._priced.step_seconds,
                                  catch_up)
        lens = [seq.num_tokens for seq in seqs]
        step_seconds = self.step_cost.seconds(num_base_rows, sum(lens)) if not self.step_cost.frozen else 0.0
        late = [bool(step_seconds) and seconds > CATCH_UP_SHARE * remaining * step_seconds
                for seconds, remaining in (catch_up or [(0.0, 0)] * len(seqs))]
        gains = [[] if too_late else self._gains(self.alpha(seq), limit)
                 for seq, limit, too_late in zip(seqs, max_num_drafts, late)]
        chosen = self.allocate(gains, num_base_rows, drafting_seconds, lens)
        self._priced, self._reprice_in = _Priced(batch, tuple(chosen), step_seconds), REPRICE_EVERY - 1
        return self._withhold(seqs, max_num_drafts, chosen, step_seconds, catch_up)

    def _withhold(self, seqs: list[Sequence], max_num_drafts: list[int], chosen: list[int], step_seconds: float,
                  catch_up: CatchUp | None) -> list[int]:
        """``chosen`` after the withheld sequences' evidence fades (so each is probed again) and, in a
        step that withheld every draft, the probe counter moves (see ``_probe``)."""
        for seq, num, limit in zip(seqs, chosen, max_num_drafts):
            if num == 0 and limit > 0:
                seq.spec.decay_estimate(WITHHELD_DECAY)
        if any(chosen) or not any(max_num_drafts):
            self.idle_steps, self.idle_seconds = 0, 0.0
        else:
            self._probe(seqs, max_num_drafts, chosen, step_seconds, catch_up)
        return chosen

    def _probe(self, seqs: list[Sequence], max_num_drafts: list[int], chosen: list[int], step_seconds: float,
               catch_up: CatchUp | None) -> None:
        """A step that withheld every draft: after ``PROBE_EVERY`` such steps, one draft for the
        sequence cheapest to probe, once its catch-up is at most ``PROBE_SHARE`` of the idle time."""
        self.idle_steps += 1
        self.idle_seconds += step_seconds
        if self.idle_steps < PROBE_EVERY:
            return
        candidates = [i for i, limit in enumerate(max_num_drafts) if limit > 0]
        best = min(candidates, key=lambda i: _probe_cost(seqs[i]))
        # (a fixed model prices in one-row steps, not seconds: there catch-ups are not weighed)
        if catch_up is None or not step_seconds or catch_up[best][0] <= PROBE_SHARE * self.idle_seconds:
            self.idle_steps, self.idle_seconds = 0, 0.0
            chosen[best] = 1  # one draft
            self._reprice_in = 0  # its verdict is priced next step

    def cut(self, num_drafts: list[int], confidence: list[list[float]], num_base_rows: int,
            context_lens: list[int] | None = None) -> list[int]:
        """Cut proposed drafts to the prefixes worth verifying by the proposer's own ``confidence``
        (``confidence[i][j]``: its estimate that drafts 0..j of sequence i are all accepted)."""
        if not self.prices_rows:
            return list(num_drafts)
        # (the drafts exist: the time spent drafting them is not a reason to cut them)
        return self.allocate([conf[:num] for conf, num in zip(confidence, num_drafts)], num_base_rows,
                             context_lens=context_lens)

    def allocate(self, gains: list[list[float]], num_base_rows: int, drafting_seconds: DraftingSeconds = _free,
                 context_lens: list[int] | None = None) -> list[int]:
        """Drafts per sequence that maximise expected tokens per second (see the module docstring).
        ``gains[i][j]``: expected tokens added by sequence i's (j + 1)-th draft, non-increasing in j.
        ``drafting_seconds(depth)``: the proposer's time to draft that deep (ignored by a fixed
        model, whose unit is a one-row step, not seconds). ``context_lens[i]``: the keys sequence i's
        decode row reads (its draft j reads ``j + 1`` more); None: keys are not priced."""
        lens = context_lens or [0] * len(gains)
        entries = self._ranked(gains, lens, num_base_rows)  # [(gain, depth index j, sequence i)]
        chosen = [0] * len(gains)
        if not entries:
            return chosen
        best = self._best_prefix(entries, len(gains), lens, num_base_rows, drafting_seconds)
        for _, _, i in entries[:best]:
            chosen[i] += 1
        return chosen

    def _best_prefix(self, entries: list[tuple[float, int, int]], num_seqs: int, lens: list[int],
                     num_base_rows: int, drafting_seconds: DraftingSeconds) -> int:
        """How many of the ranked ``entries`` give the most expected tokens per second (the first of
        equal rates: fewer rows). A few are priced one by one, many in one vectorised pass."""
        cost, base, share = self.step_cost, max(1, num_base_rows), self.step_cost.further_key_share
        added_keys = [share * (lens[i] + j + 1) for _, j, i in entries]  # a draft row's keys, in first-row keys
        depths = list(accumulate([0] + [j + 1 for _, j, _ in entries], max))  # deepest draft of each prefix
        tokens = list(accumulate([float(num_seqs)] + [e[0] for e in entries]))
        if len(entries) <= FEW_DRAFTS:  # numpy's per-call cost would exceed the work
            keys = list(accumulate([float(sum(lens))] + added_keys))
            seconds = cost.seconds_list(range(base, base + len(entries) + 1), keys)
        else:
            keys = sum(lens) + np.concatenate(([0.0], np.cumsum(added_keys)))
            seconds = cost.seconds_many(base + np.arange(len(entries) + 1, dtype=np.float64), keys).tolist()
        if not cost.frozen:
            seconds = [t + drafting_seconds(d) for t, d in zip(seconds, depths)]
        rates = [n / t for n, t in zip(tokens, seconds)]
        return rates.index(max(rates))

    def _ranked(self, gains: list[list[float]], lens: list[int], num_base_rows: int) -> list[tuple[float, int, int]]:
        """Every draft with a gain as ``(gain, j, i)``, best gain per second first: its row's share of
        the step (the rows' mean slope over all of them) plus its keys. Ties go to shallower drafts,
        so each sequence's drafts keep their order."""
        entries = [(g, j, i) for i, row in enumerate(gains) for j, g in enumerate(row) if g > 0.0]
        if not entries:
            return []
        cost, base = self.step_cost, max(1, num_base_rows)
        first, last = cost.seconds_list([base, base + len(entries)], [0.0, 0.0])
        row_slope = (last - first) / len(entries)
        key_cost = cost.key_cost * cost.further_key_share
        per_draft = [max(row_slope + key_cost * (lens[i] + j + 1), 1e-12) for _, j, i in entries]
        order = sorted(range(len(entries)), key=lambda e: (-entries[e][0] / per_draft[e], entries[e][1], e))
        return [entries[e] for e in order]

    def _gains(self, alpha: float, num: int) -> list[float]:
        """Expected tokens added by each of a sequence's first ``num`` drafts (chain or tree nodes)."""
        if self.tree is None:
            return _geometric(alpha, num)
        depths = self.tree.depths
        width = {d: depths.count(d) for d in set(depths)}
        gains = [alpha ** d / width[d] for d in depths[:num]]
        return list(np.minimum.accumulate(gains)) if gains else []

    @property
    def prior(self) -> float:
        """The acceptance rate of a sequence that has verified nothing yet: the method's own so far."""
        return (self.accepted + PRIOR * PRIOR_PSEUDO) / (self.tried + PRIOR_PSEUDO)

    def alpha(self, seq: Sequence) -> float:
        # new: the method's own; known (its evidence fading while withheld): probe again at most at PRIOR
        spec = seq.spec
        prior = self.prior if spec.draft_tried == 0.0 else min(PRIOR, self.prior)
        return (spec.draft_accepted + prior * PSEUDO) / (spec.draft_tried + PSEUDO)

    def observe(self, seq: Sequence, num_drafts: int, num_accepted: int) -> None:
        """Record one verified draft: ``num_accepted`` of ``num_drafts`` tokens accepted."""
        tried = num_accepted + (1 if num_accepted < num_drafts else 0)
        seq.spec.estimate(DECAY, num_accepted, tried)
        self.accepted = PRIOR_DECAY * self.accepted + num_accepted
        self.tried = PRIOR_DECAY * self.tried + tried
        self._reprice_in = 0  # new evidence: price the next step


def _probe_cost(seq: Sequence) -> tuple[int, float]:
    """Which sequence to probe first: the one whose drafter lags least (a drafter keeping K/V catches
    up on the positions it skipped before drafting), then the least known."""
    return seq.num_tokens - seq.spec.drafter_num_computed_tokens, seq.spec.draft_tried


def _geometric(alpha: float, num: int) -> list[float]:
    """``[alpha, alpha^2, ..., alpha^num]``: the chance that the first 1..num drafts are all accepted."""
    return [alpha ** (j + 1) for j in range(max(0, num))]

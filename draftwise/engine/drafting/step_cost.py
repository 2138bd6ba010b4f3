"""What a target step costs, as a function of its rows and the keys its decode rows read, learned
from the engine's own steps.

Two decisions price rows against step time: how many drafts are worth verifying
(``length.py``: a draft pays when its expected accepted tokens outweigh
its rows' share of the step) and how much prefill may join a step while other
sequences decode (``scheduler.py``: a prefill chunk must not stretch their
inter-token gap). Both read one ``StepCostModel``:

* ``seconds(num_rows, num_keys)``: the predicted wall time of a step running
  ``num_rows`` rows (tokens of every scheduled sequence, drafts included)
  whose decode and verify rows read ``num_keys`` keys in all (each row reads
  its sequence's whole context: ``decode_keys``). It is ``rows(num_rows) +
  key_seconds * num_keys``. ``rows`` is piecewise linear between knots at 1,
  2, 3, 4, 6, 8, 12, 16, ... rows, made non-decreasing, flat below the first
  known knot and extended with the slope of the last two known knots beyond
  the last one; ``key_seconds`` is measured at start-up. ``num_keys`` counts
  keys in units of a sequence's first row (``decode_keys``): that row streams
  its context from memory, while a sequence's further rows (its drafts) read
  the keys their first row brought into the caches, so each of their keys
  counts ``further_key_share`` of one (measured with speculation, 1 until then).
* ``observe(num_rows, seconds, num_keys)``: one measured step. The two knots
  around ``num_rows`` move towards the measurement less its keys' share
  (shifted along the current slope to each knot), by the running mean of
  their evidence at first and then by an exponential moving average, so the
  model follows load and thermal drift without trusting a single noisy step.

Why keys: a decode row at a long context reads that many keys in each layer,
which on a small CPU can cost more than the rest of its row; a model of rows
alone, seeded at a short context, would price a draft row of a long sequence
as nearly free. Prefill rows (a
chunk's attention runs another kernel, over a causal triangle) are priced by
rows alone: their keys are left out of ``num_keys``.

Start-up seeds it (``step_timing.py``: ``measure_step_seconds``: timed forwards of a throw-away
sequence, the row counts interleaved so a busy moment hits them alike;
``measure_key_seconds``: decode rows of a few throw-away sequences at a short
and a long context; ``measure_further_key_seconds``: one throw-away sequence
verifying several rows at both contexts). The seed gives the curve's shape, a prior worth
``SEED_WEIGHT`` observations at each knot; its level follows the real steps
(``drift``: how much slower or faster they run than the seed predicted, e.g.
on the server's engine thread), so a knot that real steps never reach is
still priced in today's units, and knots they reach are soon their own
measurements; the key cost is the seed's scaled by ``drift``. The
shape differs by machine (on an AVX2 CPU in fp32 the second row costs ~40% of
a step, with AMX rows are nearly free up to dozens, on a GPU up to hundreds),
which is why it is measured and never assumed.

``fixed(row_cost)``: a linear model that ignores observations, each row after
the first costing ``row_cost`` of a one-row step (``DRAFTWISE_VERIFY_ROW_COST``;
tests use 0: rows are free, drafts are never cut and prefill is never held back).
"""
from __future__ import annotations

import bisect
import os
from collections.abc import Iterable
from typing import NamedTuple

import numpy as np

ROW_COST_ENV = "DRAFTWISE_VERIFY_ROW_COST"
MIN_RATE = 0.1  # once a knot has ~10 observations, each new one moves it by 10% of the error
SEED_WEIGHT = 2.0  # the start-up seed counts as this many observations at each knot
DRIFT_RATE = 0.05  # each step moves the drift by 5% of its log ratio once ~20 steps were seen ...
DRIFT_CLIP = 2.0  # ... that ratio clipped to within 2x of the drift: a few stalled steps barely move it
REFIT_EVERY = 8  # observations between two fits of the knots (see _known)


def knots(max_rows: int) -> list[int]:
    """Row counts where the model keeps an estimate: 1, 2, 3, 4, 6, 8, 12, ... up to ``max_rows``."""
    points, base = [1, 2, 3], 4
    while points[-1] < max_rows:
        points += [base, base * 3 // 2]
        base *= 2
    return sorted({min(p, max_rows) for p in points if p <= max_rows} | {max_rows})


class StepCostModel:
    def __init__(self, max_rows: int):
        self.knots = knots(max(1, max_rows))  # [num_knots] row counts
        self.values: list[float | None] = [None] * len(self.knots)  # seconds at each knot, None: unseen
        self.counts = [0.0] * len(self.knots)  # evidence per knot (observations, split between two knots)
        self.prior: list[float | None] = [None] * len(self.knots)  # the seed at each knot, None: unseeded
        self.drift = 1.0  # real steps' time / the seed's prediction (moving geometric mean)
        self.drift_count = 0.0
        self.key_seconds = 0.0  # the seed's seconds per decode key (one row reading one key of its context)
        self.further_key_share = 1.0  # a key read by a sequence's further rows, in first-row keys
        self.frozen = False
        self.num_observed, self.predicted_seconds, self.observed_seconds = 0, 0.0, 0.0  # steps seen once ready
        self.version = 0  # the number of observations folded in
        self._fit: tuple | None = None  # (the version it was fitted at, the fit, its xs and ys as arrays): _known
        self._prior_curve: Curve | None = None  # the seed at every knot

    @classmethod
    def fixed(cls, row_cost: float, max_rows: int) -> "StepCostModel":
        """A model where a step of ``r`` rows costs ``1 + row_cost * (r - 1)``; ``observe`` is a no-op."""
        model = cls(max_rows)
        model.values = [1.0 + row_cost * (k - 1) for k in model.knots]
        model.frozen = True
        return model

    @property
    def ready(self) -> bool:
        """True once two knots are known, so the model can price extra rows."""
        return len(self._known().xs) >= 2

    @property
    def free(self) -> bool:
        """True when extra rows are known to cost nothing (a fixed model with ``row_cost`` 0)."""
        return self.frozen and self.values[-1] <= self.values[0]

    @property
    def key_cost(self) -> float:
        """Seconds per decode key read, in today's units (the seed's, scaled by ``drift``)."""
        return self.key_seconds * self.drift

    def seconds(self, num_rows: float, num_keys: float = 0.0) -> float | None:
        """Predicted wall time of a step of ``num_rows`` rows whose decode rows read ``num_keys``
        keys; None before any step was seen."""
        known = self._known()
        if not known.xs:
            return None
        return known.at(num_rows) + self.key_cost * num_keys  # (scalar: every step prices a few)

    def seconds_list(self, num_rows: Iterable[int], num_keys: Iterable[float]) -> list[float]:
        """``seconds`` of each pair, in plain Python (a few of them: numpy's per-call cost would
        exceed the work; a knot known)."""
        known, key_cost = self._known(), self.key_cost
        return [known.at(rows) + key_cost * keys for rows, keys in zip(num_rows, num_keys)]

    def seconds_many(self, num_rows: np.ndarray,  # [n]
                     num_keys: np.ndarray | float = 0.0) -> np.ndarray:  # [n] (or one count for all)
        """``seconds`` of each entry of ``num_rows`` with ``num_keys``, in one pass (a knot known)."""
        return self._row_seconds(num_rows) + self.key_cost * np.asarray(num_keys, dtype=np.float64)

    def _row_seconds(self, num_rows: np.ndarray) -> np.ndarray:  # [n] -> [n]
        """The rows' part of ``seconds_many``: the knots interpolated, extended past the last one."""
        self._known()
        xs, ys = self._fit[2], self._fit[3]
        out = np.interp(num_rows, xs, ys)  # flat outside [xs[0], xs[-1]]
        if len(xs) >= 2:
            slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
            beyond = num_rows > xs[-1]
            out[beyond] = ys[-1] + slope * (num_rows[beyond] - xs[-1])
        return out

    def max_rows_within(self, seconds: float, limit: int, num_keys: float = 0.0) -> int:
        """The most rows (at least 1, at most ``limit``) a step can run in ``seconds`` under this model,
        its decode rows reading ``num_keys`` keys (rows added beyond them read none)."""
        times = self.seconds_many(np.arange(1, max(1, limit) + 1, dtype=np.float64), num_keys)  # non-decreasing
        return max(1, int(np.searchsorted(times, seconds, side="right")))

    def observe(self, num_rows: int, seconds: float, num_keys: float = 0.0) -> None:
        """Fold one measured step of ``num_rows`` rows, whose decode rows read ``num_keys`` keys, that
        took ``seconds`` into the estimates. The prediction it is scored against and the slope that
        carries it to the knots come from the current fit (the one the step was priced with)."""
        if self.frozen or num_rows < 1 or not seconds > 0.0:
            return
        num_rows = min(num_rows, self.knots[-1])
        known = self._known()
        if known.xs:  # what the model said before it learns from this step
            self.num_observed += 1
            self.predicted_seconds += known.at(num_rows) + self.key_cost * num_keys
            self.observed_seconds += seconds
        if self._prior_curve is not None:
            expected = self._prior_curve.at(num_rows) + self.key_seconds * num_keys
            self.drift_count += 1.0
            ratio = min(max(seconds / expected, self.drift / DRIFT_CLIP), self.drift * DRIFT_CLIP)
            self.drift *= (ratio / self.drift) ** max(1.0 / self.drift_count, DRIFT_RATE)  # a moving geometric mean
        # the rows' share; at least a tenth of the step, should the key cost be overestimated
        seconds = max(seconds - self.key_cost * num_keys, 0.1 * seconds)
        hi = bisect.bisect_left(self.knots, num_rows)
        lo = hi if self.knots[hi] == num_rows else hi - 1
        span = self.knots[hi] - self.knots[lo]
        share_hi = 1.0 if span == 0 else (num_rows - self.knots[lo]) / span
        slope = known.slope(self.knots[lo], self.knots[hi])
        for k, share in ((lo, 1.0 - share_hi), (hi, share_hi)):
            if share <= 0.0:
                continue
            target = seconds + slope * (self.knots[k] - num_rows)  # the measurement carried to this knot
            self.counts[k] += share
            rate = share * max(1.0 / self.counts[k], MIN_RATE)
            value = self.values[k]
            self.values[k] = target if value is None else value + min(1.0, rate) * (target - value)
        self.version += 1

    def seed(self, samples: dict[int, float], key_seconds: float = 0.0,
             further_key_seconds: float | None = None) -> None:
        """Take measured ``{num_rows: seconds}`` as the prior: interpolated at every knot, extended
        past the last sample with the slope of the last two; ``key_seconds`` per decode key; and
        ``further_key_seconds`` per key of a sequence's further rows (None: as a first row's)."""
        self.key_seconds = max(0.0, key_seconds)
        if further_key_seconds is not None and self.key_seconds > 0.0:
            self.further_key_share = min(1.0, max(0.0, further_key_seconds) / self.key_seconds)
        self._fit = None  # a new seed is priced at once
        if not samples:
            return
        xs = np.array(sorted(samples), dtype=np.float64)
        ys = np.array([samples[x] for x in sorted(samples)], dtype=np.float64)
        rows = np.array(self.knots, dtype=np.float64)
        prior = np.interp(rows, xs, ys)
        if len(xs) >= 2:
            beyond = rows > xs[-1]
            prior[beyond] = ys[-1] + max(0.0, (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])) * (rows[beyond] - xs[-1])
        self.prior = [float(p) for p in prior]
        self._prior_curve = Curve(list(self.knots), list(self.prior))

    def snapshot(self, rows: tuple[int, ...] = (1, 2, 8, 32, 128)) -> dict[int, float]:
        """``{num_rows: predicted milliseconds}`` at ``rows`` within the model's range (a fixed
        model: multiples of a one-row step)."""
        if not self._known().xs:
            return {}
        scale = 1.0 if self.frozen else 1e3
        return {r: round(self.seconds(r) * scale, 3) for r in rows if r <= self.knots[-1]}

    def as_stats(self) -> dict:
        """What drafts are priced with, for ``get_spec_decode_stats``: predicted step milliseconds by
        rows now, the key costs, and the mean predicted vs observed time of the steps it learnt from."""
        n = self.num_observed
        return {"spec_decode_step_cost": {
            "step_ms_by_rows": self.snapshot((1, 2, 4, 8, 16)),
            "ms_per_1000_keys": round(self.key_cost * 1e6, 4), "draft_key_share": round(self.further_key_share, 3),
            "num_steps": n, "mean_predicted_ms": round(self.predicted_seconds / n * 1e3, 3) if n else None,
            "mean_observed_ms": round(self.observed_seconds / n * 1e3, 3) if n else None}}

    def describe(self, rows: tuple[int, ...] = (1, 2, 8, 32, 128)) -> str:
        """``rows: ms`` for a log line, e.g. ``1: 19.6 ms, 2: 24.0 ms, ...``."""
        unit = "x a 1-row step" if self.frozen else "ms"
        text = ", ".join(f"{r}: {ms:g} {unit}" for r, ms in self.snapshot(rows).items()) or "not measured yet"
        if self.key_seconds:
            text += (f"; + {self.key_cost * 1e6:.3g} ms per 1000 decode keys read"
                     f" ({self.further_key_share:.2g} of it for a draft row's)")
        return text

    def _estimate(self, k: int) -> float | None:
        """Knot ``k``'s seconds: its measurements blended with the seed scaled by ``drift``."""
        value, prior = self.values[k], self.prior[k]
        if prior is None:
            return value
        prior *= self.drift
        if value is None:
            return prior
        return (self.counts[k] * value + SEED_WEIGHT * prior) / (self.counts[k] + SEED_WEIGHT)

    def _known(self) -> "Curve":
        """``_fit_known``, refitted on first use after a seed and then once ``REFIT_EVERY``
        observations have changed the estimates (each moves a knot by at most a tenth of its error
        once the knot is known, so a fit a few steps old prices as a fresh one would, while the
        draft-length policy and ``observe`` read it every step)."""
        if self._fit is None or self.version - self._fit[0] >= REFIT_EVERY:
            curve = self._fit_known()
            self._fit = (self.version, curve, np.array(curve.xs, dtype=np.float64),
                         np.array(curve.ys, dtype=np.float64))
        return self._fit[1]

    def _fit_known(self) -> "Curve":
        """Known knots with their estimates made non-decreasing in rows. First a weighted isotonic
        fit: knots out of order are pooled, each weighted by its evidence (observations and the
        seed's weight), so a knot few steps visited, its estimate mostly the seed's, yields to a
        well-measured one above it instead of lifting it (a seed timed while another process
        started read 4 rows at 3x one row, and priced every row from 4 to 16 as free). Then a
        knot past the last one that real steps dominate rises at least by the seed's own increment
        from the knot before, in the share the seed has in its estimate: a knot that real steps
        pushed up (under load) must not leave the unvisited knots above it flat, which would price
        every row past it as free."""
        ks, estimates, weights = [], [], []
        for k, count in enumerate(self.counts):
            estimate = self._estimate(k)
            if estimate is not None:
                ks.append(k)
                estimates.append(estimate)
                weights.append(max(1.0, count + (SEED_WEIGHT if self.prior[k] is not None else 0.0)))
        fitted = _isotonic(estimates, weights)
        measured = max((k for k in ks if self.counts[k] >= SEED_WEIGHT), default=-1)  # the last knot data rule
        xs, ys, top, last = [], [], 0.0, None
        for k, y in zip(ks, fitted):
            prior = self.prior[k]
            if k > measured and last is not None and prior is not None and self.prior[last] is not None:
                increment = max(0.0, prior - self.prior[last]) * self.drift
                y = max(y, top + increment * SEED_WEIGHT / (self.counts[k] + SEED_WEIGHT))
            top, last = max(top, y), k
            xs.append(self.knots[k])
            ys.append(top)
        return Curve(xs, ys)


class Curve(NamedTuple):
    """Seconds by row count, piecewise linear: knots ``xs`` (increasing) with values ``ys``."""
    xs: list[int]
    ys: list[float]

    def at(self, x: float) -> float:
        """The knots interpolated at ``x``, flat below the first, extended past the last with the
        slope of the last two (``_row_seconds`` at one row count)."""
        xs, ys = self.xs, self.ys
        if x <= xs[0] or len(xs) == 1:
            return ys[0]
        j = min(bisect.bisect_left(xs, x), len(xs) - 1)  # xs[j - 1] < x <= xs[j], or past the end
        x0, x1 = xs[j - 1], xs[j]
        return ys[j - 1] + (ys[j] - ys[j - 1]) / (x1 - x0) * (x - x0)

    def slope(self, x0: int, x1: int) -> float:
        """Seconds per row between knots ``x0`` and ``x1`` where both lie within the known range
        (0 elsewhere: a measurement past the known range is not carried along an extrapolation)."""
        xs = self.xs
        if x1 == x0 or len(xs) < 2 or x0 < xs[0] or x1 > xs[-1]:
            return 0.0
        return max(0.0, (self.at(x1) - self.at(x0)) / (x1 - x0))


def _isotonic(values: list[float], weights: list[float]) -> list[float]:
    """The non-decreasing sequence closest to ``values`` in weighted least squares (adjacent
    violators pooled into their weighted mean)."""
    pools: list[list[float]] = []  # [mean, weight, number of values]
    for value, weight in zip(values, weights):
        pools.append([value, weight, 1])
        while len(pools) > 1 and pools[-2][0] > pools[-1][0]:
            mean, weight, num = pools.pop()
            last = pools[-1]
            last[0] = (last[0] * last[1] + mean * weight) / (last[1] + weight)
            last[1] += weight
            last[2] += num
    return [mean for mean, _, num in pools for _ in range(int(num))]


def decode_keys(context_lens: list[int], num_rows: list[int], further_key_share: float = 1.0) -> float:
    """Keys read by decode rows, in first-row keys: ``num_rows[i]`` rows of a sequence of
    ``context_lens[i]`` tokens (this step's rows included) each read its whole context, the
    first from memory, each further one at ``further_key_share`` of that."""
    return sum((1 + further_key_share * (n - 1)) * c for n, c in zip(num_rows, context_lens) if n > 0)


def fixed_row_cost() -> float | None:
    """``DRAFTWISE_VERIFY_ROW_COST`` as a number >= 0 (None when unset): each row after the first
    costs that share of a one-row step, and nothing is measured."""
    value = os.environ.get(ROW_COST_ENV)
    if value is None:
        return None
    try:
        cost = float(value)
    except ValueError:
        cost = -1.0
    if not cost >= 0.0:
        raise ValueError(f"{ROW_COST_ENV}={value!r} is invalid: must be a number >= 0 (0 never cuts drafts)")
    return cost

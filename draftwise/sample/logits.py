"""Logit processing and the target draw, shared by plain sampling and verification.

Order of processing (as vLLM): penalties, min-tokens suppression and the grammar's token
bitmask (structured outputs: ``apply_token_bitmask``) on the raw logits (``process_logits``);
greedy rows take the argmax there. Sampled rows then go through temperature, min-p, top-k and
top-p (``target_probs``) and draw with the Gumbel-max trick ``argmax(p / E)``, ``E ~ Exp(1)``
(``draw``). The noise is a pure function of ``(seed, position, token id)``
(``uniform_noise``), so a request with a seed gets the same tokens whatever
else is in the batch, after preemption, and with speculation on.
Everything is batched: no loop over rows or vocabulary.
"""
from __future__ import annotations

import torch

from ..kernels import native
from .metadata import Penalties, SamplingMetadata

_MASK32 = 0xFFFFFFFF
CANDIDATES = (256, 4096)  # tiers of largest logits a row's top-k / top-p is settled from before a full sort


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """lowbias32 integer hash on int64 tensors holding 32-bit values."""
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & _MASK32
    x = x ^ (x >> 15)
    x = (x * 0x846CA68B) & _MASK32
    return x ^ (x >> 16)


def uniform_noise(seeds: torch.Tensor,  # [num_rows] int64
                  positions: torch.Tensor,  # [num_rows] int64
                  num_cols: int, stream: int = 0) -> torch.Tensor:  # [num_rows, num_cols] in (0, 1)
    """Counter-based uniforms: a pure function of (seed, position, column, stream).

    Strictly inside (0, 1) in fp32: 23 random bits centred in their cell, ``(k + 0.5) / 2**23``,
    every value exact (the largest is ``1 - 2**-24``). A uniform that rounded to 1.0 would make
    ``-log(u)`` zero, and ``p / 0`` NaN wherever ``p`` is 0 (a token a grammar or top-k removed),
    which ``argmax`` would pick. On CPU the C++ op computes the same bits in one pass.
    """
    if seeds.device.type == "cpu" and native.load():
        return torch.ops.draftwise_cpu.uniform_noise(seeds, positions, num_cols, stream)
    return uniform_noise_reference(seeds, positions, num_cols, stream)


def uniform_noise_reference(seeds: torch.Tensor, positions: torch.Tensor, num_cols: int,
                            stream: int = 0) -> torch.Tensor:  # [num_rows, num_cols]
    """``uniform_noise`` in torch ops (any device)."""
    key = _mix32((seeds & _MASK32) ^ _mix32((seeds >> 32) & _MASK32))
    key = _mix32((key + positions * 0x9E3779B9 + stream * 0x85EBCA6B) & _MASK32)
    cols = torch.arange(num_cols, device=seeds.device, dtype=torch.int64)
    bits = _mix32(_mix32((key[:, None] ^ (cols[None, :] * 0xC2B2AE35)) & _MASK32))
    return ((bits >> 9).float() + 0.5) * (1.0 / (1 << 23))


def apply_penalties(logits: torch.Tensor, pen: Penalties) -> torch.Tensor:  # [num_rows, vocab]
    rep = pen.repetition[:, None]
    scaled = torch.where(logits > 0, logits / rep, logits * rep)
    logits = torch.where(pen.seen, scaled, logits)
    logits = logits - pen.frequency[:, None] * pen.output_counts
    return logits - pen.presence[:, None] * (pen.output_counts > 0).float()


def apply_top_k_top_p(logits: torch.Tensor,  # [num_rows, vocab]
                      top_k: torch.Tensor | None,  # [num_rows] int64, vocab where off
                      top_p: torch.Tensor | None  # [num_rows] float32, 1.0 where off
                      ) -> torch.Tensor:
    """-inf outside each row's top-k (ties at the k-th value kept) and outside its nucleus: a token
    stays when the mass of the tokens ranked above it is below ``top_p`` (the top token always).
    A row whose kept set lies among its ``CANDIDATES[0]`` largest logits is settled from those
    (``topk``, not a sort of the vocabulary); the rest try the next tier, and the last are sorted
    whole."""
    out = torch.empty_like(logits)
    rows = torch.arange(logits.shape[0], device=logits.device)
    for num in CANDIDATES:
        if num >= logits.shape[1] or not len(rows):
            break
        part, settled = _settle(logits[rows], _take(top_k, rows), _take(top_p, rows), num)
        out[rows[settled]] = part[settled]
        rows = rows[~settled]
    if len(rows):
        out[rows] = _top_k_top_p_sorted(logits[rows], _take(top_k, rows), _take(top_p, rows))
    return out


def _take(values: torch.Tensor | None, rows: torch.Tensor) -> torch.Tensor | None:
    return None if values is None else values[rows]


def _settle(logits: torch.Tensor, top_k: torch.Tensor | None, top_p: torch.Tensor | None,
            num: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(``apply_top_k_top_p``'s rows from the ``num`` largest logits of each, [num_rows] whether that
    was enough: the kept set lies among them, with no tie at the k-th value past them)."""
    num_rows, vocab = logits.shape
    values, ids = logits.topk(num, dim=-1)  # [num_rows, num] descending
    limited = top_k < vocab if top_k is not None else torch.zeros(num_rows, dtype=torch.bool, device=logits.device)
    nucleus = top_p < 1.0 if top_p is not None else torch.zeros_like(limited)
    settled = torch.ones_like(limited)
    if top_k is not None:
        kth = torch.where(limited, values.gather(1, (top_k.clamp(1, num) - 1)[:, None]).squeeze(1), float("-inf"))
        settled &= ~limited | ((top_k < num) & (values[:, -1] < kth))
        values = values.masked_fill(values < kth[:, None], float("-inf"))
    if top_p is not None:
        norm = torch.where(limited, values.logsumexp(dim=-1), logits.logsumexp(dim=-1))
        mass, above = _mass_above(values, norm)
        values = values.masked_fill(nucleus[:, None] & (above >= top_p[:, None]), float("-inf"))
        settled &= limited | ~nucleus | (mass.sum(dim=-1) >= top_p)
    out = torch.full_like(logits, float("-inf")).scatter_(1, ids, values)
    return torch.where((~limited & ~nucleus)[:, None], logits, out), settled


def _mass_above(values: torch.Tensor,  # [num_rows, n] logits in descending order
                norm: torch.Tensor  # [num_rows] their log normalizer
                ) -> tuple[torch.Tensor, torch.Tensor]:  # [num_rows, n] float64 each
    """Each token's probability and the mass ranked above it, in float64: the candidates' prefix
    sums equal a full sort's, so where the nucleus ends does not depend on the path."""
    mass = (values.double() - norm.double()[:, None]).exp()
    return mass, mass.cumsum(dim=-1) - mass


def _top_k_top_p_sorted(logits: torch.Tensor, top_k: torch.Tensor | None,
                        top_p: torch.Tensor | None) -> torch.Tensor:  # [num_rows, vocab]
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    vocab = logits.shape[-1]
    if top_k is not None:
        kth = sorted_logits.gather(1, (top_k.clamp(1, vocab) - 1)[:, None])
        sorted_logits = sorted_logits.masked_fill(sorted_logits < kth, float("-inf"))
    if top_p is not None:
        norm = sorted_logits.logsumexp(dim=-1) if top_k is not None else logits.logsumexp(dim=-1)
        _, above = _mass_above(sorted_logits, norm)
        sorted_logits = sorted_logits.masked_fill((top_p < 1.0)[:, None] & (above >= top_p[:, None]), float("-inf"))
    return torch.empty_like(logits).scatter_(1, order, sorted_logits)


def target_probs(logits: torch.Tensor, meta: SamplingMetadata) -> torch.Tensor:
    """The distribution a sampled row draws from, after temperature/min-p/top-k/top-p."""
    logits = logits / meta.temperature[:, None]
    if meta.min_p is not None:
        probs = logits.softmax(dim=-1)
        floor = meta.min_p[:, None] * probs.max(dim=-1, keepdim=True).values
        logits = logits.masked_fill(probs < floor, float("-inf"))
    if meta.top_k is not None or meta.top_p is not None:
        logits = apply_top_k_top_p(logits, meta.top_k, meta.top_p)
    return logits.softmax(dim=-1)


def apply_token_bitmask(logits: torch.Tensor,  # [num_rows, vocab]
                        rows: torch.Tensor,  # [num_masked] int64 rows the bitmask constrains
                        bitmask: torch.Tensor  # [num_masked, ceil(vocab / 32)] int32, bit set: allowed
                        ) -> torch.Tensor:  # [num_rows, vocab], a new tensor
    """Tokens a row's bitmask does not allow get -inf; rows not in ``rows`` are untouched."""
    vocab = logits.shape[-1]
    shifts = torch.arange(32, dtype=torch.int32, device=logits.device)
    allowed = ((bitmask[:, :, None] >> shifts) & 1).reshape(bitmask.shape[0], -1).bool()  # [num_masked, 32 * W]
    if allowed.shape[1] < vocab:  # tokens past the mask's width are not allowed
        allowed = torch.cat([allowed, allowed.new_zeros(allowed.shape[0], vocab - allowed.shape[1])], dim=1)
    masked = logits[rows].masked_fill(~allowed[:, :vocab], float("-inf"))
    return logits.index_copy(0, rows, masked)


def process_logits(logits: torch.Tensor, meta: SamplingMetadata) -> torch.Tensor:
    """Penalties, min-tokens suppression and the grammar's bitmask: what greedy rows take the argmax of."""
    if meta.penalties is not None:
        logits = apply_penalties(logits, meta.penalties)
    if meta.suppress_rows is not None:
        logits = logits.index_put((meta.suppress_rows, meta.suppress_ids),
                                  torch.tensor(float("-inf"), device=logits.device))
    if meta.grammar_rows is not None:
        logits = apply_token_bitmask(logits, meta.grammar_rows, meta.grammar_bitmask)
    return logits


def draw(processed: torch.Tensor,  # [num_rows, vocab] penalised logits
         meta: SamplingMetadata) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Each row's token as plain decoding draws it ([num_rows] int64), and the target probs
    ([num_rows, vocab]; None when every row is greedy)."""
    token_ids = processed.argmax(dim=-1)
    if meta.all_greedy:
        return token_ids, None
    probs = target_probs(processed, meta)
    exp_noise = -torch.log(uniform_noise(meta.seeds, meta.positions, probs.shape[-1]))
    sampled = (probs / exp_noise).argmax(dim=-1)
    return torch.where(meta.greedy, token_ids, sampled), probs

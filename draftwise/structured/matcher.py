"""``GrammarState``: one sequence's position in its grammar, and the drafts the grammar makes.

The matcher (a copy of the compiled template) has consumed exactly the sequence's output
tokens so far (``num_consumed`` of them): ``advance`` feeds it the tokens a step appended
(accepted drafts, then the sampled token), never a draft before it is accepted, so a
rejected draft never has to be undone and preemption (which keeps the output tokens) leaves
it as it is.

``draft(proposed, limit)`` builds the drafts for the next step from the grammar's state and
a proposer's drafts (``proposed``, possibly empty), at most ``limit`` tokens (``forced=False``
skips 1.: the proposer's drafts, validated, alone):

1. where the grammar admits exactly one continuation, its tokens (``compute_ff_tokens``) are
   drafts, marked as the grammar's;
2. elsewhere the proposer's next draft follows, if the drafts so far are exactly the
   proposer's (its later drafts were conditioned on them) and the grammar admits it; the
   first one it forbids ends the drafts (``cut``: that draft never costs a verify row);
3. then 1. again, and so on.

A draft never completes the grammar: the token after which the matcher stops is left for the
step to sample, so a step's emitted tokens never run past the grammar's end. The matcher is
rolled back to where it was: drafting leaves no trace.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import llguidance


@dataclass
class GrammarDraft:
    token_ids: list[int] = field(default_factory=list)
    from_grammar: list[bool] = field(default_factory=list)  # per draft: forced by the grammar
    cut: bool = False  # the proposer's draft at position len(token_ids) was forbidden


class GrammarState:
    def __init__(self, matcher: llguidance.LLMatcher):
        self.matcher = matcher
        self.num_consumed = 0  # output tokens the matcher has consumed

    @property
    def is_done(self) -> bool:
        """The grammar is complete: it admits no further token (but EOS)."""
        return self.matcher.is_stopped()

    @property
    def error(self) -> str:
        return self.matcher.get_error()

    def advance(self, output_token_ids: list[int]) -> int | None:
        """Consume the output tokens not consumed yet. None if the grammar took them all; else the
        number of output tokens it admits (the refused token's index), and ``error`` says why."""
        new = output_token_ids[self.num_consumed:]
        num = self.matcher.try_consume_tokens(new) if new else 0
        self.num_consumed += num
        if num == len(new):
            return None
        self.matcher.consume_tokens(new[num:num + 1])  # puts the matcher in error: ``error`` names the token
        return self.num_consumed

    def draft(self, proposed: list[int], limit: int, forced: bool = True) -> GrammarDraft:
        out = GrammarDraft()
        matcher = self.matcher
        follows = True  # out.token_ids == proposed[:len(out.token_ids)]
        while len(out.token_ids) < limit and not matcher.is_stopped():
            n = len(out.token_ids)
            ff = matcher.compute_ff_tokens()[:limit - n] if forced else []
            if ff:
                taken = self._take(ff)
                follows = follows and proposed[n:n + len(taken)] == taken
                out.token_ids += taken
                out.from_grammar += [True] * len(taken)
                if len(taken) < len(ff):
                    break
                continue
            if not follows or n >= len(proposed):
                break
            if matcher.try_consume_tokens([proposed[n]]) != 1:
                out.cut = True
                break
            if matcher.is_stopped():  # it would complete the grammar: the step samples it instead
                matcher.rollback(1)
                break
            out.token_ids.append(proposed[n])
            out.from_grammar.append(False)
        if out.token_ids:
            matcher.rollback(len(out.token_ids))
        return out

    def _take(self, tokens: list[int]) -> list[int]:
        """Consume the leading ``tokens`` the grammar admits, short of the one that completes it."""
        num = self.matcher.try_consume_tokens(tokens)
        if num and self.matcher.is_stopped():
            self.matcher.rollback(1)
            num -= 1
        return tokens[:num]

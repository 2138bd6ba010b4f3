"""Structured outputs: constrain a request's tokens to a JSON schema, a regex, a choice or a grammar.

``params.py`` holds what a request asks (``StructuredOutputsParams``), ``grammar.py`` turns it into
an llguidance grammar (and says why llguidance), ``compiler.py`` compiles grammars off the step
loop and caches them, ``matcher.py`` follows one sequence through its grammar and makes the
grammar's drafts, ``bitmask.py`` fills one step's token bitmask. The engine's bookkeeping
(which sequence has which matcher, masks per step, finishing) is ``engine/structured_outputs.py``.
This package imports nothing else of draftwise but ``params.py``.
"""
from .params import StructuredOutputsParams

__all__ = ["StructuredOutputsParams"]

"""Python's automatic garbage collection held off while draftwise imports and a model loads.

Start-up makes hundreds of thousands of objects that live as long as the process (torch's and
transformers' modules, a vocabulary's strings, the model's modules). Each automatic collection
while they are made walks every object made so far; at start-up that costs about a third as much
as the work itself. ``paused_gc()`` turns automatic collection off for a ``with`` block (or a
function, as a decorator) and restores the caller's setting after it: cycles made meanwhile are
collected by the next collection, as they would have been by a later one.
"""
from __future__ import annotations

import contextlib
import gc


@contextlib.contextmanager
def paused_gc():
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()

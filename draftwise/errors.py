"""Errors that end an engine, as opposed to a request.

``EngineDeadError``: a part of the engine outside this process (a tensor-parallel worker, a
data-parallel replica) died or stopped answering. Nothing the engine holds can be trusted after
it: every request in flight is lost, and a step, ``add_request`` or ``abort_request`` raises it
again. The engine has already released what it could (worker processes, process groups) when it
is raised. A server answers 500 to the requests in flight and exits non-zero (a supervisor
restarts it); fault isolation (``engine/fault_isolation.py``) never bisects over it, since no request
causes it.
"""
from __future__ import annotations


class EngineDeadError(RuntimeError):
    """The engine cannot go on; the message says which part died and how."""

"""vLLM's interface: every name a vLLM user passes, and what draftwise does with it.

``engine_args`` is vLLM's ``EngineArgs`` / server flag table (generated from one vLLM release);
``arg_rules`` says what each vLLM-only argument does here; ``engine_flags`` turns them into
``draftwise generate`` / ``serve`` flags; ``spec_shorthands`` folds vLLM's speculative shorthands
and V0 keywords into ``speculative_config``; ``spec_keys`` checks and strips the
``speculative_config`` keys that select nothing here; ``data_parallel_flags`` reads
``--data-parallel-*``; ``request_fields`` the OpenAI / vLLM request fields not implemented.

Invariants: names stay in vLLM's spelling; a value that would change what the user asked for is
refused with a ``ValueError`` naming it, a value that changes nothing is logged at most once; this
package imports no submodule, so loading one table loads no other.
"""

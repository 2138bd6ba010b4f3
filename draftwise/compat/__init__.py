"""Other engines' interfaces, mapped onto draftwise's: one subpackage per engine (``vllm``).

Contract: a compat module holds the tables and rules that say what each of another engine's
arguments, config keys and request fields does here (read with its meaning, accepted as a logged
no-op, or refused with a ``ValueError`` naming it), and strips or translates them before core code
sees them. Compat may import core packages; core packages never import compat. Only the edge does:
``engine/arg_utils.py``, ``cli.py``, ``server/`` and ``config.py`` (``tests/test_layout.py``).
"""

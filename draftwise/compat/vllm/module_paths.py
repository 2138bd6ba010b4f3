"""vLLM's module paths that its own examples import, as aliases of draftwise's modules.

With ``vllm`` swapped for ``draftwise`` in an import, these resolve:

* ``draftwise.v1.metrics.reader`` (``Counter``, ``Gauge``, ``Histogram``, ``Vector``, ``Metric``):
  ``draftwise.metrics.reader``, what ``LLM.get_metrics()`` returns.

(``draftwise.config.kv_transfer`` is draftwise's own module, at vLLM's path.)

``install()`` registers each alias (and the packages above it that draftwise has no module for) in
``sys.modules``; ``import draftwise`` calls it. An alias is the module itself, not a copy.
"""
from __future__ import annotations

import importlib
import sys
import types

ALIASES = {
    "draftwise.v1.metrics.reader": "draftwise.metrics.reader",
}


def install() -> None:
    for alias, target in ALIASES.items():
        module = importlib.import_module(target)
        sys.modules.setdefault(alias, module)
        parent, _, child = alias.rpartition(".")
        _package(parent)
        setattr(sys.modules[parent], child, module)


def _package(name: str) -> None:
    """``name`` importable: an existing module, or an empty package made for the alias below it."""
    if name in sys.modules:
        return
    try:
        importlib.import_module(name)
        return
    except ModuleNotFoundError:
        pass
    parent, _, child = name.rpartition(".")
    _package(parent)
    package = types.ModuleType(name, f"vLLM's package path {name} (aliases: compat/vllm/module_paths.py)")
    package.__path__ = []
    sys.modules[name] = package
    setattr(sys.modules[parent], child, package)

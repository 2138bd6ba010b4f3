"""``EngineArgs``: every engine argument a vLLM user may pass, as vLLM's ``EngineArgs`` carries them.

Fields: ``EngineConfig``'s own arguments (draftwise's defaults), then every other name of vLLM's
``EngineArgs`` (``compat/vllm/engine_args.py``) with vLLM's default. The same set is ``LLM``'s
keywords and the engine flags of ``draftwise generate`` / ``serve`` (``add_cli_args``:
``--foo-bar``, and ``--foo_bar`` as vLLM's parser allows, see ``cli.py``).

``create_engine_config()`` folds the speculative shorthands (``compat/vllm/spec_shorthands.py``),
checks every vLLM-only argument (``compat/vllm/arg_rules.py``: refused with the reason where it
cannot work here, one log line naming the no-ops), and builds the validated ``EngineConfig``
(which strips vLLM's ``speculative_config`` keys, ``config.py``). ``None`` for one of our own
arguments means its default, as it does in vLLM. Unknown names are refused by ``check_names``,
with the closest known names.

    engine_args = EngineArgs.from_cli_args(parser.parse_args())   # after EngineArgs.add_cli_args(parser)
    engine = LLMEngine.from_engine_args(engine_args)              # or LLM(**dataclasses.asdict(engine_args))
"""
from __future__ import annotations

import argparse
import copy
import dataclasses
import difflib
from typing import Any

from ..compat.vllm.arg_rules import log_noops, resolve_vllm_args
from ..compat.vllm.engine_args import VLLM_ENGINE_ARGS
from ..compat.vllm.engine_flags import add_engine_flags, add_vllm_flags, parse_json_flags
from ..compat.vllm.spec_shorthands import CURRENT, LEGACY, LEGACY_NOOPS, fold_speculative_shorthands
from ..config import EngineConfig, RequestLimits

OWN_ARGS = EngineConfig.argument_names()
VLLM_ONLY_ARGS = [name for name in VLLM_ENGINE_ARGS if name not in OWN_ARGS and name not in CURRENT]
# keywords LLM(...) takes beyond EngineArgs' fields: vLLM V0's speculative and engine keywords
LLM_ONLY_KEYWORDS = list(LEGACY) + list(LEGACY_NOOPS)


class _EngineArgsMethods:
    def create_engine_config(self) -> EngineConfig:
        values = fold_speculative_shorthands(dataclasses.asdict(self))
        defaults = {f.name: f.default for f in dataclasses.fields(EngineConfig)}
        own = {name: values[name] for name in OWN_ARGS if values[name] is not None or defaults[name] is None}
        notes = resolve_vllm_args({name: values[name] for name in VLLM_ONLY_ARGS})
        config = EngineConfig(**own)
        if config.gpu_memory_utilization is not None and config.torch_device.type != "cuda":
            notes.append(f"gpu_memory_utilization={config.gpu_memory_utilization!r} (only on a GPU; on "
                         f"{config.torch_device.type} size the KV cache with kv_cache_memory_bytes)")
        log_noops(notes)
        return config

    @staticmethod
    def add_cli_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
        """Add a flag for every field (our own with their help, vLLM's others in their own group)."""
        add_engine_flags(parser, RequestLimits())
        add_vllm_flags(parser, VLLM_ONLY_ARGS + list(CURRENT))
        return parser

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace):
        """The arguments of a namespace parsed by a parser given ``add_cli_args`` (JSON flags parsed)."""
        names = [f.name for f in dataclasses.fields(cls) if hasattr(args, f.name)]
        return cls(**parse_json_flags({name: getattr(args, name) for name in names}))


def _field(name: str, default) -> tuple[str, Any, dataclasses.Field]:
    if isinstance(default, (dict, list)):
        return name, Any, dataclasses.field(default_factory=lambda value=default: copy.deepcopy(value))
    return name, Any, dataclasses.field(default=default)


EngineArgs = dataclasses.make_dataclass(
    "EngineArgs",
    [_field(f.name, f.default) for f in dataclasses.fields(EngineConfig) if f.name in OWN_ARGS]
    + [_field(name, VLLM_ENGINE_ARGS[name][0]) for name in VLLM_ONLY_ARGS + list(CURRENT)],
    bases=(_EngineArgsMethods,), kw_only=True)
EngineArgs.__module__, EngineArgs.__doc__ = __name__, __doc__


def check_names(kwargs: dict, extra: list[str] = ()) -> None:
    """``ValueError`` naming every keyword that is neither an ``EngineArgs`` field nor in ``extra``."""
    known = {f.name for f in dataclasses.fields(EngineArgs)} | set(extra)
    unknown = sorted(set(kwargs) - known)
    if not unknown:
        return
    hints = [f"{name!r} (did you mean {close[0]!r}?)" if (close := difflib.get_close_matches(name, known, 1))
             else repr(name) for name in unknown]
    raise ValueError(f"unknown engine argument(s) {', '.join(hints)}: not among vLLM's EngineArgs nor "
                     "draftwise's (see docs/vllm-compatibility.md)")


def engine_config_from_kwargs(**kwargs) -> EngineConfig:
    """What ``LLM(**kwargs)`` builds: vLLM's older keywords folded, names checked, the config made."""
    check_names(kwargs, LLM_ONLY_KEYWORDS)
    kwargs = fold_speculative_shorthands(kwargs)
    return EngineArgs(**kwargs).create_engine_config()

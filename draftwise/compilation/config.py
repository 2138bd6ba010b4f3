"""``CompilationConfig``: vLLM's ``compilation_config`` keys that apply to draftwise.

Accepted forms (as in vLLM): a dict, a JSON object string, or an int (the
mode, as ``-O3`` sets it). Keys:

* ``mode`` (alias ``level``): 0 / ``NONE`` runs eager; 1 ``STOCK_TORCH_COMPILE``,
  2 ``DYNAMO_TRACE_ONCE`` and 3 ``VLLM_COMPILE`` all compile the target's forward
  (see ``compiled_forward.py``) where its weights are floats; a model on GGUF blocks runs its
  C++ decoder stack instead (``engine/compile_target.py``). ``enforce_eager=True`` always runs
  eager. The default is 0, unlike vLLM's 3: the compile adds tens of seconds to a first start,
  so compiling is asked for (``-O3``), not imposed.
* ``compile_sizes``: token counts that get a graph of their own (static shapes);
  ``"cudagraph_capture_sizes"`` in the list stands for those sizes.
* ``cudagraph_capture_sizes`` / ``max_cudagraph_capture_size``: the bucket sizes a
  batch is padded up to. On a GPU they are the token counts of the CUDA graphs
  (``static_step.py``); with a compiled forward they are compile buckets too (each size
  one static graph); without either, one compiled graph with a dynamic token count
  serves every size.
* ``cudagraph_mode``: ``NONE``, ``PIECEWISE``, ``FULL``, ``FULL_DECODE_ONLY``,
  ``FULL_AND_PIECEWISE``. On a GPU every mode but ``NONE`` captures the target's
  decode batches as full graphs (the forward with its attention); other batches run
  eager, as under ``FULL_DECODE_ONLY``. ``enforce_eager`` captures nothing.
* ``cache_dir``: where inductor keeps its compiled kernels.

Unknown keys and bad values raise ``ValueError`` naming the key and what is allowed.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..validate import check_choice, check_int, parse_json

PREFIX = "compilation_config"
DEFAULT_MODE = 0
MODES = {"NONE": 0, "STOCK_TORCH_COMPILE": 1, "DYNAMO_TRACE_ONCE": 2, "VLLM_COMPILE": 3}
CUDAGRAPH_MODES = ("NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")
KEYS = ("mode", "level", "compile_sizes", "cudagraph_capture_sizes", "max_cudagraph_capture_size",
        "cudagraph_mode", "cache_dir")


@dataclass
class CompilationConfig:
    mode: int | None = None  # None: DEFAULT_MODE
    compile_sizes: list[int] = field(default_factory=list)
    cudagraph_capture_sizes: list[int] | None = None
    max_cudagraph_capture_size: int | None = None
    cudagraph_mode: str | None = None
    cache_dir: str | None = None

    @classmethod
    def from_value(cls, value) -> "CompilationConfig":
        """A dict, a JSON object string, an int mode, a ``CompilationConfig`` or None."""
        if value is None:
            return cls()
        if isinstance(value, cls):
            return value
        if isinstance(value, str):
            value = parse_json(PREFIX, value)
        if isinstance(value, int) and not isinstance(value, bool):
            value = {"mode": value}
        if not isinstance(value, dict):
            raise ValueError(f"{PREFIX} must be a dict, a JSON object or an int mode, got {value!r}")
        unknown = sorted(set(value) - set(KEYS))
        if unknown:
            raise ValueError(f"{PREFIX} key(s) {unknown} unknown; allowed: {list(KEYS)}")
        if "mode" in value and "level" in value and value["mode"] != value["level"]:
            raise ValueError(f"{PREFIX}: 'mode'={value['mode']!r} and its alias 'level'={value['level']!r} differ")
        mode = value.get("mode", value.get("level"))
        return cls(mode=None if mode is None else _mode(mode),
                   compile_sizes=_compile_sizes(value.get("compile_sizes", [])),
                   cudagraph_capture_sizes=_sizes("cudagraph_capture_sizes", value.get("cudagraph_capture_sizes")),
                   max_cudagraph_capture_size=_optional_int("max_cudagraph_capture_size",
                                                            value.get("max_cudagraph_capture_size")),
                   cudagraph_mode=_cudagraph_mode(value.get("cudagraph_mode")),
                   cache_dir=_cache_dir(value.get("cache_dir")))

    def resolved_mode(self, enforce_eager: bool) -> int:
        """0 under ``enforce_eager``; else the mode given, or ``DEFAULT_MODE``."""
        if enforce_eager:
            return 0
        return DEFAULT_MODE if self.mode is None else self.mode

    def bucket_sizes(self) -> list[int]:
        """Token counts that get their own static graph, ascending; empty: one dynamic graph."""
        sizes = set(self.compile_sizes)
        capture = self.cudagraph_capture_sizes
        if capture is None and self.max_cudagraph_capture_size is not None:
            capture = default_capture_sizes(self.max_cudagraph_capture_size)
        if capture is not None:
            cap = self.max_cudagraph_capture_size
            sizes.update(s for s in capture if cap is None or s <= cap)
        return sorted(sizes)

    def captures_cuda_graphs(self, enforce_eager: bool) -> bool:
        """Whether a GPU target captures its decode batches (``cudagraph_mode`` not NONE, not eager)."""
        return not enforce_eager and self.cudagraph_mode != "NONE"

    def capture_sizes(self, default_max: int) -> list[int]:
        """Token counts of the CUDA graphs, ascending: the sizes given (up to the maximum, if given), else
        vLLM's default sizes up to ``max_cudagraph_capture_size`` (default ``default_max``)."""
        cap = self.max_cudagraph_capture_size
        if self.cudagraph_capture_sizes is not None:
            return [s for s in self.cudagraph_capture_sizes if cap is None or s <= cap]
        return default_capture_sizes(cap or default_max)


def default_capture_sizes(max_size: int) -> list[int]:
    """vLLM's default capture sizes: 1, 2, 4, then every multiple of 8 up to ``max_size``."""
    return [s for s in (1, 2, 4) if s <= max_size] + list(range(8, max_size + 1, 8))


def _mode(value) -> int:
    if isinstance(value, str) and value.upper() in MODES:
        return MODES[value.upper()]
    if isinstance(value, str) and value.isdigit():
        value = int(value)
    allowed = sorted(MODES.values()) + list(MODES)
    if isinstance(value, bool) or not isinstance(value, int) or value not in MODES.values():
        raise ValueError(f"{PREFIX}['mode']={value!r} is invalid; allowed: {allowed}")
    return value


def _sizes(key: str, value) -> list[int] | None:
    if value is None:
        return None
    if not isinstance(value, list):
        raise ValueError(f"{PREFIX}[{key!r}]={value!r} is invalid: must be a list of ints >= 1")
    for size in value:
        check_int(key, size, 1, prefix=PREFIX)
    return sorted(set(value))


def _compile_sizes(value) -> list[int]:
    """Ints; the entry ``"cudagraph_capture_sizes"`` is accepted (those sizes are buckets anyway)."""
    if not isinstance(value, list):
        raise ValueError(f"{PREFIX}['compile_sizes']={value!r} is invalid: must be a list of ints >= 1")
    return _sizes("compile_sizes", [s for s in value if s != "cudagraph_capture_sizes"])


def _optional_int(key: str, value) -> int | None:
    if value is not None:
        check_int(key, value, 1, prefix=PREFIX)
    return value


def _cudagraph_mode(value) -> str | None:
    if value is None:
        return None
    check_choice("cudagraph_mode", value.upper() if isinstance(value, str) else value, CUDAGRAPH_MODES,
                 prefix=PREFIX)
    return value.upper()


def _cache_dir(value) -> str | None:
    if value is not None and (not isinstance(value, str) or not value):
        raise ValueError(f"{PREFIX}['cache_dir']={value!r} is invalid: must be a non-empty path string")
    return value or None

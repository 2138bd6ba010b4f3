"""Engine configuration: the validated form of the ``LLM(...)`` / ``draftwise serve`` arguments.

``EngineConfig`` holds draftwise's own arguments (``argument_names``); ``EngineArgs``
(``engine/arg_utils.py``) adds the rest of vLLM's and builds it, and ``from_kwargs`` builds it
from our arguments alone. Both reject unknown arguments and invalid values with a ``ValueError``
naming the argument; the config resolves the ``"auto"`` choices (dtype, device) for this machine.

This module is an edge (``tests/test_layout.py``): every ``speculative_config`` reaches the core
``SpeculativeConfig`` through ``EngineConfig``, so vLLM's keys that select nothing here are checked
and removed here (``compat.vllm.spec_keys.strip_vllm_keys``), once, whether the config was built
by ``EngineArgs`` or directly.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..compat.vllm.spec_keys import strip_vllm_keys
from ..compilation.config import CompilationConfig
from ..distributed.executor import resolve_backend
from ..sample.verify.config import RejectionSamplerConfig
from ..spec_decode.config import SpeculativeConfig
from .kv_transfer import KVTransferConfig

_DTYPES = {"float32": torch.float32, "fp32": torch.float32, "float": torch.float32,
           "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
           "float16": torch.float16, "fp16": torch.float16, "half": torch.float16}
_DEVICES = ("auto", "cpu", "cuda")
BLOCK_SIZE = 16


@dataclass(frozen=True)
class RequestLimits:
    """Per-request caps that protect the pool (``EngineConfig`` fields of the same names; checked by
    ``engine/request_checks.py``)."""
    max_n: int = 128  # sequences per request (each holds KV blocks)
    max_logprobs: int = 20  # vLLM's name and default: top logprobs per token
    max_stop_strings: int = 64
    max_stop_string_length: int = 1024  # characters; streams hold back this much text


QUANTIZATIONS = (None, "gguf", "q8_0", "q4_0", "q4_1")  # None / "gguf": the checkpoint's own weights


@dataclass(slots=True)
class EngineConfig:
    # a local Hugging Face directory, a .gguf file, or a bundled name; None: SmolLM2-135M-Instruct
    model: str | None = None
    tokenizer: str | None = None  # a directory with the tokenizer files; None: the model's own
    # "auto" (bf16 on GPUs and CPUs with native bf16, else fp32), "float32", "bfloat16", "float16" or a torch.dtype
    dtype: str | torch.dtype = "auto"
    # weight-only quantization of the layer linears and the head at load, on CPU (models/quantize.py);
    # None or "gguf": a GGUF file's own blocks where the model is one, the checkpoint's floats otherwise
    quantization: str | None = None
    seed: int = 0  # keys the sampling noise of requests without a seed of their own
    max_model_len: int | None = None  # prompt + output tokens per sequence; None: the model's context length
    max_num_seqs: int = 256  # sequences in one step's batch
    max_num_batched_tokens: int | None = None  # tokens in one step (prefill chunks included); None: chosen
    kv_cache_memory_bytes: int | None = None  # the paged KV cache; None: a quarter of free memory, at most 2 GiB
    enforce_eager: bool = False  # no compiled or captured graphs (vLLM's argument)
    enable_prefix_caching: bool | None = None  # None: on (as in vLLM) where the method allows it
    async_scheduling: bool = False  # overlap a step's forward with the previous step's output building
    disable_log_stats: bool = False  # no periodic throughput / acceptance log lines (vLLM's argument)
    gpu_memory_utilization: float | None = None  # on a GPU: the share of its memory for weights and KV cache
    # LLM.get_default_sampling_params: "auto" (the model's generation_config.json), "vllm" (none) or a
    # directory holding one; override_generation_config's keys win over it
    generation_config: str = "auto"
    override_generation_config: dict | None = None  # sampling defaults that win over generation_config's
    # while sequences decode, a step with prefill may take at most this many times the decode-only step
    # (predicted by the step-cost model); None: prefill chunks fill max_num_batched_tokens, as in vLLM
    decode_stall_factor: float | None = None
    # torch.compile of the target: a dict, a JSON string or an optimization level (0-3, as -O3)
    compilation_config: dict | str | int | CompilationConfig | None = None
    tensor_parallel_size: int = 1  # ranks the target's layers are split across (torch.distributed)
    distributed_executor_backend: str | None = None  # "mp" (default for N > 1), "ray", "uni" (one rank)
    speculative_config: dict | str | None = None  # the method and its keys (docs/speculative-decoding.md)
    # gguf_weights, grammar_drafts, rejection_sampler_config (block / entropy verify)
    additional_config: dict | None = None
    # ExampleHiddenStatesConnector: where extract_hidden_states writes each request's states
    kv_transfer_config: dict | KVTransferConfig | None = None
    device: str = "auto"  # "cpu", "cuda" or "auto" (CUDA where present)
    block_size: int = BLOCK_SIZE
    # per-request caps that protect the pool (engine/request_checks.py)
    max_n: int = RequestLimits.max_n  # n (parallel samples) per request
    max_logprobs: int = RequestLimits.max_logprobs  # top logprobs per token (vLLM's name and default)
    max_stop_strings: int = RequestLimits.max_stop_strings  # stop strings per request
    max_stop_string_length: int = RequestLimits.max_stop_string_length  # characters per stop string
    # Derived: the validated speculative and compilation configs; the verify rules that act at its draft length
    # (additional_config["rejection_sampler_config"]); the model path resolved by the engine.
    speculative: SpeculativeConfig | None = field(default=None, repr=False)
    kv_transfer: KVTransferConfig | None = field(default=None, repr=False)
    compilation: CompilationConfig = field(default_factory=CompilationConfig, repr=False)
    rejection_sampler: RejectionSamplerConfig = field(default_factory=RejectionSamplerConfig, repr=False)
    model_path: Path | None = field(default=None, repr=False)

    @classmethod
    def argument_names(cls) -> list[str]:
        """The fields a user sets (``LLM`` keywords, ``serve`` flags); the rest are derived."""
        derived = {"model_path", "block_size", "speculative", "kv_transfer", "rejection_sampler", "compilation"}
        return [f.name for f in dataclasses.fields(cls) if f.name not in derived]

    @classmethod
    def from_kwargs(cls, **kwargs) -> "EngineConfig":
        known = set(cls.argument_names())
        unknown = sorted(set(kwargs) - known)
        if unknown:
            raise ValueError(f"unknown argument(s) {unknown}; allowed: {sorted(known)}")
        return cls(**kwargs)

    def __post_init__(self) -> None:
        _int_at_least("seed", self.seed, 0)
        _int_at_least("max_num_seqs", self.max_num_seqs, 1)
        for name in ("max_model_len", "max_num_batched_tokens", "kv_cache_memory_bytes"):
            if getattr(self, name) is not None:
                _int_at_least(name, getattr(self, name), 1)
        _int_at_least("tensor_parallel_size", self.tensor_parallel_size, 1)
        for name in ("max_n", "max_stop_strings", "max_stop_string_length"):
            _int_at_least(name, getattr(self, name), 1)
        _int_at_least("max_logprobs", self.max_logprobs, 0)
        resolve_backend(self.distributed_executor_backend, self.tensor_parallel_size)
        if self.enable_prefix_caching is not None and not isinstance(self.enable_prefix_caching, bool):
            raise ValueError(f"enable_prefix_caching must be True, False or None, got {self.enable_prefix_caching!r}")
        if self.decode_stall_factor is not None and not _is_number(self.decode_stall_factor, 1.0):
            raise ValueError(f"decode_stall_factor must be a number >= 1 or None (no bound), "
                             f"got {self.decode_stall_factor!r}")
        if self.gpu_memory_utilization is not None and not _is_number(self.gpu_memory_utilization, 0.0, 1.0) \
                or self.gpu_memory_utilization == 0:
            raise ValueError(f"gpu_memory_utilization={self.gpu_memory_utilization!r} is invalid: must be a "
                             "number in (0, 1] or None")
        if not isinstance(self.generation_config, str) or not self.generation_config:
            raise ValueError(f"generation_config={self.generation_config!r} is invalid: must be 'auto', 'vllm' "
                             "or a directory holding a generation_config.json")
        if self.override_generation_config is not None and not isinstance(self.override_generation_config, dict):
            raise ValueError(f"override_generation_config={self.override_generation_config!r} must be a dict")
        for name in ("async_scheduling", "disable_log_stats", "enforce_eager"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}")
        if self.quantization not in QUANTIZATIONS:
            raise ValueError(f"quantization={self.quantization!r} is invalid; allowed: {list(QUANTIZATIONS)} "
                             "(weight-only quantization at load, on CPU; the only quantized checkpoints read are "
                             "GGUF files)")
        if self.device not in _DEVICES:
            raise ValueError(f"device={self.device!r} is invalid; allowed: {list(_DEVICES)}")
        if self.device == "cuda" and not torch.cuda.is_available():
            raise ValueError("device='cuda' was requested but no CUDA device is available")
        if not isinstance(self.dtype, torch.dtype) and self.dtype != "auto" and self.dtype not in _DTYPES:
            raise ValueError(f"dtype={self.dtype!r} is invalid; allowed: ['auto', {', '.join(map(repr, _DTYPES))}]")
        _check_additional_config(self.additional_config)
        self.compilation = CompilationConfig.from_value(self.compilation_config)
        if self.kv_transfer_config is not None:
            self.kv_transfer = KVTransferConfig.from_value(self.kv_transfer_config)
        if self.speculative_config is not None:
            self.speculative = SpeculativeConfig.from_value(strip_vllm_keys(self.speculative_config),
                                                            self.tensor_parallel_size, target_model=self.model)
        verify = RejectionSamplerConfig.from_value((self.additional_config or {}).get("rejection_sampler_config"))
        if self.speculative:
            verify = verify.for_num_speculative_tokens(self.speculative.num_speculative_tokens)
        self.rejection_sampler = verify
        if self.speculative and self.speculative.token_tree is not None:
            _check_tree_engine(self.tensor_parallel_size, verify)

    @property
    def request_limits(self) -> RequestLimits:
        return RequestLimits(self.max_n, self.max_logprobs, self.max_stop_strings, self.max_stop_string_length)

    @property
    def torch_device(self) -> torch.device:
        if self.device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        return torch.device(self.device)

    @property
    def default_gguf_weights(self) -> str:
        """A GGUF model's linears keep the file's blocks unless a float ``dtype`` was asked for."""
        return "quantized" if self.dtype == "auto" else "dequantized"

    @property
    def torch_dtype(self) -> torch.dtype:
        if isinstance(self.dtype, torch.dtype):
            return self.dtype
        if self.dtype != "auto":
            return _DTYPES[self.dtype]
        return torch.bfloat16 if _bf16_is_fast(self.torch_device) else torch.float32


def _check_tree_engine(tensor_parallel_size: int, verify: RejectionSamplerConfig) -> None:
    """What a draft token tree runs with: one rank, the standard verification rule."""
    if tensor_parallel_size > 1:
        raise ValueError("speculative_config['speculative_token_tree'] needs tensor_parallel_size=1 (tree "
                         f"verification under tensor parallelism is not built), got {tensor_parallel_size}")
    if verify.enable_block_verify or verify.enable_entropy_verify:
        raise ValueError("speculative_config['speculative_token_tree'] verifies with the standard rule: "
                         "additional_config['rejection_sampler_config'] enable_block_verify and "
                         "enable_entropy_verify must be False with a tree")


# rejection_sampler_config: sample/verify/config.py; grammar_drafts (default True): the grammar of a structured
# output drafts the tokens it forces (engine/structured_outputs.py); gguf_weights: "quantized" (a GGUF model's
# linears keep the file's blocks on CPU, models/gguf_blocks.py; the default with dtype "auto") or "dequantized"
# (the default where a float dtype is named)
_ADDITIONAL_KEYS = {"rejection_sampler_config": dict, "grammar_drafts": bool, "gguf_weights": str}
_ADDITIONAL_VALUES = {"gguf_weights": ("quantized", "dequantized")}


def _check_additional_config(extra) -> None:
    if extra is None:
        return
    if not isinstance(extra, dict):
        raise ValueError(f"additional_config must be a dict, got {type(extra).__name__}")
    for key, value in extra.items():
        if key not in _ADDITIONAL_KEYS:
            raise ValueError(f"additional_config key {key!r} is unknown; allowed: {sorted(_ADDITIONAL_KEYS)}")
        if not isinstance(value, _ADDITIONAL_KEYS[key]):
            raise ValueError(f"additional_config[{key!r}]={value!r} must be a {_ADDITIONAL_KEYS[key].__name__}")
        if key in _ADDITIONAL_VALUES and value not in _ADDITIONAL_VALUES[key]:
            raise ValueError(f"additional_config[{key!r}]={value!r} is invalid; "
                             f"allowed: {list(_ADDITIONAL_VALUES[key])}")


def _int_at_least(name: str, value, lo: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < lo:
        raise ValueError(f"{name}={value!r} is invalid: must be an int >= {lo}")


def _is_number(value, lo: float, hi: float = float("inf")) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and lo <= value <= hi


def _bf16_is_fast(device: torch.device) -> bool:
    """bf16 pays off on GPUs and on CPUs with native bf16 matmul (AVX512-BF16 or AMX)."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags

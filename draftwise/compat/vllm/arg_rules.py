"""vLLM's engine arguments that have no field in ``EngineConfig``: what each one does in draftwise.

``VLLM_ENGINE_ARGS`` (``engine_args.py``, generated from vLLM's ``EngineArgs``) gives every name
its vLLM default and type. ``resolve_vllm_args(values)`` checks each given value's type (a wrong
type is a ``ValueError`` naming the argument), then sorts it into one of two kinds:

* accepted only at the values that work here (``ACCEPTED``): ignoring another value would change
  what the user asked for (LoRA adapters, a quantized KV cache, pipeline stages, a pooling model),
  so it is refused with the reason;
* the rest are no-ops on these models and this hardware; a value other than vLLM's default gives
  one log line naming the argument and why it changes nothing (``noop_reason``).

``FRONTEND_ACCEPTED`` and ``resolve_vllm_args(values, frontend=True)`` do the same for the server's
own vLLM flags (``VLLM_FRONTEND_ARGS``: TLS, CORS, tool parsers, ...), which ``draftwise serve`` takes.

Arguments with a meaning here are ``EngineConfig`` fields of their own (``gpu_memory_utilization``,
``generation_config``, ``disable_log_stats``, ...) or speculative shorthands (``spec_shorthands.py``);
they never reach this module.
"""
from __future__ import annotations

import dataclasses
import fnmatch
import logging

from .engine_args import VLLM_ENGINE_ARGS, VLLM_FRONTEND_ARGS, VLLM_VERSION

logger = logging.getLogger("draftwise")

_NOT_HERE = "the models draftwise loads have none"

# name: (the values that work here, why another value cannot)
ACCEPTED: dict[str, tuple[tuple, str]] = {
    "pipeline_parallel_size": ((1,), "pipeline parallelism is not supported"),
    "data_parallel_size": ((1,), "data parallelism is a `draftwise serve` feature (--data-parallel-size N runs N "
                                 "engine replicas behind one server); LLM and generate run one engine"),
    "enable_lora": ((False,), "LoRA adapters are not supported"),
    "quantization_config": ((None,), "the only quantized checkpoints supported are GGUF files"),
    "kv_cache_dtype": (("auto",), "the KV cache is kept in the model's dtype (another would change outputs)"),
    "tokenizer_mode": (("auto", "hf", "slow"), "tokenizers load with Hugging Face's AutoTokenizer"),
    "load_format": (("auto", "safetensors", "pt", "gguf"), "weights load from safetensors or GGUF files"),
    "runner": (("auto", "generate"), "draftwise runs generative models only"),
    "convert": (("auto", "none"), "draftwise runs generative models only"),
    "pooler_config": ((None,), "draftwise runs generative models only"),
    "skip_tokenizer_init": ((False,), "every output is detokenized (token-id prompts need no flag)"),
    "hf_overrides": (({}, None), "overriding the model's config is not supported"),
    "model_class_overrides": (({}, None), "overriding the model's classes is not supported"),
    "hf_config_path": ((None,), "the config is read from the model's own directory"),
    "logits_processors": ((None, []), "custom logits processors are not supported"),
    "logprobs_mode": (("raw_logprobs",), "logprobs are the model's raw log-probabilities"),
    "scheduling_policy": (("fcfs",), "requests are scheduled first come, first served (no priorities)"),
    "reasoning_parser": (("", None), "reasoning parsers are not supported"),
    "reasoning_parser_plugin": ((None, ""), "reasoning parsers are not supported"),
    "disable_sliding_window": ((False,), "attention keeps the model's sliding window"),
    "worker_cls": (("auto",), "custom worker classes are not supported"),
    "worker_extension_cls": (("",), "custom worker classes are not supported"),
    "scheduler_cls": ((None,), "custom scheduler classes are not supported"),
    "block_size": ((None, 16), "the paged KV cache uses 16-token blocks"),
    "enable_prompt_embeds": ((False,), "prompts are text or token ids"),
    "enable_sleep_mode": ((False,), "sleep mode (LLM.sleep / LLM.wake_up) is not supported"),
    "kv_sharing_fast_prefill": ((False,), "it changes outputs; draftwise's speedups never do"),
    "watermark_config": ((None,), "watermarking is not supported"),
    "diffusion_config": ((None,), "diffusion models are not supported"),
    "model_weights": (("",), "weights are read from the model's own directory"),
}

_NO_TLS = "TLS is not terminated by draftwise: put a TLS proxy in front"
_NO_CORS = "CORS headers are not served"
_NO_TOOLS = ("tool_choice='auto' needs a tool-call parser for the model's own format, which draftwise does not "
             "have (tool_choice='required' and named functions work without these flags)")
# the server's own vLLM flags (FrontendArgs), as ACCEPTED above
FRONTEND_ACCEPTED: dict[str, tuple[tuple, str]] = {
    "lora_modules": ((None, []), "LoRA adapters are not supported"),
    "chat_template": ((None,), "a server-wide chat template is not supported yet: the model's own is used "
                               "(per request: --trust-request-chat-template)"),
    "chat_template_content_format": (("auto",), "message content is rendered as the model's template expects"),
    "default_chat_template_kwargs": ((None, {}), "default chat template kwargs are not supported yet"),
    "response_role": (("assistant",), "replies have the role 'assistant'"),
    "return_tokens_as_token_ids": ((False,), "logprobs name tokens by their text"),
    "enable_auto_tool_choice": ((False,), _NO_TOOLS), "tool_call_parser": ((None,), _NO_TOOLS),
    "tool_parser_plugin": (("",), _NO_TOOLS), "tool_server": ((None,), _NO_TOOLS),
    "enable_force_include_usage": ((False,), "usage is sent when a request asks for it"),
    "enable_per_request_metrics": ((False,), "per-request timing metrics are not supported"),
    "enable_tokenizer_info_endpoint": ((False,), "/tokenizer_info is not served"),
    "uds": ((None,), "the server listens on --host and --port"), "grpc_port": ((None,), "no gRPC server"),
    "ssl_keyfile": ((None,), _NO_TLS), "ssl_certfile": ((None,), _NO_TLS), "ssl_ca_certs": ((None,), _NO_TLS),
    "ssl_ciphers": ((None,), _NO_TLS), "ssl_cert_reqs": ((0,), _NO_TLS), "enable_ssl_refresh": ((False,), _NO_TLS),
    "root_path": ((None,), "serving under a path prefix is not supported"),
    "middleware": (([],), "custom middleware is not supported"),
    "allowed_origins": (([],), _NO_CORS), "allow_credentials": ((False,), _NO_CORS),
    "allowed_methods": ((None,), _NO_CORS), "allowed_headers": ((None,), _NO_CORS),
}

# (patterns of names, why they change nothing here); the first match wins
_NOOP_REASONS: tuple[tuple[tuple[str, ...], str], ...] = (
    (("trust_remote_code",), "draftwise never runs code from a model directory: its architectures are built in"),
    (("revision", "code_revision", "tokenizer_revision", "download_dir", "hf_token", "config_format",
      "ignore_patterns", "model_loader_extra_config", "safetensors_*", "pt_load_map_location", "use_tqdm_on_load",
      "max_parallel_loading_workers"), "models load from a local directory or a bundled package, never downloaded"),
    (("mm_*", "*_mm_*", "limit_mm_per_prompt", "allowed_local_media_path", "allowed_media_domains",
      "media_io_kwargs", "video_pruning_*", "renderer_num_workers", "io_processor_plugin", "language_model_only",
      "enable_tower_connector_lora"), "the models draftwise loads are text-only"),
    (("*lora*",), "LoRA is off (enable_lora=False)"),
    (("mamba_*", "*mamba*", "*replayssm*", "gdn_*", "kda_*"), f"Mamba/linear-attention layers: {_NOT_HERE}"),
    (("*expert*", "*eplb*", "*moe*", "all2all_backend", "enable_ep_weight_filter", "enable_elastic_ep",
      "elastic_ep_max_dp_size"), f"mixture-of-experts layers: {_NOT_HERE} (dense models have nothing to shard)"),
    (("data_parallel_*",), "draftwise serve runs its --data-parallel-size replicas as processes on this machine "
                           "and sends each request to the least-loaded one itself"),
    (("dp_*", "*dbo*", "ubatch_size", "disable_nccl_for_dp_synchronization", "nnodes",
      "node_rank", "master_*", "*context_parallel*", "dcp_*", "cp_*", "*distributed_timeout*", "device_ids",
      "numa_*", "enable_hc_sp", "disable_custom_all_reduce", "enable_batch_sharded_sampling", "ray_*",
      "enable_shm_tensor_arena", "enable_nccl_comm_suspend"),
     "draftwise's tensor-parallel ranks talk over torch.distributed (gloo on CPU, NCCL on CUDA) with its own "
     "settings; data parallelism is draftwise serve's --data-parallel-size"),
    (("*cudagraph*", "enable_cumem_allocator", "enable_flashinfer_autotune", "attention_backend",
      "attention_config", "kernel_config", "ir_op_priority", "linear_backend", "sparse_indexer_topk_backend",
      "disable_cascade_attn", "optimization_level", "performance_mode", "model_impl", "enable_layerwise_*"),
     "draftwise picks its kernels by measuring them at start-up; compile with compilation_config (-O3)"),
    (("enable_chunked_prefill", "long_prefill_*", "max_num_scheduled_tokens", "max_num_active_seqs",
      "max_num_queued_*", "prefill_schedule_interval", "scheduler_reserve_full_isl", "watermark", "async_*",
      "stream_interval", "disable_hybrid_kv_cache_manager", "swa_bounded_replay"),
     "long prompts are always prefilled in chunks; bound their stall with decode_stall_factor"),
    (("num_gpu_blocks_override", "*offload*", "kv_cache_dtype_skip_layers", "prefix_caching_hash_algo",
      "prefix_cache_retention_interval", "prefix_match_unit"), "size the KV cache with kv_cache_memory_bytes"),
    (("per_request_spec_decode_metrics",), "it sets the server's per-request figures (draftwise serve "
                                           "--per-request-spec-decode-metrics); offline outputs always carry them"),
    (("*metrics*", "*trace*", "show_hidden_metrics_for_version", "custom_histogram_buckets", "aggregate_*",
      "enable_logging_iteration_details", "jit_monitor_*", "profiler_config", "logging_config", "log_level",
      "log_config_file", "fail_on_environ_validation"), "metrics and logs have draftwise's own settings"),
    (("served_model_name",), "it names the model on the server: draftwise serve --served-model-name"),
    (("cohere_*", "anthropic_*"), "draftwise serves OpenAI's API only"),
    (("*log*", "uvicorn_*", "*access_log*"), "the server's logs have draftwise's own settings (--log-level)"),
)
_DEFAULT_REASON = "a vLLM tuning knob with no counterpart in draftwise; outputs do not depend on it"


def noop_reason(name: str) -> str:
    for patterns, why in _NOOP_REASONS:
        if any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns):
            return why
    return _DEFAULT_REASON


def check_type(name: str, value, table: dict = VLLM_ENGINE_ARGS) -> None:
    """``ValueError`` naming ``name`` unless ``value`` has the type vLLM declares (``table``)."""
    default, kind, nullable = table[name]
    if value is None and nullable:
        return
    plain = {"bool": lambda v: isinstance(v, bool),
             "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
             "float": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
             "str": lambda v: isinstance(v, str),
             "dict": lambda v: isinstance(v, dict) or dataclasses.is_dataclass(v),
             "list": lambda v: isinstance(v, (list, tuple, set)),
             "any": lambda v: True}
    if isinstance(kind, tuple):
        if value in kind:
            return
        allowed = f"one of {list(kind)}" + (" or None" if nullable else "")
    elif plain[kind](value):
        return
    else:
        allowed = f"{'an' if kind[0] in 'aeiou' else 'a'} {kind}" + (" or None" if nullable else "")
    raise ValueError(f"{name}={value!r} is invalid: must be {allowed} (as in vLLM)")


def resolve_vllm_args(values: dict, frontend: bool = False) -> list[str]:
    """Check vLLM-only arguments (``values``: name -> value, names of ``VLLM_ENGINE_ARGS``, or of
    ``VLLM_FRONTEND_ARGS`` for ``frontend``). Raises ``ValueError`` for a wrong type or a value that
    cannot work here; returns one line per argument set away from vLLM's default with no effect here."""
    table, accepted = (VLLM_FRONTEND_ARGS, FRONTEND_ACCEPTED) if frontend else (VLLM_ENGINE_ARGS, ACCEPTED)
    notes = []
    for name, value in values.items():
        check_type(name, value, table)
        if name in accepted:
            allowed, why = accepted[name]
            if value not in allowed:
                raise ValueError(f"{name}={value!r} cannot run here: {why} (allowed: {list(allowed)})")
        elif value != table[name][0]:
            notes.append(f"{name}={value!r} ({noop_reason(name)})")
    return notes


def log_noops(notes: list[str]) -> None:
    if notes:
        logger.info("draftwise: vLLM %s arguments with no effect here: %s", VLLM_VERSION, "; ".join(notes))

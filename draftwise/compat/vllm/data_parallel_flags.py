"""vLLM's ``--data-parallel-*`` flags on ``draftwise serve``: how many replicas, their engine flags, their GPUs.

``data_parallel_plan(engine_kwargs)`` reads ``data_parallel_size`` (the number of replicas, all on
this machine behind one server: ``server/data_parallel.py``), logs the other ``data_parallel_*`` flags set
as no-ops once (the replicas get them at vLLM's defaults, so they do not log them again), and
refuses the layouts that would need other nodes or other servers. ``replica_devices`` gives each
replica ``tensor_parallel_size`` GPUs of its own on CUDA, as vLLM does.
"""
from __future__ import annotations

import os

import torch

from .arg_rules import check_type, log_noops, resolve_vllm_args
from .engine_args import VLLM_ENGINE_ARGS

_DP_ARGS = ["data_parallel_size"] + [name for name in VLLM_ENGINE_ARGS
                                     if name.startswith("data_parallel_") and name != "data_parallel_size"]


def data_parallel_plan(engine_kwargs: dict) -> tuple[int, dict]:
    """``(replicas, the LLM keywords of each)`` from ``draftwise serve``'s engine flags: the replicas'
    keywords have every ``data_parallel_*`` flag at vLLM's default (``data_parallel_size=1``); the
    other flags set are logged once as no-ops. ``ValueError`` naming the flag for a wrong type, a
    size below 1, or a layout with replicas on other nodes (or one server per rank)."""
    size = engine_kwargs.get("data_parallel_size", 1)
    check_type("data_parallel_size", size)
    if size < 1:
        raise ValueError(f"data_parallel_size={size!r} is invalid: must be >= 1")
    others = {name: engine_kwargs[name] for name in _DP_ARGS[1:] if name in engine_kwargs}
    notes = resolve_vllm_args(others)  # their types; the ones set are no-ops here (logged once, here)
    local = engine_kwargs.get("data_parallel_size_local")
    if local is not None and local != size:
        where = ("the other replicas would run on other nodes" if local < size
                 else "it cannot exceed data_parallel_size")
        raise ValueError(f"data_parallel_size_local={local!r} with data_parallel_size={size}: {where}; "
                         "draftwise serve runs every replica on this machine (leave it unset)")
    start_rank = engine_kwargs.get("data_parallel_start_rank")
    if start_rank:
        raise ValueError(f"data_parallel_start_rank={start_rank!r}: the replicas of lower rank would run on "
                         "other nodes; draftwise serve runs every replica on this machine (leave it unset)")
    if size > 1 and engine_kwargs.get("data_parallel_rank") is not None:
        raise ValueError(f"data_parallel_rank={engine_kwargs['data_parallel_rank']!r} with data_parallel_size="
                         f"{size}: one server per rank (external load balancing) is not supported; draftwise "
                         "serve runs all the replicas behind one server and balances them (leave it unset)")
    log_noops(notes)
    return size, {**engine_kwargs, **{name: VLLM_ENGINE_ARGS[name][0] for name in _DP_ARGS}}


def replica_devices(config, size: int) -> list[tuple[str, ...] | None]:
    """Each replica's ``CUDA_VISIBLE_DEVICES`` (``tensor_parallel_size`` GPUs each, taken in order
    from those visible), or None each off CUDA. ``ValueError`` when there are too few GPUs."""
    if config.torch_device.type != "cuda":
        return [None] * size
    per = config.tensor_parallel_size
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = ([d.strip() for d in visible.split(",") if d.strip()] if visible is not None
           else [str(i) for i in range(torch.cuda.device_count())])
    if len(ids) < size * per:
        raise ValueError(f"data_parallel_size={size} needs {size * per} GPUs (tensor_parallel_size={per} per "
                         f"replica), {len(ids)} visible: each replica runs on GPUs of its own")
    return [tuple(ids[i * per:(i + 1) * per]) for i in range(size)]

"""Compile the target's forward at start-up (``compilation_config`` mode > 0), and capture its
uniform batches as CUDA graphs on a GPU (``capture_target``).

``why_not_compiled`` says when a mode > 0 still runs the target as it is: under tensor parallelism
(every rank runs its shard eagerly), and where its linears run on GGUF blocks (the layers are one
C++ stack, several times faster than the compiled float forward on the same file:
``benchmarks/bench_compile.py``). Float weights on CPU are where compiling wins over eager.

``compile_target`` swaps the ``PagedModel``'s forward for a ``CompiledForward`` and compiles
every graph now, each on a throwaway sequence of the block manager's scratch space, so no step
ever waits for a compile. Returns the seconds spent (logged by ``log_compile``).
"""
from __future__ import annotations

import os

import torch

from ..compilation.compiled_forward import CompiledForward, log_compile
from ..compilation.static_step import StaticStep
from ..paged import BlockManager, ForwardInput, PagedModel


def why_not_compiled(model, tensor_parallel: bool) -> str | None:
    """Why a target with ``compilation_config`` mode > 0 runs uncompiled; None where it compiles."""
    if tensor_parallel:
        return "tensor_parallel_size > 1: every rank runs its shard eagerly"
    if model.num_gguf_linears:
        return "the linears run on GGUF blocks, as the C++ decoder stack (faster than a compiled float forward)"
    return None


def compile_target(paged: PagedModel, block_manager: BlockManager, compilation, max_num_tokens: int,
                   aux_layer_ids: tuple[int, ...], device: torch.device) -> float:
    if compilation.cache_dir:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = compilation.cache_dir
    compiled = CompiledForward(paged.model, compilation.bucket_sizes(), max_num_tokens, aux_layer_ids, device)
    paged.run_with(compiled)

    def compile_one(num_tokens: int) -> None:
        with block_manager.scratch("compile", num_tokens, num_tokens) as dummy:
            if dummy is None:
                raise ValueError(f"the KV cache cannot hold the {num_tokens}-token compile batch; "
                                 "lower compilation_config's sizes or raise kv_cache_memory_bytes")
            paged.forward([ForwardInput(dummy.all_token_ids, 0, dummy.block_ids)], aux_layer_ids)

    return log_compile(compiled.warm_up_sizes(), compile_one)


def capture_target(paged: PagedModel, pad_block: int, compilation, enforce_eager: bool, max_num_seqs: int,
                   max_model_len: int) -> StaticStep | None:
    """On a GPU (one rank), unless ``cudagraph_mode`` is NONE or ``enforce_eager``: the target's decode
    batches (one row per sequence) captured as CUDA graphs, vLLM's default capture sizes up to
    ``min(2 * max_num_seqs, 512)`` tokens; padding rows write to ``pad_block``. Verify batches (several
    rows per sequence) run eager: ``StaticStep`` computes them (``attach_static_step`` with a larger
    ``max_query_len``), but on a GPU a verify step on it has left a sequence's ``num_computed_tokens``
    past its tokens after a rejection (``tests/test_cuda_graphs.py``), so they stay off by default."""
    if paged.device.type != "cuda" or not compilation.captures_cuda_graphs(enforce_eager):
        return None
    sizes = compilation.capture_sizes(min(2 * max_num_seqs, 512))
    return attach_static_step(paged, pad_block, sizes, 1, max_model_len, capture=True)


def attach_static_step(paged: PagedModel, pad_block: int, capture_sizes: list[int], max_query_len: int,
                       max_model_len: int, capture: bool) -> StaticStep | None:
    """Run the target's uniform batches of up to ``max_query_len`` rows per sequence as fixed-shape steps
    (captured as CUDA graphs where ``capture``); None where no capture size is left."""
    if not capture_sizes:
        return None
    step = StaticStep(paged, capture_sizes, max_query_len, max_model_len, pad_block, capture)
    paged.run_static_with(step)
    return step

"""Compile the target's forward at start-up (``compilation_config`` mode > 0).

``compile_target`` swaps the ``PagedModel``'s forward for a ``CompiledForward`` and compiles
every graph now, each on a throwaway sequence of the block manager's scratch space, so no step
ever waits for a compile. Returns the seconds spent (logged by ``log_compile``).
"""
from __future__ import annotations

import os

import torch

from ..compilation.compiled_forward import CompiledForward, log_compile
from ..paged import BlockManager, ForwardInput, PagedModel


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

"""``CompiledForward``: the target model's forward, compiled by inductor.

What is compiled: the whole decoder stack (``DecoderLM.forward``) as one
graph, ``fullgraph``. Attention (with its KV write) is the opaque
``draftwise::attention`` op reading the forward context, so the graph takes
only token ids and positions and never copies the cache. On CPU every linear
is the opaque ``draftwise::packed_linear`` op on the weight the engine packed
for oneDNN at load; inductor fuses the norms, rotary embedding, activation and
residual adds between them, and the graph's wrapper is generated C++
(``cpp_wrapper``), which measured faster than the Python wrapper for a
30-layer model. Weights are not frozen: with freezing, inductor's AOT autograd
cache refuses the graph, and a start with a warm on-disk cache
(``TORCHINDUCTOR_CACHE_DIR``, ``compilation_config["cache_dir"]``) would take about
twice as long.

Sizes: with ``buckets`` each size is a static graph and a batch is padded up
to the smallest bucket that holds it (larger batches run eager); without,
one graph with a dynamic token count serves every batch, a one-token batch
padded to two (dynamo specializes sizes 0 and 1). Padding rows compute
garbage that is dropped; the attention op neither writes their K/V nor
attends for them.

A call asking for other auxiliary hidden states than the compiled ones runs
eager. Each ``CompiledForward`` compiles its own copy of the function's
code: dynamo keeps graphs (each holding its model's frozen weights) per code
object, so with one shared copy every engine of a process would scan the
others' graphs on each call and count against one recompile limit.
"""
from __future__ import annotations

import logging
import time
import types

import torch

logger = logging.getLogger("draftwise")


def _run(model, input_ids: torch.Tensor, positions: torch.Tensor, aux_layer_ids: tuple[int, ...]):
    return model(input_ids, positions, aux_layer_ids)


class CompiledForward:
    def __init__(self, model, buckets: list[int], max_num_tokens: int, aux_layer_ids: tuple[int, ...],
                 device: torch.device):
        self.model = model
        self.buckets = sorted(buckets)
        self.max_num_tokens = self.buckets[-1] if self.buckets else max(2, max_num_tokens)
        self.aux_layer_ids = tuple(aux_layer_ids)
        options = {"cpp_wrapper": device.type == "cpu"}
        run = types.FunctionType(_run.__code__.replace(co_name=f"_run_{id(self):x}"), _run.__globals__)
        dynamo = torch._dynamo.config
        dynamo.recompile_limit = max(dynamo.recompile_limit, len(self.buckets) + 1)
        dynamo.accumulated_recompile_limit = max(dynamo.accumulated_recompile_limit, 256)
        self._compiled = torch.compile(run, fullgraph=True, dynamic=False if self.buckets else None,
                                       options=options)

    def padded_size(self, num_tokens: int) -> int | None:
        """Rows the compiled graph runs for ``num_tokens`` tokens; None: this batch runs eager."""
        if num_tokens > self.max_num_tokens:
            return None
        if self.buckets:
            return next(b for b in self.buckets if b >= num_tokens)
        return max(num_tokens, 2)

    def warm_up_sizes(self) -> list[int]:
        """One batch size per graph: compiling them all at start-up keeps steps free of compiles."""
        return list(self.buckets) or [2]

    def __call__(self, input_ids: torch.Tensor,  # [num_tokens]
                 positions: torch.Tensor,  # [num_tokens]
                 aux_layer_ids: tuple[int, ...] = ()) -> tuple[torch.Tensor, list[torch.Tensor]]:
        num_tokens = input_ids.numel()
        size = self.padded_size(num_tokens) if tuple(aux_layer_ids) == self.aux_layer_ids else None
        if size is None:
            return self.model(input_ids, positions, aux_layer_ids)
        if size > num_tokens:
            pad = input_ids.new_zeros(size - num_tokens)
            input_ids, positions = torch.cat((input_ids, pad)), torch.cat((positions, pad))
        if not self.buckets:
            torch._dynamo.mark_dynamic(input_ids, 0, min=2, max=self.max_num_tokens)
            torch._dynamo.mark_dynamic(positions, 0, min=2, max=self.max_num_tokens)
        hidden, aux = self._compiled(self.model, input_ids, positions, self.aux_layer_ids)
        return hidden[:num_tokens], [a[:num_tokens] for a in aux]


def log_compile(sizes: list[int], compile_one) -> float:
    """Compile one graph per size with a progress line each; returns the seconds it took."""
    start = time.perf_counter()
    for i, size in enumerate(sizes):
        logger.info("draftwise: compiling the forward, graph %d/%d (%s tokens)...", i + 1, len(sizes),
                    size if len(sizes) > 1 or size != 2 else "any number of")
        compile_one(size)
    elapsed = time.perf_counter() - start
    logger.info("draftwise: forward compiled in %.1f s", elapsed)
    return elapsed

"""A GGUF model's weights as the file stores them: linears on blocks, the embedding mapped.

``apply_gguf_blocks(model, gguf)`` runs on a ``DecoderLM`` built on the meta device, before any
float weight exists, and swaps in what the file holds:

* each fused linear of every layer (``qkv_proj``, ``o_proj``, ``gate_up_proj``, ``down_proj``)
  for a ``GGUFLinear`` over the file's blocks where every tensor it fuses has a type the
  kernel runs (``QTYPE_IDS``); parts of different types (Q4_K_M's Q6_K values beside Q4_K
  queries) run side by side in a ``ConcatLinear``;
* the output head (the embedding table where they are tied) for a ``GGUFLinear`` likewise;
* the embedding for a ``GGUFEmbedding`` over a mapping of the file (rows de-quantized when
  looked up).

The linears need only the file, not the model: ``BlockLoader`` makes them in a background
thread (the C++ repack runs without the GIL) while the engine reads the config and tokenizer,
and ``apply_gguf_blocks`` takes them from it. Once a weight is repacked into its own buffer,
its pages of the file mapping are dropped from the process (the page cache keeps them).

What stays on meta (norms, biases, a projection or head of a type the kernel does not run) is
loaded as floats afterwards by the caller. No float copy of a swapped weight is ever made.
"""
from __future__ import annotations

import threading

import torch
from torch import nn

from ..layers.gguf_embedding import GGUFEmbedding
from ..layers.gguf_linear import QTYPE_IDS, ConcatLinear, GGUFLinear
from .gguf_file import GGUFFile
from .hf_names import layer_names

LINEARS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")  # a layer's projections, by our module name
EMBED, HEAD = "model.embed_tokens.weight", "lm_head.weight"


def _linear(gguf: GGUFFile, names: list[str]) -> GGUFLinear:
    """One ``GGUFLinear`` over the rows of ``names``; the file's pages are released if it copied them."""
    linear = GGUFLinear(gguf.blocks(*names), gguf.qtype(names[0]))
    if not gguf.is_mapped(linear.blocks):
        gguf.release(*names)
    return linear


def _fused(gguf: GGUFFile, names: list[str]) -> nn.Module:
    """One module for a fused projection of the tensors ``names``: one ``GGUFLinear`` over their
    rows where they share a type, side by side otherwise."""
    if len({gguf.qtype(name) for name in names}) == 1:
        return _linear(gguf, names)
    return ConcatLinear([_linear(gguf, [name]) for name in names])


def _on_blocks(gguf: GGUFFile, names: list[str]) -> bool:
    return all(name in gguf and gguf.qtype(name) in QTYPE_IDS for name in names)


def _layer_linears(gguf: GGUFFile, index: int) -> dict[str, nn.Module]:
    """Layer ``index``'s projections the kernel runs, by module name (no bias yet)."""
    linears = {}
    for module in LINEARS:
        names = layer_names(f"model.layers.{index}.", module, "weight", False, gguf)
        if _on_blocks(gguf, names):
            linears[module] = _fused(gguf, names)
    return linears


def _head_linear(gguf: GGUFFile) -> GGUFLinear | None:
    head = HEAD if HEAD in gguf else EMBED
    return _linear(gguf, [head]) if _on_blocks(gguf, [head]) else None


def _all_linears(gguf: GGUFFile, num_layers: int) -> tuple[list[dict[str, nn.Module]], GGUFLinear | None]:
    return [_layer_linears(gguf, i) for i in range(num_layers)], _head_linear(gguf)


class BlockLoader:
    """Every layer's and the head's ``GGUFLinear``, made from ``gguf`` in a background thread.

    The thread is not a daemon: a process that exits while it repacks (the engine failed to start)
    waits for it, since tearing the interpreter down under a running C++ kernel aborts the process."""

    def __init__(self, gguf: GGUFFile, num_layers: int):
        self.gguf, self.num_layers = gguf, num_layers
        self._result, self._error = None, None
        self._thread = threading.Thread(target=self._run, name="draftwise-gguf-blocks")
        self._thread.start()

    def _run(self) -> None:
        try:
            self._result = _all_linears(self.gguf, self.num_layers)
        except BaseException as error:  # re-raised in the caller's thread by result()
            self._error = error

    def result(self) -> tuple[list[dict[str, nn.Module]], GGUFLinear | None]:
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._result


def apply_gguf_blocks(model, gguf: GGUFFile, loader: BlockLoader | None = None) -> int:
    """Swap the file's blocks into ``model`` (from ``loader`` where one made them); returns how
    many linears were swapped."""
    if loader is not None and loader.num_layers != len(model.layers):
        raise ValueError(f"the GGUF has {loader.num_layers} layers, the model {len(model.layers)}")
    layers, head = loader.result() if loader is not None else _all_linears(gguf, len(model.layers))
    swapped = 0
    for i, (layer, linears) in enumerate(zip(model.layers, layers)):
        for module, linear in linears.items():
            if getattr(layer, module).bias is not None:
                linear.bias = torch.cat([gguf.read(name)
                                         for name in layer_names(f"model.layers.{i}.", module, "bias", False, gguf)])
            setattr(layer, module, linear)
            swapped += 1
    hidden = model.config.hidden_size
    if head is not None:
        model.lm_head = head
        swapped += 1
    elif model.lm_head is None:  # tied to a table the kernel does not run: a float head, loaded as HEAD
        with torch.device("meta"):
            model.lm_head = nn.Linear(hidden, model.embed_tokens.num_embeddings, bias=False)
    model.embed_tokens = GGUFEmbedding(gguf.table(EMBED), gguf.qtype(EMBED), hidden)
    return swapped

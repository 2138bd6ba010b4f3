"""Read a model's parameters from its safetensors files, whole or one rank's shard.

``CheckpointReader(path)`` opens every ``*.safetensors`` file of a directory
lazily (``safe_open``): ``read(name, dim, start, end)`` reads a tensor, or only
rows / columns ``[start, end)`` of it, so a tensor-parallel rank never holds
more than its own shard of a weight. Names are looked up with the multimodal
prefixes stripped (``strip_prefix``: Gemma 3 nests the text model).

``read_param(reader, module, leaf, parts, layout, head_dim)`` builds one
parameter of a ``DecoderLM`` from the checkpoint tensors ``parts`` (q/k/v and
gate/up are fused along dim 0) and the rank's ``ShardLayout``:

* column-parallel (``qkv_proj``, ``gate_up_proj``: weight rows and bias): the
  rank's heads / intermediate rows of each part;
* row-parallel (``o_proj``, ``down_proj``): the rank's input columns; their bias
  only on rank 0 (zeros elsewhere), as the all-reduce adds every rank's;
* vocab-parallel (``embed_tokens``, ``lm_head``): the rank's vocabulary rows,
  zero-padded to ``layout.vocab_rows``;
* everything else (norms): whole, on every rank.
"""
from __future__ import annotations

from pathlib import Path

import torch

from .hf_names import is_fused
from .shard_layout import ShardLayout


def strip_prefix(name: str) -> str:
    """Multimodal checkpoints (Gemma 3) nest the text model under language_model."""
    for prefix in ("model.language_model.", "language_model.model."):
        if name.startswith(prefix):
            return "model." + name[len(prefix):]
    return name.removeprefix("language_model.")


class CheckpointReader:
    def __init__(self, path: Path):
        from safetensors import safe_open

        files = sorted(Path(path).glob("*.safetensors"))
        if not files:
            raise ValueError(f"no *.safetensors weights in {path}")
        self._where = {}  # our name -> (open file, name in the file)
        for file in files:
            handle = safe_open(str(file), framework="pt")
            for name in handle.keys():
                self._where[strip_prefix(name)] = (handle, name)

    def __contains__(self, name: str) -> bool:
        return name in self._where

    def read(self, name: str, dim: int | None = None, start: int = 0, end: int = 0) -> torch.Tensor:
        """The tensor ``name`` in fp32, or its rows (``dim=0``) / columns (``dim=1``) ``[start, end)``."""
        handle, stored = self._where[name]
        if dim is None:
            tensor = handle.get_tensor(stored)
        else:
            part = handle.get_slice(stored)
            tensor = part[start:end] if dim == 0 else part[:, start:end]
        return tensor.float()


def read_param(reader: CheckpointReader, module: str, leaf: str, parts: list[str], layout: ShardLayout,
               head_dim: int) -> torch.Tensor:
    """One parameter (``{module}.{leaf}``) of this rank, from the checkpoint tensors ``parts``."""
    if layout.world_size == 1:
        return torch.cat([reader.read(p) for p in parts]) if len(parts) > 1 else reader.read(parts[0])
    if is_fused(parts, module):
        raise ValueError(f"tensor_parallel_size={layout.world_size} cannot split {parts[0]}: a checkpoint that "
                         "stores q/k/v or gate/up fused (Phi-3) runs on one rank (tensor_parallel_size=1)")
    q = (layout.q_heads[0] * head_dim, layout.q_heads[1] * head_dim)
    kv = (layout.kv_heads[0] * head_dim, layout.kv_heads[1] * head_dim)
    if module == "qkv_proj":
        return torch.cat([reader.read(part, 0, *span) for part, span in zip(parts, (q, kv, kv))])
    if module == "gate_up_proj":
        return torch.cat([reader.read(part, 0, *layout.intermediate) for part in parts])
    if module in ("o_proj", "down_proj"):
        if leaf == "bias":
            bias = reader.read(parts[0])
            return bias if layout.rank == 0 else torch.zeros_like(bias)
        return reader.read(parts[0], 1, *(q if module == "o_proj" else layout.intermediate))
    if module in ("embed_tokens", "lm_head"):
        rows = reader.read(parts[0], 0, *layout.vocab)
        return torch.cat((rows, rows.new_zeros(layout.vocab_rows - rows.shape[0], rows.shape[1])))
    return reader.read(parts[0])

"""``GGUFFile``: a GGUF file's tensors under Hugging Face names, read from the file as stored.

The engine loads a GGUF from its file, never from a converted copy. ``GGUFFile(path)`` reads
the header (``gguf_header.py``) and maps each Hugging Face parameter name
(``model.layers.0.self_attn.q_proj.weight``) to its GGUF tensor (``blk.0.attn_q.weight``) with
gguf's own name tables. It serves three readers:

* ``blocks(*names)``: the tensors' bytes as ``[rows, row_bytes]`` uint8 views of a private
  mapping of the file (the quantized rows a ``GGUFLinear`` runs on, or repacks from);
* ``table(name)``: the same bytes as a read-only mapping of the file, for an embedding table
  that de-quantizes only the rows it looks up (``GGUFEmbedding``);
* ``read(name, dim, start, end)``: the tensor de-quantized to fp32 (gguf's kernels), whole or
  a slice; the interface of ``CheckpointReader``, so every float path (a float dtype, a GPU,
  tensor parallelism) reads one tensor at a time from the file.

Layouts differ from Hugging Face's in two places, undone on every read: llama.cpp stores a
llama's q/k projection rows permuted for its rotary kernel (whole rows move back, so a block's
bytes are never touched), and Gemma's norm weights as ``1 + w``.
"""
from __future__ import annotations

import mmap
from functools import cached_property
from pathlib import Path

import numpy as np
import torch

from .gguf_header import GGUFHeader, TensorInfo, read_header

_PERMUTED_ARCHS = ("llama",)  # architectures whose q/k rows llama.cpp permutes
_NORM_PLUS_ONE_ARCHS = ("gemma", "gemma2", "gemma3")


def unpermute_rows(rows: torch.Tensor, n_head: int) -> torch.Tensor:  # [out, ...] -> [out, ...]
    """Undo llama.cpp's rotary permutation of q/k output rows (whole rows are moved)."""
    half = rows.shape[0] // n_head // 2
    return rows.reshape(n_head, half, 2, *rows.shape[1:]).transpose(1, 2).reshape(rows.shape)


def _read_exactly(f, offset: int, view: memoryview) -> None:
    """Fill ``view`` with the file's bytes from ``offset`` (a read may return fewer than asked)."""
    f.seek(offset)
    done = 0
    while done < len(view):
        count = f.readinto(view[done:])
        if not count:
            raise ValueError(f"{f.name}: the file ends inside a tensor (truncated download?)")
        done += count


def _page_span(offset: int, length: int) -> tuple[int, int]:
    """(start, length) of the whole pages covering ``length`` bytes from ``offset``."""
    start = offset - offset % mmap.PAGESIZE
    return start, offset + length - start


class GGUFFile:
    def __init__(self, path: str | Path, header: GGUFHeader | None = None):
        import gguf

        self.path = Path(path)
        self.header = header or read_header(self.path)
        self.arch = self.header.get("general.architecture")
        arch_ids = {name: arch for arch, name in gguf.MODEL_ARCH_NAMES.items()}
        if self.arch not in arch_ids:
            raise ValueError(f"{self.path}: GGUF architecture {self.arch!r} is unknown to gguf")
        num_layers = int(self.header.get(f"{self.arch}.block_count", 0))
        self._names = gguf.get_tensor_name_map(arch_ids[self.arch], num_layers)
        heads = self.header.get(f"{self.arch}.attention.head_count")
        kv_heads = self.header.get(f"{self.arch}.attention.head_count_kv", heads)
        self._permuted = {"attn_q": heads, "attn_k": kv_heads} if self.arch in _PERMUTED_ARCHS else {}

    def info(self, name: str) -> TensorInfo | None:
        """The GGUF tensor behind the Hugging Face name ``name`` (None if the file has none)."""
        from .shard_weights import strip_prefix

        gguf_name = self._names.get_name(strip_prefix(name), try_suffixes=(".weight", ".bias"))
        return self.header.tensors.get(gguf_name) if gguf_name else None

    def __contains__(self, name: str) -> bool:
        return self.info(name) is not None

    def qtype(self, name: str) -> str:
        return self._info(name).qtype

    def blocks(self, *names: str) -> list[torch.Tensor]:  # each [rows, row_bytes] uint8, Hugging Face order
        """The rows of each of ``names`` (tensors of one type and row length) as views of the file's
        bytes (a private mapping: nothing is read until used, nothing written reaches the file), or,
        for rows llama.cpp permuted, a copy in Hugging Face's order."""
        infos = [self._info(name) for name in names]
        parts = []
        for info in infos:
            if (info.qtype, info.row_bytes) != (infos[0].qtype, infos[0].row_bytes):
                raise ValueError(f"{info.name} ({info.qtype}) cannot share rows with {infos[0].name}")
            self._mapping.madvise(mmap.MADV_WILLNEED, *_page_span(info.offset, info.num_bytes))
            rows = self._bytes[info.offset:info.offset + info.num_bytes].view(info.num_rows, info.row_bytes)
            parts.append(self._unpermute(rows, info) if self._permutation(info) else rows)
        return parts

    def is_mapped(self, tensor: torch.Tensor) -> bool:
        """Whether ``tensor`` is a view of this file's mapping (its pages must then stay mapped)."""
        return tensor.untyped_storage().data_ptr() == self._bytes.untyped_storage().data_ptr()

    def release(self, *names: str) -> None:
        """Drop the mapped pages of ``names`` from this process once a copy has replaced them (the
        page cache keeps them; a later read of the mapping, e.g. a page shared with a neighbour
        used in place, faults them back in unchanged)."""
        for name in names:
            info = self._info(name)
            self._mapping.madvise(mmap.MADV_DONTNEED, *_page_span(info.offset, info.num_bytes))

    @cached_property
    def _mapping(self) -> mmap.mmap:
        with open(self.path, "rb") as f:
            return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)

    @cached_property
    def _bytes(self) -> torch.Tensor:  # [file size] uint8 over the mapping
        return torch.frombuffer(self._mapping, dtype=torch.uint8)

    def table(self, name: str) -> np.ndarray:  # [rows, row_bytes] uint8, read-only mapping of the file
        info = self._info(name)
        if self._permutation(info):
            raise ValueError(f"{name}: a permuted tensor cannot be mapped in place")
        return np.memmap(self.path, dtype=np.uint8, mode="r", offset=info.offset,
                         shape=(info.num_rows, info.row_bytes))

    def read(self, name: str, dim: int | None = None, start: int = 0, end: int = 0) -> torch.Tensor:
        """The tensor ``name`` in fp32 (``[rows, ...]`` as Hugging Face stores it), or its rows
        (``dim=0``) / columns (``dim=1``) ``[start, end)``."""
        from gguf import GGMLQuantizationType, quants

        info = self._info(name)
        values = quants.dequantize(self._raw(info), GGMLQuantizationType[info.qtype])
        values = torch.from_numpy(np.ascontiguousarray(values)).float().reshape(tuple(reversed(info.dims)))
        values = self._unpermute(values, info)
        if self.arch in _NORM_PLUS_ONE_ARCHS and name.endswith("norm.weight"):
            values = values - 1.0
        if dim is None:
            return values
        return (values[start:end] if dim == 0 else values[:, start:end]).contiguous()

    def _info(self, name: str) -> TensorInfo:
        info = self.info(name)
        if info is None:
            raise KeyError(f"{self.path.name} has no tensor for {name}")
        return info

    def _raw(self, info: TensorInfo) -> np.ndarray:  # [rows, row_bytes] uint8, as stored
        raw = np.empty((info.num_rows, info.row_bytes), dtype=np.uint8)
        with open(self.path, "rb", buffering=0) as f:
            _read_exactly(f, info.offset, memoryview(raw).cast("B"))
        return raw

    def _permutation(self, info: TensorInfo) -> int | None:
        """The head count whose rotary permutation ``info``'s rows carry, or None."""
        parts = info.name.split(".")
        return self._permuted.get(parts[2]) if len(parts) == 4 and parts[0] == "blk" else None

    def _unpermute(self, rows: torch.Tensor, info: TensorInfo) -> torch.Tensor:
        n_head = self._permutation(info)
        return rows if n_head is None else unpermute_rows(rows, n_head)

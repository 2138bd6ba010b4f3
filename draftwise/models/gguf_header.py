"""Read a GGUF file's header: its metadata and where each tensor's bytes lie, nothing else.

``read_header(path)`` parses the key-value metadata and the tensor infos of a GGUF file
(versions 2 and 3) in one pass over the header bytes. Scalars and short arrays are decoded;
long arrays (a tokenizer's tokens, scores and merges) are skipped and kept as an ``ArrayRef``
that ``GGUFHeader.array(key)`` decodes on demand, so the header of a model with a 128K-token
vocabulary reads in a fraction of a second (``gguf.GGUFReader`` builds a view per string).

Tensor infos give each tensor's ggml type, its shape in ggml order (``dims[0]`` is the row
length) and the absolute file offset of its first byte; ``TensorInfo.row_bytes`` and
``num_rows`` describe it as ``[num_rows, row_bytes]`` bytes (quantized rows are whole blocks).
A file that ends before its last tensor's bytes is refused (``ValueError``) naming the tensor.
"""
from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

_MAGIC = b"GGUF"
_DEFAULT_ALIGNMENT = 32
_MAX_DECODED_ARRAY = 1024  # longer arrays stay undecoded until asked for
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
STRING_TYPE, _ARRAY = 8, 9  # metadata value types: a string, an array


@dataclass(frozen=True)
class TensorInfo:
    name: str
    qtype: str  # ggml type name: F32, F16, BF16, Q4_0, Q4_K, ...
    dims: tuple[int, ...]  # ggml order: dims[0] is the length of a row
    offset: int  # absolute file offset of the first byte

    @property
    def num_rows(self) -> int:
        rows = 1
        for d in self.dims[1:]:
            rows *= d
        return rows

    @property
    def row_bytes(self) -> int:
        block_size, type_size = GGML_QUANT_SIZES[GGMLQuantizationType[self.qtype]]
        return self.dims[0] // block_size * type_size

    @property
    def num_bytes(self) -> int:
        return self.num_rows * self.row_bytes


@dataclass(frozen=True)
class ArrayRef:
    """A metadata array left undecoded: its item type, length and where its items start."""
    item_type: int
    count: int
    offset: int


@dataclass
class GGUFHeader:
    path: Path
    fields: dict[str, Any]  # key -> scalar, str, list, or ArrayRef for long arrays
    tensors: dict[str, TensorInfo]

    def get(self, key: str, default=None):
        value = self.fields.get(key, default)
        return self.array(key) if isinstance(value, ArrayRef) else value

    def array(self, key: str) -> list:
        """The whole array under ``key``, decoded."""
        value = self.fields[key]
        if not isinstance(value, ArrayRef):
            return value
        with open(self.path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            items, _ = _read_items(buf, value.offset, value.item_type, value.count)
        return items


def read_header(path: str | Path) -> GGUFHeader:
    path = Path(path)
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        if buf[:4] != _MAGIC:
            raise ValueError(f"{path} is not a GGUF file (no GGUF magic)")
        version, num_tensors, num_fields = struct.unpack_from("<IQQ", buf, 4)
        if version not in (2, 3):
            raise ValueError(f"{path}: GGUF version {version} is not supported (2 and 3 are)")
        pos, fields = 24, {}
        for _ in range(num_fields):
            key, pos = _read_string(buf, pos)
            (value_type,), pos = struct.unpack_from("<I", buf, pos), pos + 4
            fields[key], pos = _read_value(buf, pos, value_type)
        infos = []
        for _ in range(num_tensors):
            name, pos = _read_string(buf, pos)
            (num_dims,), pos = struct.unpack_from("<I", buf, pos), pos + 4
            dims, pos = struct.unpack_from(f"<{num_dims}Q", buf, pos), pos + 8 * num_dims
            (qtype, offset), pos = struct.unpack_from("<IQ", buf, pos), pos + 12
            infos.append((name, GGMLQuantizationType(qtype).name, dims, offset))
    alignment = int(fields.get("general.alignment", _DEFAULT_ALIGNMENT))
    data_start = -(-pos // alignment) * alignment
    tensors = {name: TensorInfo(name, qtype, tuple(dims), data_start + offset) for name, qtype, dims, offset in infos}
    size = path.stat().st_size
    for info in tensors.values():
        if info.offset + info.num_bytes > size:
            raise ValueError(f"{path}: the file ends inside tensor {info.name} (truncated download?)")
    return GGUFHeader(path, fields, tensors)


def _read_string(buf, pos: int) -> tuple[str, int]:
    (length,) = struct.unpack_from("<Q", buf, pos)
    start = pos + 8
    return buf[start:start + length].decode("utf-8", errors="replace"), start + length


def _read_value(buf, pos: int, value_type: int) -> tuple[Any, int]:
    if value_type == STRING_TYPE:
        return _read_string(buf, pos)
    if value_type == _ARRAY:
        item_type, count = struct.unpack_from("<IQ", buf, pos)
        pos += 12
        if count <= _MAX_DECODED_ARRAY:
            return _read_items(buf, pos, item_type, count)
        return ArrayRef(item_type, count, pos), _skip_items(buf, pos, item_type, count)
    fmt = _SCALARS.get(value_type)
    if fmt is None:
        raise ValueError(f"GGUF metadata value type {value_type} is unknown")
    return struct.unpack_from(fmt, buf, pos)[0], pos + struct.calcsize(fmt)


def _read_items(buf, pos: int, item_type: int, count: int) -> tuple[list, int]:
    if item_type in _SCALARS:
        fmt = _SCALARS[item_type]
        size = struct.calcsize(fmt)
        return list(struct.unpack_from(f"<{count}{fmt[1]}", buf, pos)), pos + size * count
    if item_type == STRING_TYPE:
        return _read_strings(buf, pos, count)
    items = []
    for _ in range(count):
        item, pos = _read_value(buf, pos, item_type)
        items.append(item)
    return items, pos


def _read_strings(buf, pos: int, count: int) -> tuple[list[str], int]:
    unpack, strings = struct.Struct("<Q").unpack_from, []
    for _ in range(count):
        (length,) = unpack(buf, pos)
        pos += 8
        strings.append(buf[pos:pos + length].decode("utf-8", errors="replace"))
        pos += length
    return strings, pos


def _skip_items(buf, pos: int, item_type: int, count: int) -> int:
    if item_type in _SCALARS:
        return pos + struct.calcsize(_SCALARS[item_type]) * count
    if item_type != STRING_TYPE:  # arrays of arrays: walk them
        return _read_items(buf, pos, item_type, count)[1]
    unpack = struct.Struct("<Q").unpack_from
    for _ in range(count):
        pos += 8 + unpack(buf, pos)[0]
    return pos

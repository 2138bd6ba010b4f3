"""``GGUFEmbedding``: an embedding table left in its GGUF file, de-quantized row by row.

The table is a read-only mapping of the file's bytes ``[vocab, row_bytes]`` (any ggml type gguf
de-quantizes: the k-quants, the legacy quants, F16, BF16, F32). A lookup gathers the rows of its
token ids and de-quantizes only those, so the table costs no memory beyond the pages of the rows
ever looked up (the kernel keeps recently read pages, as for llama.cpp's mapped weights), and a
prompt's lookup reads each of its rows once. Output: fp32 ``[num_tokens, hidden]`` on the ids'
device.
"""
from __future__ import annotations

import numpy as np
import torch
from torch import nn


class GGUFEmbedding(nn.Module):
    def __init__(self, table: np.ndarray,  # [num_embeddings, row_bytes] uint8
                 qtype: str, embedding_dim: int):
        from gguf import GGMLQuantizationType

        super().__init__()
        self.table = table
        self.qtype = qtype
        self._qtype = GGMLQuantizationType[qtype]
        self.num_embeddings, self.embedding_dim = table.shape[0], embedding_dim

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:  # [...] -> [..., hidden] fp32
        from gguf import quants

        rows = self.table[input_ids.reshape(-1).cpu().numpy()]  # [num_tokens, row_bytes]
        values = np.ascontiguousarray(quants.dequantize(rows, self._qtype), dtype=np.float32)
        return torch.from_numpy(values).reshape(*input_ids.shape, self.embedding_dim).to(input_ids.device)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, qtype={self.qtype}"

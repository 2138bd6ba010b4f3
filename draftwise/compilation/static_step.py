"""``StaticStep``: the target's uniform decode and verify batches at fixed shapes, as CUDA graphs.

A batch is uniform when every sequence runs the same number of query rows (decode: 1, a chain
verify: drafts + 1, at most ``max_query_len``) at consecutive positions, without a draft tree.
Such a batch is padded to a ``Bucket``: its token count up to the next capture size (then up to
whole sequences), its context up to a power-of-two number of blocks. Padding sequences write
their K/V into a block reserved for them and attend to that block only; their rows are dropped.

The step's inputs (token ids, positions, cache slots, context lengths, block table) are packed on
the host into one pinned buffer and copied to the device in one transfer; the forward reads them
from fixed device addresses, and attention runs on static shapes (``layers/static_attention.py``).
On CUDA each bucket is captured as a graph the first time it runs (after one eager warm-up) and
replayed after that: a step launches one graph instead of hundreds of kernels. Without capture the
same fixed-shape forward runs eagerly (tests check it against the ragged path on CPU).

Outputs are copies: a graph's output buffers are overwritten by its next replay, and a proposer may
keep a step's hidden rows. Every other batch (prefill, mixed query lengths, trees, buckets past the
largest capture size or context) returns None and runs the ragged forward.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..layers.attention import AttentionMetadata
from ..layers.forward_context import forward_context
from ..layers.static_attention import StaticBatch
from ..paged.batch import ForwardInput, block_rows

MIN_BLOCKS = 8  # the smallest context bucket, in blocks


@dataclass(frozen=True)
class Bucket:
    num_seqs: int  # padded
    query_len: int
    num_blocks: int  # context blocks gathered per sequence
    aux_layer_ids: tuple[int, ...]

    @property
    def num_tokens(self) -> int:
        return self.num_seqs * self.query_len

    @property
    def num_inputs(self) -> int:
        """Input buffer entries: ids, positions and slots per token, a context length and the blocks
        per sequence."""
        return 3 * self.num_tokens + self.num_seqs * (1 + self.num_blocks)


@dataclass
class _Entry:
    input_ids: torch.Tensor  # [num_tokens] device views of the input buffer (the rest is in ``meta``)
    positions: torch.Tensor  # [num_tokens]
    meta: AttentionMetadata
    graph: "torch.cuda.CUDAGraph | None" = None
    hidden: torch.Tensor | None = None  # [num_tokens, hidden] the graph's output buffer
    aux: list[torch.Tensor] | None = None


class StaticStep:
    def __init__(self, paged, capture_sizes: list[int], max_query_len: int, max_model_len: int, pad_block: int,
                 capture: bool):
        self.paged = paged
        self.sizes = sorted(capture_sizes)
        self.max_query_len = max_query_len
        self.block_size = paged.block_size
        self.max_blocks = -(-max_model_len // self.block_size)
        self.pad_block = pad_block
        self.capture = capture
        # no bucket's inputs exceed those of the largest one-row bucket (more rows: fewer sequences)
        size = Bucket(self.sizes[-1], 1, self.max_blocks, ()).num_inputs
        self._inputs = torch.zeros(size, dtype=torch.int64, device=paged.device)
        self._staging = torch.zeros(size, dtype=torch.int64, pin_memory=capture)
        self._copied = torch.cuda.Event() if capture else None  # the staging buffer may be rewritten
        self._entries: dict[Bucket, _Entry] = {}
        self._pool = torch.cuda.graph_pool_handle() if capture else None
        self.num_graphs_captured = 0

    def bucket(self, batch: list[ForwardInput], aux_layer_ids: tuple[int, ...]) -> Bucket | None:
        """The bucket ``batch`` runs in, or None: it is not uniform or no bucket holds it."""
        query_len = len(batch[0].token_ids)
        if query_len > self.max_query_len or any(
                len(b.token_ids) != query_len or b.tree is not None or b.positions is not None for b in batch):
            return None
        size = next((s for s in self.sizes if s >= len(batch) * query_len), None)
        num_blocks = -(-(max(b.start for b in batch) + query_len) // self.block_size)
        if size is None or num_blocks > self.max_blocks:
            return None
        num_blocks = min(max(MIN_BLOCKS, 1 << (num_blocks - 1).bit_length()), self.max_blocks)
        return Bucket(-(-size // query_len), query_len, num_blocks, tuple(aux_layer_ids))

    def forward(self, batch: list[ForwardInput], aux_layer_ids: tuple[int, ...]
                ) -> tuple[torch.Tensor, list[torch.Tensor], list[int]] | None:
        """``PagedModel.forward``'s result for a uniform batch; None where ``batch`` is not one."""
        bucket = self.bucket(batch, aux_layer_ids)
        if bucket is None:
            return None
        entry = self._entries.get(bucket) or self._entry(bucket)
        self._load(batch, bucket)
        num_tokens, query_len = len(batch) * bucket.query_len, bucket.query_len
        cu = list(range(0, num_tokens + 1, query_len))
        if not self.capture:
            hidden, aux = self._run(bucket, entry)
            return hidden[:num_tokens], [a[:num_tokens] for a in aux], cu
        if entry.graph is None:
            self._capture(bucket, entry)
        entry.graph.replay()
        return entry.hidden[:num_tokens].clone(), [a[:num_tokens].clone() for a in entry.aux], cu

    def _entry(self, bucket: Bucket) -> _Entry:
        """Device views at fixed offsets of the input buffer, and the metadata over them."""
        tokens, seqs = bucket.num_tokens, bucket.num_seqs
        ids, positions, slots, rest = self._inputs[:bucket.num_inputs].split(
            (tokens, tokens, tokens, seqs * (1 + bucket.num_blocks)))
        context_lens, table = rest[:seqs], rest[seqs:].view(seqs, bucket.num_blocks)
        meta = AttentionMetadata(slot_mapping=slots, block_table=table, max_query_len=bucket.query_len,
                                 max_context_len=bucket.num_blocks * self.block_size, block_size=self.block_size,
                                 query_lens=[bucket.query_len] * seqs,
                                 context_lens=[bucket.num_blocks * self.block_size] * seqs,
                                 sliding_window=self.paged.sliding_window, static=StaticBatch(context_lens))
        entry = _Entry(ids, positions, self.paged.model.attention_metadata(meta))
        self._entries[bucket] = entry
        return entry

    def _load(self, batch: list[ForwardInput], bucket: Bucket) -> None:
        """Pack the batch (and its padding) on the host and copy it to the bucket's views at once."""
        num_seqs, query_len, block_size = len(batch), bucket.query_len, self.block_size
        seqs, tokens = bucket.num_seqs, bucket.num_tokens
        offsets = torch.arange(query_len)
        positions = torch.zeros(seqs, query_len, dtype=torch.int64)
        positions[:num_seqs] = torch.tensor([b.start for b in batch])[:, None] + offsets
        positions[num_seqs:] = offsets  # padding: the first positions of the reserved block
        table = torch.full((seqs, bucket.num_blocks), self.pad_block, dtype=torch.int64)
        width = min(bucket.num_blocks, max(len(b.block_ids) for b in batch))
        blocks = block_rows(batch, width, self.paged.block_table)  # [num_seqs, width], -1 past the end
        table[:num_seqs, :width] = torch.where(blocks >= 0, blocks, self.pad_block)
        slots = table.gather(1, positions // block_size) * block_size + positions % block_size
        if self._copied is not None:
            self._copied.synchronize()
        host = self._staging[:bucket.num_inputs]
        host.zero_()
        host[:num_seqs * query_len] = torch.tensor([t for b in batch for t in b.token_ids], dtype=torch.int64)
        host[tokens:2 * tokens] = positions.flatten()
        host[2 * tokens:3 * tokens] = slots.flatten()
        host[3 * tokens:3 * tokens + seqs] = positions[:, -1] + 1  # context lengths
        host[3 * tokens + seqs:] = table.flatten()
        self._inputs[:host.numel()].copy_(host, non_blocking=self.capture)
        if self._copied is not None:
            self._copied.record()

    def _run(self, bucket: Bucket, entry: _Entry) -> tuple[torch.Tensor, list[torch.Tensor]]:
        with forward_context(entry.meta, self.paged.kv_cache):
            return self.paged.model(entry.input_ids, entry.positions, bucket.aux_layer_ids)

    def _capture(self, bucket: Bucket, entry: _Entry) -> None:
        """Warm up on a side stream (the allocator and cuBLAS settle), then capture the forward."""
        stream = torch.cuda.Stream(self.paged.device)
        stream.wait_stream(torch.cuda.current_stream(self.paged.device))
        with torch.cuda.stream(stream):
            self._run(bucket, entry)
        torch.cuda.current_stream(self.paged.device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            entry.hidden, entry.aux = self._run(bucket, entry)
        entry.graph = graph
        self.num_graphs_captured += 1

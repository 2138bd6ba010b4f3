"""Paged attention over a flat (varlen) token batch, in plain torch.

Contract
--------
Every step the model runner builds one ``AttentionMetadata`` for the whole
batch; each layer then (1) writes the new tokens' K/V into its paged cache at
``slot_mapping`` and (2) attends each sequence's queries to that sequence's
whole context, gathered block by block through ``block_table`` (a single
sequence whose blocks are consecutive is read as a view of the cache).

Position ``p`` of sequence ``i`` lives in cache slot
``block_table[i, p // block_size] * block_size + p % block_size``. Queries are the tokens of this
step (a prefill chunk, one decode token, or a decode token plus drafts to
verify). Causality and sliding windows are expressed in the boolean masks, so
several query tokens per sequence (chunked prefill, speculative verification)
need nothing special. The masks and the query padding (``SdpaIndex``) are built
on the SDPA path's first use in a step, so a step on the paged kernel builds
only the slot mapping and the block table.

Long queries (``max_query_len >= PER_SEQUENCE_MIN_QUERY``: prefill chunks) are
attended sequence by sequence instead, each over its own context only: padding
every prompt to the longest wastes most of the work when prompt lengths differ,
and a fresh prompt (queries = its whole context) runs SDPA's causal kernel,
which skips the masked half.

On CPU, where the C++ kernels built, every causal row runs ``draftwise_cpu::paged_attention``
instead (``csrc/paged_attention.cpp``): decode, verify, tree, prefill and prefill-chunk rows alike,
each with one arithmetic fixed by its position whatever the rows beside it, so a request's tokens
do not depend on how it was scheduled (batches, prefix-cache hits, chunked prefill, speculation).
It reads each sequence's K/V straight from its blocks, with neither the gathered copy nor the
masks. ``with_paged_kernel(meta)`` adds the two index tensors it takes. The SDPA paths below
serve the GPU, non-causal batches (a DFlash drafter's block) and machines without a compiler.

A model attends every batch with one kernel (``for_kernel``): the paged kernel, or SDPA in the
model's dtype or in fp32, so a row's arithmetic never depends on the rows batched with it.

Example: two sequences, one decoding at position 5 and one prefilling
positions 0..2. ``num_tokens`` = 4, ``query_index`` = [[0, 0, 0], [1, 2, 3]]
(pad repeats a valid index), ``context_lens`` = [6, 3]. When every sequence
has the same number of queries (all decoding, or one sequence verifying its
drafts) there is no padding and no ``query_index``.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from ..kernels import native
from .static_attention import StaticBatch, static_attend

PER_SEQUENCE_MIN_QUERY = 16  # from this many query rows in a sequence, attend sequence by sequence
NO_TREE = 1 << 62  # tree_start of a row that is not in a draft tree: it attends causally
PAGED_CHUNK_KEYS = 128  # keys the paged kernel sums apart (kChunkKeys in csrc/paged_attention.cpp)


@dataclass
class SdpaIndex:
    """What only the SDPA path reads: built on its first use in a step, never for the paged kernel."""
    query_index: torch.Tensor | None  # [num_seqs, max_query_len]; None when all query_lens are equal
    query_unpad_index: torch.Tensor | None  # [num_tokens] rows of the padded [num_seqs*max_q] output
    mask: torch.Tensor | None  # [num_seqs, 1, max_query_len, max_context_len] True = attend
    sliding_mask: torch.Tensor | None  # same, also limited to the sliding window


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor  # [num_tokens] cache slot for each new token's K/V
    block_table: torch.Tensor  # [num_seqs, ceil(max_context_len / block_size)] block ids, pad 0
    max_query_len: int = 1
    max_context_len: int = 1
    block_size: int = 16
    contiguous_start: int | None = None  # one sequence whose context sits in consecutive slots from here
    compute_dtype: torch.dtype | None = None  # attend in this dtype (e.g. fp32 for a bf16 model); None: q's
    query_lens: list[int] | None = None  # per sequence: query rows (this step's tokens)
    context_lens: list[int] | None = None  # per sequence: context length, this step's tokens included
    per_sequence: bool = False  # long causal queries: attend sequence by sequence
    causal: bool = True
    sliding_window: int | None = None
    cu_query_lens: torch.Tensor | None = None  # [num_seqs + 1]; set: run the paged CPU kernel
    seq_lens: torch.Tensor | None = None  # [num_seqs] context lengths, with cu_query_lens
    # Token trees: per row (tree_start, bits). A row sees key slot j <= its own slot where
    # j < tree_start, or bit (j - tree_start) of bits is set (ancestors in a draft tree, <= 64 slots);
    # rows outside any tree carry tree_start = NO_TREE (plain causal). None: every row is causal.
    tree_mask: torch.Tensor | None = None  # [num_tokens, 2] int64
    static: StaticBatch | None = None  # set: a uniform batch of fixed shapes (static_attention.py)
    _sdpa: SdpaIndex | None = field(default=None, init=False, repr=False, compare=False)

    def sdpa_index(self) -> SdpaIndex:
        if self._sdpa is None:
            self._sdpa = _sdpa_index(self.query_lens, self.context_lens, self.causal, self.sliding_window,
                                     self.block_table.device, self.tree_mask)
        return self._sdpa


def build_metadata(block_tables: torch.Tensor,  # [num_seqs, max_blocks] int64, pad -1
                   query_lens: list[int], context_lens: list[int], block_size: int,
                   sliding_window: int | None, device: torch.device, causal: bool = True,
                   tree_mask: torch.Tensor | None = None  # [num_tokens, 2] int64, see AttentionMetadata
                   ) -> AttentionMetadata:
    """Flatten the scheduled batch into what every layer shares: the new tokens' cache slots and
    the block table (the masks and query padding of the SDPA path come later, if it runs).

    ``causal=False`` lets every query see its sequence's whole context, the other queries
    of its block included (DFlash drafts a block non-causally). ``tree_mask`` narrows a causal
    batch's rows to their ancestors in a draft tree."""
    max_q, max_ctx = max(query_lens), max(context_lens)
    q_lens = torch.tensor(query_lens, dtype=torch.int64)
    ctx_lens = torch.tensor(context_lens, dtype=torch.int64)
    # Queries are the last query_len positions of each context.
    if max_q == 1:  # one token per sequence: the last position of each context
        seq_of_token, token_pos = torch.arange(len(query_lens)), ctx_lens - 1  # [num_tokens]
    else:
        seq_of_token = torch.repeat_interleave(torch.arange(len(query_lens)), q_lens)  # [num_tokens]
        first_row = torch.cumsum(q_lens, 0) - q_lens
        token_pos = (ctx_lens - q_lens - first_row)[seq_of_token] + torch.arange(len(seq_of_token))
    slot_mapping = block_tables[seq_of_token, token_pos // block_size] * block_size + token_pos % block_size
    num_ctx_blocks = -(-max_ctx // block_size)
    table = block_tables[:, :num_ctx_blocks].clamp_min(0)
    first = table[0, 0].item() if len(context_lens) == 1 else None
    contiguous = first is not None and bool((table[0] == first + torch.arange(num_ctx_blocks)).all())
    per_seq = causal and max_q >= PER_SEQUENCE_MIN_QUERY and tree_mask is None
    return AttentionMetadata(slot_mapping=slot_mapping.to(device), block_table=table.to(device), max_query_len=max_q,
                             max_context_len=max_ctx, block_size=block_size,
                             contiguous_start=first * block_size if contiguous else None,
                             query_lens=list(query_lens), context_lens=list(context_lens), per_sequence=per_seq,
                             causal=causal, sliding_window=sliding_window, tree_mask=tree_mask)


def _sdpa_index(query_lens: list[int], context_lens: list[int], causal: bool, sliding_window: int | None,
                device: torch.device, tree_mask: torch.Tensor | None = None) -> SdpaIndex:
    """Query padding to ``[num_seqs, max_q]`` (ragged queries) and the boolean masks."""
    max_q, max_ctx = max(query_lens), max(context_lens)
    q_lens = torch.tensor(query_lens, dtype=torch.int64)
    ctx_lens = torch.tensor(context_lens, dtype=torch.int64)
    key_pos = torch.arange(max_ctx, dtype=torch.int64)  # [max_ctx]
    key_valid = key_pos[None, :] < ctx_lens[:, None]  # [num_seqs, max_ctx]
    q_offset = torch.arange(max_q, dtype=torch.int64)
    q_valid = q_offset[None, :] < q_lens[:, None]  # [num_seqs, max_q]; pads repeat the last query
    query_pos = torch.where(q_valid, (ctx_lens - q_lens)[:, None] + q_offset[None, :], (ctx_lens - 1)[:, None])
    query_index = query_unpad_index = None
    if min(query_lens) != max_q:  # ragged queries: pad to [num_seqs, max_q] and back
        cu_q = torch.cumsum(q_lens, 0) - q_lens
        query_index = torch.where(q_valid, cu_q[:, None] + q_offset[None, :], cu_q[:, None])
        query_unpad_index = torch.arange(q_valid.numel()).view_as(q_valid)[q_valid]
    tree = None
    if tree_mask is not None:  # each padded query's (tree_start, bits), from its row
        first_row = torch.cumsum(q_lens, 0) - q_lens
        row = first_row[:, None] + torch.minimum(q_offset[None, :], (q_lens - 1)[:, None])  # [num_seqs, max_q]
        tree = tree_mask.cpu()[row]  # [num_seqs, max_q, 2]
    mask, sliding_mask = _masks(key_pos, key_valid, query_pos if causal else None, sliding_window,
                                need_mask=max_q > 1 or min(context_lens) != max_ctx or tree is not None, tree=tree)
    to_dev = lambda t: None if t is None else t.to(device)  # noqa: E731
    return SdpaIndex(to_dev(query_index), to_dev(query_unpad_index), to_dev(mask), to_dev(sliding_mask))


def with_paged_kernel(meta: AttentionMetadata) -> AttentionMetadata:
    """``meta`` set to run ``draftwise_cpu::paged_attention`` where it applies (causal CPU batches;
    the kernel is built)."""
    if not meta.causal or meta.block_table.device.type != "cpu" or not native.load():
        return meta
    q_lens = torch.tensor(meta.query_lens, dtype=torch.int64)
    cu = torch.zeros(len(meta.query_lens) + 1, dtype=torch.int64)
    torch.cumsum(q_lens, 0, out=cu[1:])
    return dataclasses.replace(meta, cu_query_lens=cu, seq_lens=torch.tensor(meta.context_lens, dtype=torch.int64))


def for_kernel(meta: AttentionMetadata, kernel: str) -> AttentionMetadata:
    """``meta`` set for ``kernel``: ``paged`` (the C++ kernel where it applies, else SDPA), ``fp32``
    (SDPA in fp32) or ``native`` (SDPA in the model's dtype)."""
    if kernel == "paged":
        return with_paged_kernel(meta)
    return dataclasses.replace(meta, compute_dtype=torch.float32) if kernel == "fp32" else meta


def _masks(key_pos: torch.Tensor,  # [max_ctx]
           key_valid: torch.Tensor,  # [num_seqs, max_ctx]
           query_pos: torch.Tensor | None,  # [num_seqs, max_q]; None: not causal
           sliding_window: int | None, need_mask: bool,
           tree: torch.Tensor | None = None  # [num_seqs, max_q, 2] (tree_start, bits) per query
           ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Causal (and sliding-window) masks ``[num_seqs, 1, max_q, max_ctx]``; None where all-True."""
    if query_pos is None:  # non-causal: every valid key, for every query
        return (key_valid[:, None, None, :] if need_mask else None), None
    windowed = sliding_window is not None and key_pos.numel() > sliding_window
    if not need_mask and not windowed:
        return None, None  # decode of equal-length contexts: every key is visible
    mask = (key_pos[None, None, :] <= query_pos[:, :, None]) & key_valid[:, None, :]
    logical_pos = query_pos
    if tree is not None:
        mask, logical_pos = _tree_visible(mask, key_pos, query_pos, tree)
    sliding = mask
    if windowed:
        sliding = mask & (key_pos[None, None, :] > logical_pos[:, :, None] - sliding_window)
    return (mask.unsqueeze(1) if need_mask else None), (sliding.unsqueeze(1) if sliding_window else None)


def _tree_visible(mask: torch.Tensor,  # [num_seqs, max_q, max_ctx] causal
                  key_pos: torch.Tensor,  # [max_ctx]
                  query_pos: torch.Tensor,  # [num_seqs, max_q] cache slot of each query
                  tree: torch.Tensor  # [num_seqs, max_q, 2] (tree_start, bits)
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """The causal mask narrowed to each tree row's ancestors, and each query's logical position
    (its depth in the tree past the tree's start: what a sliding window counts from)."""
    start, bits = tree[..., 0], tree[..., 1]
    offset = key_pos[None, None, :] - start[:, :, None]  # [num_seqs, max_q, max_ctx]
    in_tree = offset >= 0
    bit = (bits[:, :, None] >> offset.clamp(0, 63)) & 1
    mask = mask & (~in_tree | (bit == 1))
    popcount = ((bits[:, :, None] >> torch.arange(64)) & 1).sum(-1)  # [num_seqs, max_q]
    logical = torch.where(start <= query_pos, start + popcount - 1, query_pos)
    return mask, logical


def paged_attention(q: torch.Tensor,  # [num_tokens, num_heads, head_dim]
                    k: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
                    v: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
                    kv_cache: torch.Tensor,  # [2, num_slots, num_kv_heads, head_dim]
                    meta: AttentionMetadata, scale: float,
                    sliding: bool) -> torch.Tensor:  # [num_tokens, num_heads * head_dim]
    kv_cache[:, meta.slot_mapping] = torch.stack((k, v))
    return _attend(q, kv_cache, meta, scale, sliding)


def _attend(q: torch.Tensor,  # [num_tokens, num_heads, head_dim]
            kv_cache: torch.Tensor,  # [2, num_slots, num_kv_heads, head_dim], this step's K/V written
            meta: AttentionMetadata, scale: float,
            sliding: bool) -> torch.Tensor:  # [num_tokens, num_heads * head_dim]
    if meta.static is not None:
        window = meta.sliding_window if sliding else None
        return static_attend(q, kv_cache, meta.block_table, meta.static.context_lens, meta.block_size, scale,
                             window, meta.compute_dtype)
    if meta.cu_query_lens is not None:
        window = meta.sliding_window if sliding and meta.sliding_window else 0
        out = torch.ops.draftwise_cpu.paged_attention(q.contiguous(), kv_cache, meta.block_table, meta.cu_query_lens,
                                                      meta.seq_lens, meta.block_size, scale, window, meta.tree_mask)
        return out.view(q.shape[0], -1)
    keys, values = _context(kv_cache, meta).transpose(2, 3).unbind(0)  # [num_seqs, kv_heads, ctx, head_dim]
    index = meta.sdpa_index()
    if meta.per_sequence:
        return _per_sequence(q, keys, values, meta, index, scale, sliding)
    if index.query_index is None:  # every sequence has max_query_len queries: a view, no gather
        queries = q.view(-1, meta.max_query_len, *q.shape[1:]).transpose(1, 2)  # [num_seqs, heads, max_q, d]
    else:
        queries = q[index.query_index].transpose(1, 2)  # [num_seqs, num_heads, max_q, head_dim]
    mask = index.sliding_mask if sliding else index.mask
    out = _sdpa(queries, keys, values, mask, scale, meta.compute_dtype)
    num_seqs, num_heads, max_q, head_dim = out.shape
    out = out.transpose(1, 2).reshape(num_seqs * max_q, num_heads * head_dim).to(q.dtype)
    if index.query_unpad_index is not None:
        out = out[index.query_unpad_index]
    return out


def _per_sequence(q: torch.Tensor,  # [num_tokens, num_heads, head_dim]
                  keys: torch.Tensor, values: torch.Tensor,  # [num_seqs, kv_heads, max_ctx, head_dim]
                  meta: AttentionMetadata, index: SdpaIndex, scale: float,
                  sliding: bool) -> torch.Tensor:  # [num_tokens, num_heads * head_dim]
    """Each sequence's queries over its own context; causal kernel where the queries are the context."""
    outputs, start = [], 0
    full_mask = index.sliding_mask if sliding else index.mask
    windowed = sliding and index.sliding_mask is not None  # the window needs the explicit mask
    for i, (q_len, ctx_len) in enumerate(zip(meta.query_lens, meta.context_lens)):
        queries = q[start:start + q_len].transpose(0, 1)[None]  # [1, num_heads, q_len, head_dim]
        start += q_len
        causal = q_len == ctx_len and q_len > 1 and not windowed
        mask = None if causal or q_len == 1 and not windowed else full_mask[i:i + 1, :, :q_len, :ctx_len]
        out = _sdpa(queries, keys[i:i + 1, :, :ctx_len], values[i:i + 1, :, :ctx_len], mask, scale,
                    meta.compute_dtype, is_causal=causal)
        outputs.append(out[0].transpose(0, 1).reshape(q_len, -1))
    return torch.cat(outputs).to(q.dtype)


def _sdpa(queries: torch.Tensor,  # [num_seqs, num_heads, max_q, head_dim]
          keys: torch.Tensor, values: torch.Tensor,  # [num_seqs, kv_heads, ctx, head_dim]
          mask: torch.Tensor | None, scale: float, compute_dtype: torch.dtype | None,
          is_causal: bool = False) -> torch.Tensor:  # [num_seqs, num_heads, max_q, head_dim]
    if compute_dtype is not None and compute_dtype != queries.dtype:
        queries, keys, values = (t.to(compute_dtype) for t in (queries, keys, values))
    return F.scaled_dot_product_attention(queries, keys, values, attn_mask=mask, scale=scale, is_causal=is_causal,
                                          enable_gqa=keys.shape[1] != queries.shape[1])


def _context(kv_cache: torch.Tensor,  # [2, num_slots, num_kv_heads, head_dim]
             meta: AttentionMetadata) -> torch.Tensor:  # [2, num_seqs, max_context_len, kv_heads, head_dim]
    """Each sequence's K/V by position: a view when its blocks are consecutive, else a block gather
    (``index_select`` over the flattened table: several times faster on CPU than advanced indexing)."""
    if meta.contiguous_start is not None:
        start = meta.contiguous_start
        return kv_cache[:, start:start + meta.max_context_len].unsqueeze(1)
    num_seqs, num_blocks = meta.block_table.shape
    blocks = kv_cache.view(2, -1, meta.block_size, *kv_cache.shape[2:])
    blocks = blocks.index_select(1, meta.block_table.flatten())  # [2, num_seqs * num_blocks, block_size, ...]
    return blocks.view(2, num_seqs, num_blocks * meta.block_size, *kv_cache.shape[2:])[:, :, :meta.max_context_len]

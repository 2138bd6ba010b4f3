"""Token-tree masks in the paged CPU attention kernel (``kernels/csrc/attention/paged_attention.cpp``) and the C++
decoder stack. A row with ``(tree_start, bits)``, ``tree_start <= pos``, sees the keys before
tree_start and, from there on, those whose bit is set (its ancestors and itself); a sliding window
counts back from its logical position ``tree_start + popcount(bits) - 1`` over the keys before
tree_start only. The kernel matches a plain-torch softmax under that explicit mask (ragged
batches mixing tree and causal rows, GQA, bf16 / fp32, fixed and generic head dims, chunked
contexts, windows); without a mask, or with every row ``NO_TREE``, it is the causal kernel bit for
bit; and a tree verify step through the decoder stack gives each node what a chain of its
ancestors alone gives."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from draftwise.kernels import native
from draftwise.layers.attention import NO_TREE, build_metadata, paged_attention, with_paged_kernel

pytestmark = pytest.mark.skipif(not native.load(), reason="no C++ compiler: the kernel is not built here")
BLOCK_SIZE, NUM_BLOCKS, HEADS, KV_HEADS = 16, 160, 6, 2  # GQA group 3
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 2e-2}


def _signed(bits: int) -> int:  # a 64-bit mask as the int64 the kernel reads
    return bits - (1 << 64) if bits >= 1 << 63 else bits


def _random_tree(num_nodes: int, gen: torch.Generator) -> list[int]:
    """Ancestor bits of each node of a random tree, node 0 its root and every parent before its child."""
    bits = [1]
    for n in range(1, num_nodes):
        parent = int(torch.randint(0, n, (1,), generator=gen))
        bits.append(bits[parent] | 1 << n)
    return bits


def _tree_rows(query_lens: list[int], context_lens: list[int], trees: list[tuple[int, int] | None],
               gen: torch.Generator) -> torch.Tensor:  # [num_tokens, 2]
    """Per sequence, None (causal rows) or (cached, plain): a random tree over its last ``cached``
    context tokens before the queries and its query rows after the first ``plain`` ones, which stay
    causal (tree_start past them)."""
    rows = []
    for q_len, ctx, tree in zip(query_lens, context_lens, trees):
        if tree is None:
            rows += [(NO_TREE, 0)] * q_len
            continue
        cached, plain = tree
        start = ctx - q_len + plain - cached
        bits = _random_tree(cached + q_len - plain, gen)
        rows += [(NO_TREE, 0)] * plain + [(start, _signed(b)) for b in bits[cached:]]
    return torch.tensor(rows, dtype=torch.int64)


def _visible(pos: int, ctx: int, tree_start: int, bits: int, window: int) -> torch.Tensor:  # [ctx] bool
    """The semantics, spelled out: which keys a row at ``pos`` sees."""
    keys = torch.arange(ctx)
    tree = tree_start <= pos
    bits %= 1 << 64
    shown = torch.tensor([j < tree_start or bool(bits >> (j - tree_start) & 1) for j in range(ctx)])
    seen = (keys <= pos) & (shown if tree else True)
    if window > 0:
        logical = tree_start + bin(bits).count("1") - 1 if tree else pos
        in_window = keys > logical - window
        seen &= in_window | (keys >= tree_start) if tree else in_window
    return seen


def _reference(q, cache, table, query_lens, context_lens, tree_mask, scale, window):
    """Softmax attention in fp64 of every row over its sequence's keys under the explicit mask."""
    out, row = torch.empty(q.shape, dtype=torch.float64), 0
    group = q.shape[1] // cache.shape[2]
    for s, (q_len, ctx) in enumerate(zip(query_lens, context_lens)):
        j = torch.arange(ctx)
        slots = table[s, j // BLOCK_SIZE] * BLOCK_SIZE + j % BLOCK_SIZE
        keys, values = (cache[i, slots].double().repeat_interleave(group, dim=1) for i in (0, 1))  # [ctx, heads, d]
        for i in range(q_len):
            mask = _visible(ctx - q_len + i, ctx, *tree_mask[row].tolist(), window)
            scores = torch.einsum("hd,khd->hk", q[row].double() * scale, keys).masked_fill(~mask, float("-inf"))
            out[row] = torch.einsum("hk,khd->hd", scores.softmax(-1), values)
            row += 1
    return out


def _problem(query_lens, context_lens, dtype, head_dim, seed):
    """(q, cache, block table, query_start, context_lens) of a random paged batch over scattered blocks."""
    gen = torch.Generator().manual_seed(seed)
    width = -(-max(context_lens) // BLOCK_SIZE)
    table = torch.randperm(NUM_BLOCKS, generator=gen)[:len(context_lens) * width].view(len(context_lens), width)
    q = torch.randn(sum(query_lens), HEADS, head_dim, generator=gen).to(dtype)
    cache = torch.randn(2, NUM_BLOCKS * BLOCK_SIZE, KV_HEADS, head_dim, generator=gen).to(dtype)
    starts = torch.tensor([0, *torch.tensor(query_lens).cumsum(0).tolist()])
    return q, cache, table, starts, torch.tensor(context_lens), gen


def _kernel(q, cache, table, starts, lens, head_dim, window, tree_mask=None):
    return torch.ops.draftwise_cpu.paged_attention(q, cache, table, starts, lens, BLOCK_SIZE, head_dim ** -0.5,
                                                   window, tree_mask)


# Sequences: a decode, trees whose queries start at the tree's root or below nodes already cached,
# one of 64 nodes (bit 63, the sign bit), causal rows before a tree's rows, a tree across a chunk end.
BATCH = dict(query_lens=[1, 7, 5, 64, 9, 12], context_lens=[37, 140, 300, 200, 9, 131],
             trees=[None, None, (3, 0), (0, 0), (2, 2), (0, 0)])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("head_dim", [64, 48])  # a fixed-dim build and the generic one
@pytest.mark.parametrize("window", [0, 20])
def test_tree_rows_match_the_explicit_mask(dtype, head_dim, window):
    q, cache, table, starts, lens, gen = _problem(BATCH["query_lens"], BATCH["context_lens"], dtype, head_dim, 1)
    tree = _tree_rows(BATCH["query_lens"], BATCH["context_lens"], BATCH["trees"], gen)
    out = _kernel(q, cache, table, starts, lens, head_dim, window, tree)
    ref = _reference(q, cache, table, BATCH["query_lens"], BATCH["context_lens"], tree, head_dim ** -0.5, window)
    torch.testing.assert_close(out.double(), ref, atol=TOLERANCE[dtype], rtol=0)


@pytest.mark.parametrize("window", [4, 133])
def test_a_tree_row_windows_from_its_logical_position(window):
    """Tree rows deep in the context but shallow in their tree (a star): their window starts before
    the first query row's (a key chunk earlier at 133: the sequence's work then starts there). Rows
    of a chain deeper than the window: the window hides the keys before the tree, none in it."""
    query_lens, context_lens = [20, 12, 1], [400, 250, 250]
    q, cache, table, starts, lens, gen = _problem(query_lens, context_lens, torch.float32, 64, 2)
    star = [1] + [1 | 1 << n for n in range(1, 30)]  # node 0 and its children: logical positions start + 0 / 1
    chain = [(1 << n + 1) - 1 for n in range(17)]  # logical position = position
    tree = torch.tensor([(400 - 20 - 10, b) for b in star[10:]]  # ten nodes cached before the queries
                        + [(250 - 12 - 5, b) for b in chain[5:]] + [(NO_TREE, 0)])
    out = _kernel(q, cache, table, starts, lens, 64, window, tree)
    ref = _reference(q, cache, table, query_lens, context_lens, tree, 64 ** -0.5, window)
    torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=0)
    assert not torch.allclose(out[:20], _kernel(q, cache, table, starts, lens, 64, window)[:20], atol=1e-3)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("head_dim", [64, 128, 48])
@pytest.mark.parametrize("window", [0, 20])
def test_no_tree_rows_are_the_causal_kernel_bit_for_bit(dtype, head_dim, window):
    query_lens, context_lens = [1, 6, 3, 64], [17, 300, 129, 200]
    q, cache, table, starts, lens, _ = _problem(query_lens, context_lens, dtype, head_dim, 3)
    plain = torch.tensor([(NO_TREE, 0)] * sum(query_lens))
    assert torch.equal(_kernel(q, cache, table, starts, lens, head_dim, window, plain),
                       _kernel(q, cache, table, starts, lens, head_dim, window))


def test_attention_passes_the_metadata_tree_mask_to_the_kernel():
    """``paged_attention`` on metadata with a tree mask (``with_paged_kernel`` keeps it) writes the
    step's K/V and attends under the mask."""
    query_lens, context_lens = [4, 1, 6], [30, 18, 70]
    q, cache, table, _, _, gen = _problem(query_lens, context_lens, torch.float32, 32, 4)
    k, v = (torch.randn(sum(query_lens), KV_HEADS, 32, generator=gen) for _ in range(2))
    tree = _tree_rows(query_lens, context_lens, [(0, 0), None, (1, 1)], gen)
    meta = build_metadata(table, query_lens, context_lens, BLOCK_SIZE, None, torch.device("cpu"))
    meta = with_paged_kernel(dataclasses.replace(meta, tree_mask=tree))
    assert meta.cu_query_lens is not None and meta.tree_mask is tree
    out = paged_attention(q, k, v, cache, meta, 0.2, False)
    ref = _reference(q, cache, table, query_lens, context_lens, tree, 0.2, 0)
    torch.testing.assert_close(out.double(), ref.view(out.shape), atol=1e-5, rtol=0)


def test_a_tree_start_out_of_reach_of_its_bits_is_refused():
    q, cache, table, starts, lens, _ = _problem([2], [100], torch.float32, 64, 5)
    with pytest.raises(RuntimeError, match="tree_start"):
        _kernel(q, cache, table, starts, lens, 64, 0, torch.tensor([[NO_TREE, 0], [30, 1]]))
    with pytest.raises(RuntimeError, match="tree_mask"):
        _kernel(q, cache, table, starts, lens, 64, 0, torch.tensor([[NO_TREE, 0]]))


@pytest.fixture(scope="module", params=["llama", "gemma3"])  # gemma3: sliding layers (window 8) and q/k norms
def stacked(request, tmp_path_factory):
    """(name, a tiny random model of that architecture on Q8_0 blocks, its layers in the C++ stack,
    attention on the paged kernel)."""
    from test_model_parity import CPU, MAX_POS, random_checkpoint

    from draftwise.models.registry import build_model, load_config

    path = tmp_path_factory.mktemp(f"tree-{request.param}")
    random_checkpoint(request.param, path)
    model = build_model(path, load_config(path), torch.float32, CPU, max_positions=MAX_POS, quantization="q8_0")
    if model.stack is None:
        pytest.skip("the decoder stack does not apply here")
    model.set_attention_plan({64: "paged"})
    return request.param, model


# A verify step of 5 tree nodes after a 20-token prompt: a is the root, b and c its children, d of b, e of c.
TREE_BITS, TREE_POSITIONS, PROMPT = [0b1, 0b11, 0b101, 0b1011, 0b10101], [20, 21, 21, 22, 22], 20
PATHS = [[0, 1, 3], [0, 2, 4]]  # root to leaf


@torch.no_grad()
def test_a_tree_step_through_the_stack_equals_each_path_alone(stacked):
    """Each node's hidden state in the tree step (whole-stack C++ path) equals that of a causal
    step over its root-to-leaf path alone; the layer-by-layer halves (Python attention on the same
    metadata) give the tree step bit for bit."""
    from test_decoder_stack import whole_and_halves
    from test_model_parity import BLOCK_SIZE, CPU, _kv_cache, _tokens, _window

    from draftwise.layers.forward_context import forward_context

    name, model = stacked
    table, prompt, nodes = torch.tensor([[3, 0]]), _tokens(PROMPT, seed=5), _tokens(5, seed=6)
    kv = _kv_cache(model)

    def step(ids, positions, context, tree_mask=None):  # the hidden states of one step, and its metadata
        meta = build_metadata(table, [len(ids)], [context], BLOCK_SIZE, _window(model), CPU)
        meta = dataclasses.replace(model.attention_metadata(meta), tree_mask=tree_mask)
        with forward_context(meta, kv):
            return model(ids, positions)[0], meta

    step(prompt, torch.arange(PROMPT), PROMPT)
    prompt_kv = kv.clone()
    tree_mask = torch.tensor([(PROMPT, b) for b in TREE_BITS])
    tree, meta = step(nodes, torch.tensor(TREE_POSITIONS), PROMPT + 5, tree_mask)
    assert meta.cu_query_lens is not None, name  # the whole-stack path
    tree_kv = kv.clone()
    for path in PATHS:
        kv.copy_(prompt_kv)
        alone, _ = step(nodes[path], torch.tensor(TREE_POSITIONS)[path], PROMPT + len(path))
        torch.testing.assert_close(tree[path], alone, atol=1e-5, rtol=1e-5, msg=name)
    kv.copy_(prompt_kv)
    unmasked, _ = step(nodes, torch.tensor(TREE_POSITIONS), PROMPT + 5)
    assert not torch.allclose(unmasked[2:], tree[2:], atol=1e-2), name  # siblings do change the result

    whole, halves, kv_whole, kv_halves = whole_and_halves(model, meta, nodes, torch.tensor(TREE_POSITIONS), prompt_kv)
    assert torch.equal(whole, halves) and torch.equal(kv_whole, kv_halves) and torch.equal(kv_whole, tree_kv), name

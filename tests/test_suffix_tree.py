"""The suffix tree behind ``suffix`` drafting, checked against brute-force substring counting."""
from __future__ import annotations

import gc
import random

import pytest
from conftest import PROMPTS, greedy

from draftwise import LLM
from draftwise.spec_decode.suffix_tree import ROOT, SuffixTree


def _paths(tree: SuffixTree) -> dict[tuple[int, ...], int]:
    out, stack = {}, [((), ROOT)]
    while stack:
        path, node = stack.pop()
        for token, child in tree.children(node).items():
            out[path + (token,)] = tree.count(child)
            stack.append((path + (token,), child))
    return out


def _brute_counts(seqs: list[list[int]], depth: int) -> dict[tuple[int, ...], int]:
    out: dict[tuple[int, ...], int] = {}
    for seq in seqs:
        for start in range(len(seq)):
            for end in range(start + 1, min(len(seq), start + depth) + 1):
                key = tuple(seq[start:end])
                out[key] = out.get(key, 0) + 1
    return out


def _brute_best_score(seqs, depth, context, max_spec, factor, min_prob) -> float:
    counts = _brute_counts(seqs, depth)
    best = 0.0
    for m in range(1, min(len(context), depth) + 1):
        path = tuple(context[-m:])
        if path not in counts:
            break
        prob, score, drafted = 1.0, 0.0, 0
        while drafted < min(max_spec, int(m * factor)):
            nexts = {k[-1]: c for k, c in counts.items() if len(k) == len(path) + 1 and k[:-1] == path}
            if not nexts:
                break
            token = max(nexts, key=nexts.get)
            prob *= nexts[token] / counts[path]
            if prob < min_prob:
                break
            score, drafted, path = score + prob, drafted + 1, path + (token,)
        best = max(best, score)
    return best


@pytest.mark.parametrize("depth", [1, 3, 6])
def test_counts_match_brute_force_under_incremental_extend_and_remove(depth):
    rng = random.Random(depth)
    seqs = {key: [rng.randrange(4) for _ in range(rng.randrange(1, 40))] for key in range(5)}
    tree = SuffixTree(depth)
    for key, seq in seqs.items():  # extend in uneven pieces
        cut = rng.randrange(len(seq) + 1)
        tree.extend(key, seq[:cut])
        tree.extend(key, seq[cut:])
    assert _paths(tree) == _brute_counts(list(seqs.values()), depth)
    for key in (1, 3):
        tree.remove(key)
        del seqs[key]
    assert _paths(tree) == _brute_counts(list(seqs.values()), depth)
    assert tree.count(ROOT) == sum(len(s) for s in seqs.values())
    for key in list(seqs):
        tree.remove(key)
    assert tree.children(ROOT) == {} and tree.count(ROOT) == 0 and len(tree) == 0
    assert tree.num_nodes == 1  # every removed node was recycled


def test_removed_nodes_are_reused_and_counts_stay_exact():
    rng = random.Random(3)
    tree, live = SuffixTree(5), {}
    for step in range(60):  # a FIFO of sequences, as the global cache keeps
        live[step] = [rng.randrange(6) for _ in range(rng.randrange(1, 30))]
        tree.extend(step, live[step])
        if len(live) > 4:
            oldest = min(live)
            tree.remove(oldest)
            del live[oldest]
    assert _paths(tree) == _brute_counts(list(live.values()), 5)
    assert tree.num_nodes == len(_paths(tree)) + 1


def test_tree_adds_nothing_for_the_garbage_collector_to_walk():
    # A node per tracked container made every full collection walk the whole tree: a server's
    # trees paused every stream for 0.3-0.4 s at a time.
    tracked_before = len(gc.get_objects())
    tree = SuffixTree(24)
    tree.extend("a", list(range(2000)))
    assert tree.num_nodes > 40000
    assert len(gc.get_objects()) - tracked_before < 100


def test_speculate_scores_match_brute_force():
    rng = random.Random(7)
    for _ in range(30):
        depth = rng.choice([2, 4, 8])
        seqs = [[rng.randrange(5) for _ in range(rng.randrange(5, 60))] for _ in range(3)]
        tree = SuffixTree(depth)
        for key, seq in enumerate(seqs):
            tree.extend(key, seq)
        context = seqs[0][:rng.randrange(1, len(seqs[0]) + 1)]
        args = (rng.randrange(1, 10), rng.choice([0.5, 1.0, 2.0]), rng.choice([0.0, 0.1, 0.4]))
        draft = tree.speculate(context, *args)
        assert draft.score == pytest.approx(_brute_best_score(seqs, depth, context, *args))
        assert len(draft.token_ids) <= args[0]


def test_speculate_follows_the_most_frequent_continuation():
    tree = SuffixTree(8)
    tree.extend("a", [1, 2, 3, 4, 1, 2, 3, 5, 1, 2, 3, 4])
    draft = tree.speculate([9, 1, 2, 3], max_spec_tokens=8)
    # "1 2 3" went on with 4 twice and 5 once, and ends the sequence once: P(4) = 2/3
    assert draft.token_ids[0] == 4 and draft.match_len == 3
    assert tree.speculate([7, 7], max_spec_tokens=8).token_ids == []  # no match, no draft
    assert tree.speculate([1, 2, 3], max_spec_tokens=0).token_ids == []
    # the draft never exceeds match_len * factor tokens
    assert len(tree.speculate([4], max_spec_tokens=8, max_spec_factor=1.0).token_ids) <= 1


def test_min_token_prob_cuts_the_path():
    tree = SuffixTree(4)
    tree.extend(0, [1, 2, 1, 3, 1, 4, 1, 5])  # after 1: four continuations, 1/4 each
    assert tree.speculate([1], 4, min_token_prob=0.3).token_ids == []
    assert len(tree.speculate([1], 4, min_token_prob=0.2).token_ids) == 1


def test_global_cache_is_bounded_and_fifo(tiny_model_dir):
    config = {"method": "suffix", "num_speculative_tokens": 4, "suffix_decoding_max_cached_requests": 2}
    llm = LLM(model=str(tiny_model_dir), dtype="float32", speculative_config=config)
    proposer = llm.llm_engine.speculator.proposer
    for prompt in PROMPTS[:4]:
        llm.generate(prompt, greedy(8), use_tqdm=False)
    assert len(proposer._cached) == 2 and len(proposer._global) == 2
    assert proposer.tracked_seq_ids() == set()
    off = LLM(model=str(tiny_model_dir), dtype="float32",
              speculative_config=dict(config, suffix_decoding_max_cached_requests=0))
    off.generate(PROMPTS[0], greedy(8), use_tqdm=False)
    assert off.llm_engine.speculator.proposer._global is None

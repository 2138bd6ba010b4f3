"""ngram drafting's per-sequence index proposes what a scan of the whole context proposes: the tokens
after the earliest earlier occurrence of the longest suffix n-gram, as the context grows step by step."""
import random

import pytest

from draftwise.spec_decode.proposers.ngram import NgramIndex


def scan_draft(tokens: list[int], min_n: int, max_n: int, k: int) -> list[int]:
    """The definition, by brute force."""
    num = len(tokens)
    for n in range(min(max_n, num - 1), min_n - 1, -1):
        suffix = tokens[num - n:]
        for end in range(n - 1, num - 1):
            if tokens[end - n + 1:end + 1] == suffix:
                return tokens[end + 1:end + 1 + k]
    return []


@pytest.mark.parametrize("min_n,max_n", [(1, 1), (1, 4), (2, 3), (5, 5)])
def test_index_matches_scan_as_context_grows(min_n, max_n):
    rng = random.Random(min_n * 10 + max_n)
    for trial in range(20):
        vocab = rng.choice([2, 3, 5, 50])
        tokens = [rng.randrange(vocab) for _ in range(rng.randrange(0, 40))]
        index = NgramIndex(min_n, max_n)
        for _ in range(30):
            k = rng.randrange(0, 6)
            assert index.draft(tokens, k) == scan_draft(tokens, min_n, max_n, k), (trial, tokens, k)
            tokens = tokens + [rng.randrange(vocab) for _ in range(rng.randrange(1, 5))]  # a step's accepted tokens


def test_earliest_occurrence_and_longest_match():
    index = NgramIndex(1, 3)
    assert index.draft([7, 1, 2, 9, 1, 2, 8, 3, 1, 2], 2) == [9, 1]  # "1 2" twice: the earliest wins
    index = NgramIndex(1, 3)
    assert index.draft([5, 1, 2, 9, 4, 1, 2, 8, 4, 1, 2], 2) == [8, 4]  # "4 1 2" beats the earlier "1 2"
    assert NgramIndex(2, 2).draft([1, 2, 3], 3) == []  # no earlier occurrence: no draft


def test_a_shorter_context_is_indexed_again():
    index = NgramIndex(1, 2)
    assert index.draft([1, 2, 3, 1, 2], 2) == [3, 1]
    assert index.draft([4, 5, 4], 2) == [5, 4]  # (after preemption the list starts over)

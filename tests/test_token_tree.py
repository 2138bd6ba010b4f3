"""Token trees (``speculative_token_tree``): the tree's layout, its attention masks, its verification,
and end to end: tree outputs equal plain decoding, greedy and seeded-sampled, with the accepted
path's K/V moved into place (an oracle drafter that puts the target's own tokens somewhere in the
tree, so long paths are accepted from every branch), and sampled verification follows the
target distribution (chi-square)."""
from __future__ import annotations

import json
import random

import openai
import pytest
import torch
from conftest import API_KEY, PROMPTS, SERVED_NAME, greedy, start_server, stop_server

from draftwise import LLM, SamplingParams
from draftwise.layers.attention import NO_TREE, _attend, build_metadata
from draftwise.sample import SamplingMetadata, SpecDecodeMetadata
from draftwise.sample.verify.rejection_sampler import rejection_sample
from draftwise.spec_decode.config import SpeculativeConfig
from draftwise.spec_decode.interface import _REGISTRY, DraftBatch, Proposer, register
from draftwise.spec_decode.token_tree import TokenTree, path_nodes

TREE = "[(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0), (0, 1, 0), (0, 0, 0, 0)]"


def test_tree_is_kept_breadth_first_with_parents_and_masks():
    tree = TokenTree.parse("[(0, 0), (1,), (0,), (0, 1), (1, 0), (0, 0, 0)]")
    assert tree.paths == ((0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0))
    assert tree.parents == (-1, -1, 0, 0, 1, 2)
    assert tree.depths == (1, 1, 2, 2, 2, 3)
    assert tree.ranks == (0, 1, 0, 1, 0, 0)
    assert tree.ancestor_bits[5] == 0b1001011  # root, (0,), (0, 0), itself
    assert list(tree.level(2)) == [2, 3, 4] and tree.num_children(0) == 2 and tree.num_children(5) == 0
    assert path_nodes(list(tree.parents), 5) == [0, 2, 5]
    assert TokenTree.parse([(0,), (0, 0)]).is_chain
    # node i sits at slot root + 1 + i, position root + depth: both must fall in one 128-key block
    assert tree.chunk_aligned(100, 128) == 6 and tree.chunk_aligned(126, 128) == 1
    assert tree.chunk_aligned(127, 128) == 6  # the root ends a block: every node starts the next


@pytest.mark.parametrize("value, says", [
    ("[(0,), (1, 0)]", "missing"),
    ("[(0,), (0,)]", "twice"),
    ("[(0,), (-1,)]", "ranks"),
    ("[]", "non-empty"),
    ("not a tree", "list of tuples"),
    (str([(i,) for i in range(63)]), "at most 62"),
])
def test_bad_trees_name_the_key(value, says):
    with pytest.raises(ValueError, match="speculative_token_tree") as info:
        TokenTree.parse(value)
    assert says in str(info.value)


def test_tree_config_rules(spec_dirs):
    eagle3 = {"method": "eagle3", "model": str(spec_dirs["eagle3"])}
    config = SpeculativeConfig.from_value({**eagle3, "speculative_token_tree": TREE})
    assert config.num_speculative_tokens == 9 and config.token_tree.max_depth == 4
    assert config.to_dict()["speculative_token_tree"] == str(list(TokenTree.parse(TREE).paths))
    with pytest.raises(ValueError, match="tree's number of nodes"):
        SpeculativeConfig.from_value({**eagle3, "speculative_token_tree": TREE, "num_speculative_tokens": 3})
    with pytest.raises(ValueError, match="is 4 deep, which needs 4 heads: .* has 3 heads"):
        SpeculativeConfig.from_value({"method": "medusa", "model": str(spec_dirs["medusa"]),
                                      "speculative_token_tree": TREE})
    with pytest.raises(ValueError, match="only .*draft trees"):
        SpeculativeConfig.from_value({"method": "ngram", "num_speculative_tokens": 2,
                                      "speculative_token_tree": "[(0,), (1,)]"})
    chain = SpeculativeConfig.from_value({"method": "ngram", "speculative_token_tree": "[(0,), (0, 0)]"})
    assert chain.token_tree is None and chain.num_speculative_tokens == 2  # a chain is no tree


def test_tree_rows_attend_to_their_ancestors_only():
    torch.manual_seed(0)
    tree = TokenTree.parse(TREE)
    heads, kv_heads, dim, block_size, context = 4, 2, 16, 4, 10
    cache = torch.randn(2, 64, kv_heads, dim)
    q = torch.randn(2 + len(tree), heads, dim)  # a plain decode row, then the root and the tree
    tree_mask = torch.tensor([[NO_TREE, 0], [context, 1]] + [[context, b] for b in tree.ancestor_bits])
    meta = build_metadata(torch.tensor([[8, 9, 10, 11, 12, 13], [0, 1, 2, 3, 4, 5]]), [1, 1 + len(tree)],
                          [7, context + 1 + len(tree)], block_size, None, torch.device("cpu"), tree_mask=tree_mask)
    out = _attend(q, cache, meta, 0.25, False)

    def reference(query, slots):
        keys = cache[0, slots].repeat_interleave(heads // kv_heads, 1)
        values = cache[1, slots].repeat_interleave(heads // kv_heads, 1)
        weights = (torch.einsum("hd,nhd->hn", query, keys) * 0.25).softmax(-1)
        return torch.einsum("hn,nhd->hd", weights, values).reshape(-1)

    expected = [reference(q[0], list(range(32, 39))), reference(q[1], list(range(context + 1)))]
    expected += [reference(q[2 + i], list(range(context + 1)) + [context + 1 + n
                                                                 for n in path_nodes(list(tree.parents), i)])
                 for i in range(len(tree))]
    torch.testing.assert_close(out, torch.stack(expected), atol=1e-5, rtol=1e-5)


def _tree_meta(num_seqs: int, depths: list[int], greedy: bool) -> SamplingMetadata:
    rows = num_seqs * (len(depths) + 1)
    return SamplingMetadata(
        all_greedy=greedy, greedy=torch.full((rows,), greedy), temperature=torch.ones(rows), top_k=None,
        top_p=None, min_p=None, seeds=torch.arange(num_seqs).repeat_interleave(len(depths) + 1) * 7919 + 13,
        positions=torch.tensor([0] + depths).repeat(num_seqs) + 100)


def test_greedy_tree_takes_the_deepest_matching_path():
    parents = [-1, -1, 0, 1, 3]  # (0,), (1,), (0, 0), (1, 0), (1, 0, 0)
    drafts = [[4, 2, 1, 3, 5]]
    argmax = [2, 0, 3, 0, 5, 1]  # per row: root, then each draft's row
    logits = torch.full((6, 8), -5.0)
    logits[torch.arange(6), torch.tensor(argmax)] = 5.0
    spec = SpecDecodeMetadata.from_drafts(drafts, None, torch.device("cpu"), parents=[parents])
    out = rejection_sample(logits, _tree_meta(1, [1, 1, 2, 2, 3], True), spec)
    assert out.num_accepted.tolist() == [3] and out.path.tolist() == [[1, 3, 4, -1, -1]]
    assert out.token_ids[0].tolist() == [2, 3, 5, 1, -1, -1]  # the path, then the last row's argmax
    assert out.row_index[0, :4].tolist() == [0, 2, 4, 5]


def test_sampled_tree_follows_the_target_distribution():
    """Root children a, b (the root row's two likeliest tokens), each with one child. The first
    token follows the root row's p; the second, given the first was a (or b), follows a's (b's) row."""
    vocab, num_seqs = 6, 40000
    gen = torch.Generator().manual_seed(0)
    p_logits = torch.randn(3, vocab, generator=gen) * 1.5  # rows: root, a, b
    p = torch.softmax(p_logits, dim=-1)
    a, b = p[0].topk(2).indices.tolist()
    parents, depths = [-1, -1, 0, 1], [1, 1, 2, 2]
    logits = torch.cat([p_logits, p_logits[1:3]]).repeat(num_seqs, 1)  # rows of the depth-2 drafts: unused
    spec = SpecDecodeMetadata.from_drafts([[a, b, 0, 1]] * num_seqs, None, torch.device("cpu"),
                                          parents=[parents] * num_seqs)
    out = rejection_sample(logits, _tree_meta(num_seqs, depths, False), spec)
    first = out.token_ids[:, 0]
    assert _chi2_pvalue(torch.bincount(first, minlength=vocab).float(), p[0]) > 1e-3
    for token, row in ((a, 1), (b, 2)):
        second = out.token_ids[first == token, 1]
        assert len(second) > 3000
        assert _chi2_pvalue(torch.bincount(second, minlength=vocab).float(), p[row]) > 1e-3
    accepted = (out.num_accepted >= 1).float().mean().item()
    assert abs(accepted - (p[0, a] + p[0, b]).item()) < 0.01


def _chi2_pvalue(counts: torch.Tensor, probs: torch.Tensor) -> float:
    expected = probs * counts.sum()
    keep = expected > 0
    stat = ((counts[keep] - expected[keep]) ** 2 / expected[keep]).sum()
    return float(1 - torch.special.gammainc(torch.tensor(float(keep.sum() - 1)) / 2, stat / 2))


class TreeOracle(Proposer):
    """Drafts the config's tree with the target's own next tokens (``expected``, by prompt) placed at
    a random rank under each right node (at none one time in ten), and distinct wrong tokens elsewhere."""
    method = "tree_oracle"
    drafts_trees = True
    expected: dict[tuple[int, ...], list[int]] = {}

    def propose(self, batch):
        tree, drafts = self.config.token_tree, []
        for seq, limit in zip(batch.seqs, batch.max_num_drafts):
            want, done = self.expected[tuple(seq.prompt_token_ids)], seq.num_output_tokens
            rng = random.Random(hash((tuple(seq.prompt_token_ids), done)))  # the same every run
            right_rank = {n: rng.randrange(tree.num_children(n)) if tree.num_children(n) and rng.random() < 0.9
                          else -1 for n in range(-1, len(tree))}  # -1: no child is right
            right, tokens = {-1: True}, []
            for i in range(min(limit, len(tree))):
                index = done + tree.depths[i] - 1
                truth = want[index] if index < len(want) else 0
                right[i] = right[tree.parents[i]] and tree.ranks[i] == right_rank[tree.parents[i]]
                tokens.append(truth if right[i] else (truth + 1 + tree.ranks[i]) % 100)
            drafts.append(tokens)
        return DraftBatch.from_lists(drafts, parents=list(tree.parents))


@pytest.fixture
def oracle(monkeypatch):
    """The oracle registered, and every draft verified (the draft-length policy keeps them all)."""
    monkeypatch.setenv("DRAFTWISE_VERIFY_ROW_COST", "0")
    register(TreeOracle)
    yield TreeOracle
    _REGISTRY.pop(TreeOracle.method)


def _expect(llm, oracle, prompts, params) -> list[list[int]]:
    outs = llm.generate(prompts, params, use_tqdm=False)
    for out in outs:
        oracle.expected[tuple(out.prompt_token_ids)] = out.outputs[0].token_ids
    return outs


@pytest.mark.parametrize("sampled", [False, True])
def test_oracle_tree_outputs_equal_plain(tiny_llm, tiny_model_dir, oracle, sampled):
    prompts = PROMPTS[:6]
    if sampled:  # seeded: a tree follows plain decoding's own draws, penalties and min_tokens included
        params = [SamplingParams(temperature=0.8, seed=i, max_tokens=28, logprobs=2, min_tokens=6,
                                 repetition_penalty=1.2, presence_penalty=0.3) for i in range(len(prompts))]
    else:
        params = [greedy(24 + 3 * i, logprobs=2) for i in range(len(prompts))]
    plain = _expect(tiny_llm, oracle, prompts, params)
    llm = LLM(model=str(tiny_model_dir), dtype="float32", seed=0,
              speculative_config={"method": "tree_oracle", "speculative_token_tree": TREE})
    got = llm.generate(prompts, params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in got] == [o.outputs[0].token_ids for o in plain]
    for a, b in zip(got, plain):
        for lp_a, lp_b in zip(a.outputs[0].logprobs, b.outputs[0].logprobs):
            assert lp_a.keys() == lp_b.keys()
            assert all(abs(lp_a[t].logprob - lp_b[t].logprob) < 1e-4 for t in lp_a)
    stats = llm.get_spec_decode_stats()
    assert stats["spec_decode_mean_acceptance_length"] > 2.0  # paths through every branch were accepted


def test_oracle_tree_cut_per_request_equals_plain(tiny_llm, tiny_model_dir, oracle):
    """Requests capping their drafts verify a prefix of the tree (2 nodes: two siblings; 1: a chain)."""
    prompts = PROMPTS[:4]
    params = [greedy(30, extra_args={"num_speculative_tokens": cap}) for cap in (None, 2, 1, 5)]
    plain = _expect(tiny_llm, oracle, prompts, [greedy(30)] * 4)
    llm = LLM(model=str(tiny_model_dir), dtype="float32", seed=0,
              speculative_config={"method": "tree_oracle", "speculative_token_tree": TREE})
    got = llm.generate(prompts, params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in got] == [o.outputs[0].token_ids for o in plain]


@pytest.mark.parametrize("engine_args", [
    {"kv_cache_memory_bytes": 12 * 16 * 2 * 2 * 2 * 16 * 4 * 2},  # 12 blocks: sequences are preempted
    {"async_scheduling": True},
])
def test_oracle_tree_with_preemption_and_async_scheduling_equals_plain(tiny_llm, tiny_model_dir, oracle,
                                                                       engine_args):
    prompts = PROMPTS[:6] + PROMPTS[:2]  # repeated prompts: prefix-cache hits
    params = [greedy(30 + i) for i in range(len(prompts))]
    plain = _expect(tiny_llm, oracle, prompts, params)
    llm = LLM(model=str(tiny_model_dir), dtype="float32", seed=0, **engine_args,
              speculative_config={"method": "tree_oracle", "speculative_token_tree": TREE})
    got = llm.generate(prompts, params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in got] == [o.outputs[0].token_ids for o in plain]
    engine = llm.llm_engine
    if "kv_cache_memory_bytes" in engine_args:
        assert engine.scheduler.num_preemptions > 0
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


SHALLOW_TREE = "[(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0)]"  # for the 3 tiny Medusa heads


@pytest.mark.parametrize("method", ["eagle", "eagle3", "medusa", "draft_model", "draft_model_self"])
def test_drafter_trees_greedy_equal_plain(tiny_llm, tiny_model_dir, spec_dirs, method):
    """Every tree-drafting method; the target drafting for itself accepts the first-choice path."""
    prompts, params = PROMPTS[:5], [greedy(20 + 4 * i) for i in range(5)]
    plain = tiny_llm.generate(prompts, params, use_tqdm=False)
    tree = SHALLOW_TREE if method == "medusa" else TREE
    dirs = {**spec_dirs, "draft_model": spec_dirs["draft"], "draft_model_self": tiny_model_dir}
    model = str(dirs[method])
    llm = LLM(model=str(tiny_model_dir), dtype="float32", seed=0,
              speculative_config={"method": method.removesuffix("_self"), "model": model,
                                  "speculative_token_tree": tree})
    got = llm.generate(prompts, params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in got] == [o.outputs[0].token_ids for o in plain]
    stats = llm.get_spec_decode_stats()
    assert stats["spec_decode_num_draft_tokens"] > 0
    if method == "draft_model_self":
        assert stats["spec_decode_mean_acceptance_length"] > 3.0  # depth 4: nearly every path accepted


def test_served_tree_answers_as_plain(tiny_llm, tiny_model_dir, spec_dirs, tmp_path):
    """``draftwise serve -sc '{..., "speculative_token_tree": ...}'`` through the openai client."""
    config = {"method": "eagle3", "model": str(spec_dirs["eagle3"]), "speculative_token_tree": TREE}
    proc, url = start_server(tiny_model_dir, tmp_path / "serve.log", ("-sc", json.dumps(config)))
    try:
        client = openai.OpenAI(base_url=url + "/v1", api_key=API_KEY, max_retries=0, timeout=120)
        for prompt in PROMPTS[:3]:
            answer = client.completions.create(model=SERVED_NAME, prompt=prompt, max_tokens=24, temperature=0)
            plain = tiny_llm.generate(prompt, greedy(24), use_tqdm=False)[0].outputs[0].text
            assert answer.choices[0].text == plain
    finally:
        stop_server(proc)


def test_single_layer_mtp_trees_equal_plain(tiny_model_dir, tmp_path):
    import drafter_ckpts

    target = drafter_ckpts.write_mtp_target(tmp_path / "mtp1", tiny_model_dir, num_layers=1)
    prompts, params = PROMPTS[:4], [greedy(24) for _ in range(4)]
    plain = LLM(model=str(target), dtype="float32", seed=0).generate(prompts, params, use_tqdm=False)
    llm = LLM(model=str(target), dtype="float32", seed=0,
              speculative_config={"method": "mtp", "speculative_token_tree": TREE})
    got = llm.generate(prompts, params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in got] == [o.outputs[0].token_ids for o in plain]
    assert llm.get_spec_decode_stats()["spec_decode_num_draft_tokens"] > 0
    two = drafter_ckpts.write_mtp_target(tmp_path / "mtp2", tiny_model_dir, num_layers=2)
    with pytest.raises(ValueError, match="one MTP layer"):
        SpeculativeConfig.from_value({"method": "mtp", "model": str(two), "speculative_token_tree": TREE})


@pytest.mark.slow
def test_smollm2_eagle3_tree_greedy_equals_plain_on_the_default_path(monkeypatch):
    """The bundled model and head at the default precision (the paged kernel's tree masks): a tree
    changes no token, past the kernel's 128-key block boundary too."""
    monkeypatch.setenv("DRAFTWISE_VERIFY_ROW_COST", "0")
    questions = ["Explain why the sky is blue in two sentences.", "Write a short poem about autumn leaves.",
                 "What are three tips for learning a new language?"]
    conversations = [[{"role": "user", "content": q}] for q in questions]
    params = greedy(100)
    plain = [o.outputs[0].token_ids for o in LLM(seed=0).chat(conversations, params, use_tqdm=False)]
    llm = LLM(seed=0, speculative_config={"method": "eagle3", "model": "draftwise/SmolLM2-135M-Instruct-eagle3",
                                          "speculative_token_tree": TREE})
    assert [o.outputs[0].token_ids for o in llm.chat(conversations, params, use_tqdm=False)] == plain
    assert llm.get_spec_decode_stats()["spec_decode_mean_acceptance_length"] > 1.5

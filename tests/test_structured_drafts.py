"""Structured outputs with speculation, and the grammar as a drafter: constrained outputs equal
plain constrained decoding (fp32 greedy and seeded sampling) with every method and with the
grammar's own drafts alone; a draft the grammar forbids never reaches verification; a cut
draft that carried probabilities is recovered exactly as verifying it would have."""
from __future__ import annotations

import json

import jsonschema
import pytest
import torch
from conftest import PROMPTS, greedy
from test_spec_equivalence import drafting_methods, spec_configs
from test_structured_outputs import PERSON, SCHEMAS, json_params

from draftwise import LLM, SamplingParams, StructuredOutputsParams
from draftwise.sample import SamplingMetadata, SpecDecodeMetadata
from draftwise.sample.verify.rejection_sampler import rejection_sample

# Schema-shaped JSON: objects whose keys the grammar forces (and a prompt an n-gram drafter can copy).
JSON_PROMPT = 'Answer in JSON. {"name":"ab","age":12,"ok":true} {"name":"cd","age":7,"ok":false} '
PROMPTS_JSON = [JSON_PROMPT] + PROMPTS[:5]


def _tokens(outs):
    return [c.token_ids for o in outs for c in o.outputs]


def _workload():
    """Constrained requests (greedy and seeded) mixed with unconstrained ones."""
    params = [json_params(s) for s in SCHEMAS] + [json_params(PERSON, temperature=0.9, seed=11)]
    params += [greedy(20), SamplingParams(temperature=0.8, seed=5, max_tokens=16)]
    return PROMPTS_JSON, params


@pytest.fixture(scope="module")
def plain_constrained(tiny_model_dir):
    """The outputs of plain constrained decoding: no proposer, no grammar drafts."""
    llm = LLM(model=str(tiny_model_dir), dtype="float32", seed=0, additional_config={"grammar_drafts": False})
    prompts, params = _workload()
    outs = llm.generate(prompts, params, use_tqdm=False)
    assert llm.get_spec_decode_stats()["grammar_num_draft_tokens"] == 0
    return _tokens(outs)


def test_grammar_drafts_alone_equal_plain_constrained_decoding(tiny_model_dir, plain_constrained):
    llm = LLM(model=str(tiny_model_dir), dtype="float32", seed=0)
    assert llm.get_spec_decode_stats() == {}  # nothing structured ran yet
    prompts, params = _workload()
    execute, decode_rows = llm.llm_engine.runner.execute, []

    def record(scheduled, needs=None):  # tokens computed per decoding sequence, its drafts aside
        decode_rows.extend(item.num_new_tokens for item in scheduled if item.seq.num_output_tokens)
        return execute(scheduled, needs)

    llm.llm_engine.runner.execute = record
    assert _tokens(llm.generate(prompts, params, use_tqdm=False)) == plain_constrained
    # The cache kept the accepted drafts' K/V and dropped the rejected ones' (BlockManager.rollback):
    # every step computes only the token sampled last, never an accepted draft again.
    assert decode_rows and set(decode_rows) == {1}
    assert [_tokens(llm.generate(p, sp, use_tqdm=False))[0] for p, sp in zip(prompts, params)] == plain_constrained
    stats = llm.get_spec_decode_stats()
    assert stats["grammar_num_draft_tokens"] > 0 and 0 < stats["grammar_num_accepted_tokens"]
    assert stats["grammar_num_accepted_tokens"] <= stats["grammar_num_draft_tokens"]
    engine = llm.llm_engine  # rejected grammar drafts were rolled back in the cache of a plain engine
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks and not engine.structured.states


@pytest.mark.parametrize("method", drafting_methods())
def test_every_method_equals_plain_constrained_decoding(method, tiny_model_dir, spec_dirs, plain_constrained):
    llm = LLM(model=str(tiny_model_dir), dtype="float32", seed=0, speculative_config=spec_configs(spec_dirs)[method])
    prompts, params = _workload()
    assert _tokens(llm.generate(prompts, params, use_tqdm=False)) == plain_constrained
    assert _tokens(llm.generate(prompts[::-1], params[::-1], use_tqdm=False))[::-1] == plain_constrained
    stats = llm.get_spec_decode_stats()
    assert stats["spec_decode_num_drafts"] > 0 and stats["grammar_num_draft_tokens"] > 0


@pytest.mark.parametrize("method", ["eagle3", "draft_model"])
def test_token_trees_equal_plain_constrained_decoding(method, tiny_model_dir, spec_dirs, plain_constrained):
    """A constrained sequence verifies its tree's first-choice chain; the free ones in its batch, the tree."""
    model = spec_dirs["draft" if method == "draft_model" else method]
    llm = LLM(model=str(tiny_model_dir), dtype="float32", seed=0,
              speculative_config={"method": method, "model": str(model),
                                  "speculative_token_tree": "[(0,), (1,), (0, 0), (1, 0), (0, 0, 0)]"})
    prompts, params = _workload()
    assert _tokens(llm.generate(prompts, params, use_tqdm=False)) == plain_constrained
    stats = llm.get_spec_decode_stats()
    assert stats["spec_decode_num_drafts"] > 0 and stats["grammar_num_draft_tokens"] > 0


def test_async_scheduling_equals_plain_constrained_decoding(tiny_model_dir, spec_dirs, plain_constrained):
    prompts, params = _workload()
    for config in (None, spec_configs(spec_dirs)["ngram"]):
        llm = LLM(model=str(tiny_model_dir), dtype="float32", seed=0, speculative_config=config,
                  async_scheduling=True)
        assert _tokens(llm.generate(prompts, params, use_tqdm=False)) == plain_constrained


def test_grammar_drafts_with_preemption_equal_plain(tiny_model_dir, spec_dirs, plain_constrained):
    prompts, params = _workload()
    block = 16 * 2 * 2 * 16 * 4  # bytes of one layer's K and V in a 16-token block (tiny model)
    for config, layers in ((None, 2), (spec_configs(spec_dirs)["ngram"], 2), (spec_configs(spec_dirs)["eagle"], 3)):
        llm = LLM(model=str(tiny_model_dir), dtype="float32", seed=0, speculative_config=config,
                  kv_cache_memory_bytes=13 * layers * block)  # 13 blocks
        assert _tokens(llm.generate(prompts, params, use_tqdm=False)) == plain_constrained
        engine = llm.llm_engine
        assert engine.scheduler.num_preemptions > 0
        assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


@pytest.mark.parametrize("prompt, constraint", [
    (JSON_PROMPT, StructuredOutputsParams(json=PERSON, disable_any_whitespace=True)),
    # n-gram copies " b 3 c" after " 2": letters the regex forbids where nothing is forced
    ("Numbers: 1 a 2 b 3 c 4 d 5 e 1 a 2 b 3 c 4 d 5 e", StructuredOutputsParams(regex=r"( [0-9]){6,12}")),
])
def test_a_forbidden_draft_never_reaches_verification(tiny_model_dir, prompt, constraint):
    """n-gram drafts copied from the prompt are often invalid at that point: every draft the target
    verifies is one the grammar admits after the sequence's tokens, and some the proposer made
    were not (cut before costing a row)."""
    llm = LLM(model=str(tiny_model_dir), dtype="float32", speculative_config={
        "method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_min": 1, "prompt_lookup_max": 2})
    engine = llm.llm_engine
    params = SamplingParams(temperature=0.0, max_tokens=60, structured_outputs=constraint)
    text = engine.structured.check(params)
    proposed, verified = [], []
    propose, execute = engine.speculator.proposer.propose, engine.runner.execute

    def record_propose(batch):
        drafts = propose(batch)
        proposed.extend((list(seq.output_token_ids), drafts.token_ids[i, :n].tolist())
                        for i, (seq, n) in enumerate(zip(batch.seqs, drafts.num_draft_tokens)) if n)
        return drafts

    def record_execute(scheduled, needs=None):
        verified.extend((list(s.seq.output_token_ids), list(s.spec_token_ids)) for s in scheduled if s.spec_token_ids)
        return execute(scheduled, needs)

    engine.speculator.proposer.propose, engine.runner.execute = record_propose, record_execute
    llm.generate([prompt, prompt + " "], params, use_tqdm=False)
    template = engine.structured.compiler.lookup(text)

    def num_valid(output, drafts) -> int:
        matcher = template.deep_copy()
        assert matcher.consume_tokens(output)
        return matcher.validate_tokens(drafts)

    assert verified and all(num_valid(out, drafts) == len(drafts) for out, drafts in verified)
    assert any(num_valid(out, drafts) < len(drafts) for out, drafts in proposed)


def _sampled_meta(num_rows: int, seed: int) -> SamplingMetadata:
    return SamplingMetadata(all_greedy=False, greedy=torch.zeros(num_rows, dtype=torch.bool),
                            temperature=torch.ones(num_rows), top_k=None, top_p=None, min_p=None,
                            seeds=torch.full((num_rows,), seed), positions=torch.arange(num_rows) + 40)


def test_a_cut_draft_with_probabilities_is_recovered_as_its_rejection():
    """Verifying a forbidden draft x ~ q (the grammar masks p(x) to 0, so it is surely rejected) and
    cutting it while handing its q to the sampler emit the same token, seed by seed."""
    vocab, forbidden = 8, 3
    torch.manual_seed(0)
    bitmask = torch.tensor([[0xFF & ~(1 << forbidden)]], dtype=torch.int32)  # every token but x
    changed = 0
    for seed in range(200):
        logits = torch.randn(2, vocab)
        q = torch.softmax(torch.randn(vocab) * 2, dim=-1)
        verify = _sampled_meta(2, seed)
        verify.grammar_rows, verify.grammar_bitmask = torch.tensor([0]), bitmask
        spec = SpecDecodeMetadata.from_drafts([[forbidden]], [q[None]], torch.device("cpu"))
        kept = rejection_sample(logits, verify, spec).token_ids[0, 0]
        cut = _sampled_meta(1, seed)
        cut.grammar_rows, cut.grammar_bitmask = torch.tensor([0]), bitmask
        residual = SpecDecodeMetadata.from_drafts([[]], [None], torch.device("cpu"), [q])
        recovered = rejection_sample(logits[:1], cut, residual).token_ids[0, 0]
        assert recovered == kept != forbidden
        plain = rejection_sample(logits[:1], cut, SpecDecodeMetadata.from_drafts([[]], [None], torch.device("cpu")))
        changed += int(plain.token_ids[0, 0] != kept)
    assert changed > 0  # without the residual the bonus token would differ: the test can fail


def test_probabilistic_draft_model_follows_the_grammar(tiny_model_dir, spec_dirs):
    llm = LLM(model=str(tiny_model_dir), dtype="float32", speculative_config={
        "method": "draft_model", "model": str(spec_dirs["draft"]), "num_speculative_tokens": 3,
        "draft_sample_method": "probabilistic"})
    params = [json_params(s, temperature=1.0, seed=i) for i, s in enumerate(SCHEMAS * 2)]
    outs = llm.generate(PROMPTS_JSON, params, use_tqdm=False)
    done = [(o, p) for o, p in zip(outs, params) if o.outputs[0].finish_reason == "stop"]
    assert len(done) >= 4
    for out, p in done:
        jsonschema.validate(json.loads(out.outputs[0].text), p.structured_outputs.json)
    assert llm.get_spec_decode_stats()["spec_decode_num_accepted_tokens"] > 0


def test_choice_and_regex_with_speculation(tiny_model_dir, spec_dirs, tiny_llm):
    constraints = [StructuredOutputsParams(choice=["the quick brown fox", "the lazy dog"]),
                   StructuredOutputsParams(regex=r"(ab|cd){2,4}[0-9]{2}")]
    params = [SamplingParams(temperature=0.0, max_tokens=30, structured_outputs=c) for c in constraints]
    expected = _tokens(tiny_llm.generate(PROMPTS[:2], params, use_tqdm=False))
    llm = LLM(model=str(tiny_model_dir), dtype="float32", speculative_config=spec_configs(spec_dirs)["suffix"])
    assert _tokens(llm.generate(PROMPTS[:2], params, use_tqdm=False)) == expected


@pytest.mark.slow
def test_smollm2_grammar_drafts_equal_plain_fp32():
    """SmolLM2 in fp32 on schema-shaped JSON: the grammar's drafts (no speculative_config) leave the
    output unchanged, and most of them are accepted."""
    llm = LLM(dtype="float32", max_model_len=512)
    prompt = llm.get_tokenizer().apply_chat_template(
        [{"role": "user", "content": "A JSON object for the colour red: name, hex code, rgb values."}],
        tokenize=False, add_generation_prompt=True)
    schema = {"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 20}, "hex_code": {"type": "string", "maxLength": 10},
        "rgb_values": {"type": "array", "items": {"type": "integer"}, "maxItems": 3}},
        "required": ["name", "hex_code", "rgb_values"], "additionalProperties": False}
    params = json_params(schema, max_tokens=60)
    llm.llm_engine.structured.grammar_drafts = False
    plain = llm.generate(prompt, params, use_tqdm=False)[0].outputs[0]
    llm.llm_engine.structured.grammar_drafts = True
    drafted = llm.generate(prompt, params, use_tqdm=False)[0].outputs[0]
    assert drafted.token_ids == plain.token_ids and drafted.finish_reason == "stop"
    assert set(json.loads(drafted.text)) == {"name", "hex_code", "rgb_values"}
    stats = llm.get_spec_decode_stats()
    assert stats["grammar_num_accepted_tokens"] >= 0.8 * stats["grammar_num_draft_tokens"] > 0

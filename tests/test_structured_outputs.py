"""Structured outputs offline (``SamplingParams.structured_outputs``): every constrained output
follows its constraint (JSON schema, JSON object, regex, choice, GBNF grammar), on the tiny
random model (which only ever follows the grammar's mask) and on SmolLM2; bad constraints are
refused naming the field; grammars compile once, off the step loop; logprobs stay raw."""
from __future__ import annotations

import json
import re
import threading
import time

import jsonschema
import pytest
from conftest import PROMPTS, greedy

from draftwise import LLM, SamplingParams, StructuredOutputsParams
from draftwise.structured.compiler import GrammarCompiler

PERSON = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 6},
    "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "ok": {"type": "boolean"}}, "required": ["name", "age", "ok"], "additionalProperties": False}
DIGITS = {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9}, "minItems": 1, "maxItems": 4}
SHAPE = {"type": "object", "properties": {
    "color": {"enum": ["red", "green", "blue"]},
    "point": {"type": "object", "properties": {"x": {"type": "integer", "minimum": -99, "maximum": 99},
                                               "y": {"type": "integer", "minimum": -99, "maximum": 99}},
              "required": ["x", "y"]}}, "required": ["color", "point"]}
SCHEMAS = [PERSON, DIGITS, SHAPE]
# "(d+d+...)": a small GBNF grammar, and the regex it is equivalent to.
GBNF = 'root ::= "(" num ("+" num)* ")"\nnum ::= [0-9]'
GBNF_AS_REGEX = r"\([0-9](\+[0-9])*\)"


def json_params(schema, **kw) -> SamplingParams:
    kw.setdefault("max_tokens", 80)
    kw.setdefault("temperature", 0.0)
    return SamplingParams(structured_outputs=StructuredOutputsParams(json=schema, disable_any_whitespace=True,
                                                                     disable_additional_properties=True), **kw)


def assert_mostly_finished(outs, at_least: float = 0.75) -> list:
    """The completions that finished with "stop" (the only ones a constraint must fully match)."""
    done = [c for o in outs for c in o.outputs if c.finish_reason == "stop"]
    assert len(done) >= at_least * sum(len(o.outputs) for o in outs), [c.finish_reason for o in outs
                                                                        for c in o.outputs]
    return done


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_json_schema_outputs_validate(tiny_llm, temperature):
    params = [json_params(s, temperature=temperature, seed=i) for i, s in enumerate(SCHEMAS * 3)]
    outs = tiny_llm.generate((PROMPTS * 2)[:len(params)], params, use_tqdm=False)
    assert_mostly_finished(outs)
    for out, p in zip(outs, params):
        completion = out.outputs[0]
        if completion.finish_reason == "stop":
            jsonschema.validate(json.loads(completion.text), p.structured_outputs.json)
            outside_strings = re.sub(r'"(?:[^"\\]|\\.)*"', "S", completion.text)
            assert not re.search(r"\s", outside_strings), completion.text  # disable_any_whitespace


def test_whitespace_pattern_and_closed_objects(tiny_llm):
    """Free whitespace matches ``whitespace_pattern``; ``disable_additional_properties`` closes an
    open schema (the tiny model would otherwise add properties of its own)."""
    open_schema = {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 9},
                                                    "b": {"type": "boolean"}}, "required": ["a", "b"]}
    params = SamplingParams(temperature=1.0, seed=1, max_tokens=60, structured_outputs=StructuredOutputsParams(
        json=open_schema, whitespace_pattern="[ ]", disable_additional_properties=True))
    outs = tiny_llm.generate(PROMPTS[:4], params, use_tqdm=False)
    for completion in (c for c in assert_mostly_finished(outs)):
        assert set(json.loads(completion.text)) == {"a", "b"}
        outside_strings = re.sub(r'"(?:[^"\\]|\\.)*"', "S", completion.text)
        assert not re.search(r"\s\s|[^\S ]", outside_strings), completion.text


def test_json_object_regex_choice_and_gbnf(tiny_llm):
    constraints = {"json_object": StructuredOutputsParams(json_object=True, disable_any_whitespace=True),
                   "regex": StructuredOutputsParams(regex=r"[a-d]{2,6}-[0-9]{1,3}"),
                   "choice": StructuredOutputsParams(choice=["yes", "no", "maybe not"]),
                   "grammar": StructuredOutputsParams(grammar=GBNF)}
    for kind, constraint in constraints.items():
        params = [SamplingParams(temperature=t, seed=3, max_tokens=60, structured_outputs=constraint)
                  for t in (0.0, 0.8)]
        for out in tiny_llm.generate(PROMPTS[:2] * 2, params * 2, use_tqdm=False):
            completion = out.outputs[0]
            assert completion.finish_reason == "stop" or kind == "json_object", (kind, completion)
            text = completion.text
            if completion.finish_reason != "stop":
                continue
            if kind == "json_object":
                assert isinstance(json.loads(text), dict)
            elif kind == "regex":
                assert re.fullmatch(constraint.regex, text), text
            elif kind == "choice":
                assert text in constraint.choice
            else:
                assert re.fullmatch(GBNF_AS_REGEX, text), text


def test_grammar_completion_finishes_without_eos(tiny_llm, tokenizer):
    """A complete grammar ends the sequence at once with "stop": no EOS, the text is every token."""
    params = SamplingParams(temperature=0.0, max_tokens=30,
                            structured_outputs=StructuredOutputsParams(choice=["the lazy dog"]))
    completion = tiny_llm.generate("Hello", params, use_tqdm=False)[0].outputs[0]
    assert (completion.text, completion.finish_reason, completion.stop_reason) == ("the lazy dog", "stop", None)
    assert tokenizer.decode(completion.token_ids) == "the lazy dog"
    assert tokenizer.eos_token_id not in completion.token_ids


def test_eos_only_where_the_grammar_accepts(tiny_llm, eos_info):
    """The tiny model emits EOS at step eos_step of its greedy output; a constraint that cannot end
    there keeps going, and one that ends with any number of letters may end with EOS."""
    free = tiny_llm.generate(eos_info["eos_prompt"], greedy(20), use_tqdm=False)[0].outputs[0]
    assert free.token_ids[-1] == eos_info["eos_id"]
    must_continue = SamplingParams(temperature=0.0, max_tokens=40, structured_outputs=StructuredOutputsParams(
        regex=r"[a-z ]{30,40}"))
    out = tiny_llm.generate(eos_info["eos_prompt"], must_continue, use_tqdm=False)[0].outputs[0]
    assert out.finish_reason == "stop" and re.fullmatch(r"[a-z ]{30,40}", out.text)
    assert eos_info["eos_id"] not in out.token_ids


def test_logprobs_are_the_raw_models(tiny_llm):
    """The first output position's top logprobs are the same with and without a constraint (raw
    logprobs), while the constrained token itself may rank low."""
    prompt = PROMPTS[1]
    plain = tiny_llm.generate(prompt, greedy(1, logprobs=5), use_tqdm=False)[0].outputs[0]
    constrained = tiny_llm.generate(prompt, SamplingParams(
        temperature=0.0, max_tokens=1, logprobs=5, structured_outputs=StructuredOutputsParams(choice=["Z"])),
        use_tqdm=False)[0].outputs[0]
    top_plain = {t: lp.logprob for t, lp in plain.logprobs[0].items() if lp.rank <= 5}
    top_constrained = {t: lp for t, lp in constrained.logprobs[0].items()}
    chosen = constrained.token_ids[0]
    assert constrained.text == "Z" and top_constrained[chosen].rank > 1
    for token, logprob in top_plain.items():
        assert top_constrained[token].logprob == pytest.approx(logprob, abs=1e-5)


def test_n_sequences_each_follow_the_schema(tiny_llm):
    outs = tiny_llm.generate(PROMPTS[0], json_params(PERSON, n=4, temperature=1.0, seed=7), use_tqdm=False)
    texts = [c.text for c in assert_mostly_finished(outs)]
    for text in texts:
        jsonschema.validate(json.loads(text), PERSON)
    assert len(set(texts)) > 1  # each sequence has its own matcher


def test_unconstrained_requests_unchanged_in_a_mixed_batch(tiny_llm):
    plain = [greedy(m) for m in (12, 20, 8, 16)]
    alone = [o.outputs[0].token_ids for o in tiny_llm.generate(PROMPTS[:4], plain, use_tqdm=False)]
    mixed = tiny_llm.generate(PROMPTS[:4] * 2, plain + [json_params(s) for s in SCHEMAS + [PERSON]],
                              use_tqdm=False)
    assert [o.outputs[0].token_ids for o in mixed[:4]] == alone


@pytest.mark.parametrize("field, value, says", [
    ("json", {"type": "strin"}, "Invalid type"),
    ("json", '{"type": "string", "minLength": -1}', "minLength"),
    ("regex", "a(b", "unclosed group"),
    ("grammar", "root ::= undefined_rule", "undefined_rule"),
    ("grammar", "this is not a grammar", "GBNF"),
    ("structural_tag", json.dumps({"structures": [{"begin": "<x>", "schema": {}, "end": "</x>"}],
                                   "triggers": ["<y"]}), "trigger"),
    ("structural_tag", '{"nope": 1}', "structures"),
])
def test_invalid_constraints_name_the_field_and_change_nothing(tiny_llm, field, value, says):
    engine = tiny_llm.llm_engine
    params = SamplingParams(max_tokens=4, structured_outputs=StructuredOutputsParams(**{field: value}))
    with pytest.raises(ValueError, match=rf"StructuredOutputsParams\.{field} is invalid") as info:
        engine.add_request("bad", "Hello", params)
    assert says in str(info.value)
    assert not engine.has_unfinished_requests() and not engine.structured.waiting
    out = tiny_llm.generate("Hello", json_params(DIGITS), use_tqdm=False)[0].outputs[0]
    assert out.finish_reason == "stop" and json.loads(out.text)


def test_structural_tag_compiles_and_runs(tiny_llm):
    tag = json.dumps({"structures": [{"begin": "<f=add>", "schema": {"type": "object"}, "end": "</f>"}],
                      "triggers": ["<f="]})
    params = SamplingParams(temperature=0.0, max_tokens=10,
                            structured_outputs=StructuredOutputsParams(structural_tag=tag))
    assert tiny_llm.generate("Hello", params, use_tqdm=False)[0].outputs[0].finish_reason in ("stop", "length")


def test_same_constraint_compiles_once(tiny_model_dir):
    llm = LLM(model=str(tiny_model_dir), dtype="float32")
    compiler = llm.llm_engine.structured.compiler
    as_text = json.dumps(PERSON, indent=3)  # the same schema, formatted differently
    first = llm.generate(PROMPTS[:2], [json_params(PERSON), json_params(as_text)], use_tqdm=False)
    again = llm.generate(PROMPTS[:2], json_params(PERSON), use_tqdm=False)
    assert compiler.num_compiled == 1 and compiler.num_hits >= 2
    assert [o.outputs[0].token_ids for o in first] == [o.outputs[0].token_ids for o in again]
    llm.generate(PROMPTS[0], json_params(DIGITS), use_tqdm=False)
    assert compiler.num_compiled == 2


def test_a_slow_compile_does_not_stall_other_requests(tiny_model_dir, monkeypatch):
    """A grammar that takes seconds to compile: its request waits outside the scheduler while an
    unconstrained request runs to the end; then it runs and its output is unchanged."""
    release = threading.Event()
    real_compile = GrammarCompiler.compile

    def slow_compile(self, text):
        release.wait(timeout=30)
        return real_compile(self, text)

    llm = LLM(model=str(tiny_model_dir), dtype="float32")
    expected = llm.generate(PROMPTS[2], json_params(SHAPE), use_tqdm=False)[0].outputs[0].token_ids
    llm = LLM(model=str(tiny_model_dir), dtype="float32")
    engine = llm.llm_engine
    monkeypatch.setattr(GrammarCompiler, "compile", slow_compile)
    engine.add_request("slow", PROMPTS[2], json_params(SHAPE))
    engine.add_request("aborted", PROMPTS[3], json_params(DIGITS, n=2))
    engine.add_request("free", PROMPTS[0], greedy(12, ignore_eos=True))
    engine.abort_request("aborted")  # while its grammar compiles
    done = {}
    for _ in range(100):
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out
        if "free" in done:
            break
    assert "free" in done and len(done["free"].outputs[0].token_ids) == 12
    assert "slow" not in done and "aborted" not in done  # still compiling: nothing of it ran
    assert [[seq.request_id for seq in w.seqs] for w in engine.structured.waiting] == [["slow"]]
    release.set()
    start = time.monotonic()
    while "slow" not in done and time.monotonic() - start < 30:
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out
    assert done["slow"].outputs[0].token_ids == expected


def test_preemption_keeps_constrained_outputs(tiny_model_dir, tiny_llm):
    params = [json_params(s) for s in SCHEMAS * 2] + [greedy(30)] * 2
    prompts = (PROMPTS * 2)[:len(params)]
    expected = [o.outputs[0].token_ids for o in tiny_llm.generate(prompts, params, use_tqdm=False)]
    small = LLM(model=str(tiny_model_dir), dtype="float32", kv_cache_memory_bytes=14 * 16 * 2 * 2 * 2 * 16 * 4)
    assert [o.outputs[0].token_ids for o in small.generate(prompts, params, use_tqdm=False)] == expected
    engine = small.llm_engine
    assert engine.scheduler.num_preemptions > 0
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks and not engine.structured.states


@pytest.mark.slow
def test_smollm2_json_schema_validates():
    """The real model, greedy, two schemas at once (one with free whitespace): valid JSON, and the
    grammar drafted tokens that were accepted."""
    llm = LLM(max_model_len=512)
    prompt = llm.get_tokenizer().apply_chat_template(
        [{"role": "user", "content": "Describe a book as JSON: title, author, year, pages."}],
        tokenize=False, add_generation_prompt=True)
    book = {"type": "object", "properties": {"title": {"type": "string", "maxLength": 40},
                                             "author": {"type": "string", "maxLength": 40},
                                             "year": {"type": "integer"}, "pages": {"type": "integer"}},
            "required": ["title", "author", "year", "pages"], "additionalProperties": False}
    params = [json_params(book, temperature=0.0, max_tokens=80),
              SamplingParams(temperature=0.0, max_tokens=80, structured_outputs=StructuredOutputsParams(json=book))]
    for out in llm.generate([prompt, prompt], params, use_tqdm=False):
        assert out.outputs[0].finish_reason == "stop"
        jsonschema.validate(json.loads(out.outputs[0].text), book)
    stats = llm.get_spec_decode_stats()
    assert stats["grammar_num_accepted_tokens"] > 0


def test_a_grammar_that_fails_to_build_fails_its_request_alone(tiny_model_dir, monkeypatch):
    """A grammar that validated but does not build with the tokenizer: that request ends with
    finish_reason "error" and says why; the others run as usual."""
    def broken(self, text):
        raise ValueError("the grammar does not compile: simulated")

    llm = LLM(model=str(tiny_model_dir), dtype="float32")
    monkeypatch.setattr(GrammarCompiler, "compile", broken)
    outs = llm.generate(PROMPTS[:2], [json_params(PERSON), greedy(6, ignore_eos=True)], use_tqdm=False)
    assert outs[0].outputs[0].finish_reason == "error" and "simulated" in outs[0].error
    assert outs[1].outputs[0].finish_reason == "length" and outs[1].error is None
    assert not llm.llm_engine.has_unfinished_requests() and not llm.llm_engine.structured.waiting

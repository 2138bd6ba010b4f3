"""speculative_config as vLLM users paste it: every key vLLM's SpeculativeConfig (and older vLLM's)
accepts either works here (with its meaning, or as a logged no-op) or fails with one ValueError
naming the key and why; switches take vLLM's string spellings; Medusa heads shipped beside the
target are found with the practitioner's ``num_heads``."""
from __future__ import annotations

import dataclasses
import logging
import shutil
import typing

import pydantic
import pytest
import torch
from conftest import PROMPTS, greedy
from safetensors.torch import save_file

from draftwise import LLM, SamplingParams
from draftwise.compat.vllm.spec_keys import KEYS
from draftwise.config import EngineConfig
from draftwise.spec_decode.config import SpeculativeConfig
from draftwise.spec_decode.interface import proposer_class, registered_methods

NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 2}
REPEAT_PROMPT = "one two three four five six " * 6  # n-gram drafts get found (and accepted)


def self_draft(model_dir) -> dict:
    """The target drafting for itself: every running sequence gets all the drafts it is allowed."""
    return {"method": "draft_model", "model": str(model_dir), "num_speculative_tokens": 3}


def parse(raw: dict) -> SpeculativeConfig:
    """A user's speculative_config as the engine reads it: vLLM's keys checked and stripped at the edge
    (``EngineConfig``), the rest validated by the core ``SpeculativeConfig``."""
    return EngineConfig(speculative_config=raw).speculative


def spec_llm(model_dir, spec: dict) -> LLM:
    return LLM(model=str(model_dir), dtype="float32", seed=0, speculative_config=spec)


def num_drafts(llm: LLM) -> int:
    """Drafts verified so far (sequences x steps that carried at least one draft token)."""
    return llm.llm_engine.speculator.stats.num_drafts


@pytest.fixture(scope="module")
def plain(tiny_model_dir):
    """Greedy outputs of the tiny target without speculation, for PROMPTS[:4] and REPEAT_PROMPT."""
    llm = LLM(model=str(tiny_model_dir), dtype="float32", seed=0)
    prompts = PROMPTS[:4] + [REPEAT_PROMPT]
    return prompts, [o.outputs[0].token_ids for o in llm.generate(prompts, greedy(24))]


def assert_plain_outputs(llm: LLM, plain) -> None:
    prompts, expected = plain
    assert [o.outputs[0].token_ids for o in llm.generate(prompts, greedy(24))] == expected


# ------------------------------------------------------------------ keys that run
ACCEPTED = [  # (key, value, (attribute of the SpeculativeConfig, its stored value) or None: a no-op)
    ("max_model_len", 200, ("max_model_len", 200)),
    ("disable_by_batch_size", 6, ("disable_by_batch_size", 6)),  # above the 5 prompts run here
    ("num_speculative_tokens_per_batch_size", [[1, 2, 3], [3, 64, 1]],
     ("num_speculative_tokens_per_batch_size", ((1, 2, 3), (3, 64, 1)))),
    ("tensor_parallel_size", 1, ("draft_tensor_parallel_size", 1)),
    ("draft_tensor_parallel_size", 1, ("draft_tensor_parallel_size", 1)),
    ("disable_padded_drafter_batch", "False", ("disable_padded_drafter_batch", False)),
    ("disable_padded_drafter_batch", "true", ("disable_padded_drafter_batch", True)),
    ("enforce_eager", True, None), ("enforce_eager", False, None),
    ("parallel_drafting", False, None), ("parallel_drafting", "false", None),
    ("quantization", None, None),
    ("revision", "main", None), ("code_revision", "v1.0", None), ("revision", None, None),
    ("attention_backend", "auto", None), ("attention_backend", "FLASH_ATTN", None), ("moe_backend", None, None),
    ("kv_cache_dtype", "auto", None), ("kv_cache_dtype", "fp8", None),
    ("index_share_for_mtp_iteration", None, None), ("disable_eagle_block_drop", True, None),
    ("use_local_argmax_reduction", False, None), ("use_heterogeneous_vocab", False, None),
    ("draft_load_config", None, None), ("rejection_sample_method", "standard", None),
    ("synthetic_acceptance_rates", None, None), ("enable_adaptive_verification", False, None),
    ("dspark_draft_topk", None, None), ("draft_sample_method", "greedy", None),
    # older vLLM's keys, still in pasted configs
    ("disable_log_stats", False, None), ("disable_logprobs", True, None), ("disable_mqa_scorer", False, None),
    ("acceptance_method", "rejection_sampler", None), ("posterior_threshold", 0.09, None),
    ("posterior_alpha", 0.3, None),
]


@pytest.mark.parametrize("key, value, stored", ACCEPTED, ids=[f"{k}={v!r}" for k, v, _ in ACCEPTED])
def test_pasted_key_runs_with_plain_outputs(key, value, stored, tiny_model_dir, plain):
    llm = spec_llm(tiny_model_dir, {**NGRAM, key: value})
    config = llm.llm_engine.config.speculative
    if stored is not None:
        assert getattr(config, stored[0]) == stored[1]
    assert (config.method, config.num_speculative_tokens) == ("ngram", 3)
    assert_plain_outputs(llm, plain)
    assert num_drafts(llm) > 0  # it still speculates


@pytest.mark.parametrize("key, value, logged", [
    ("revision", "main", True), ("code_revision", "abc123", True), ("enforce_eager", True, True),
    ("enforce_eager", False, False), ("kv_cache_dtype", "fp8", True), ("kv_cache_dtype", "auto", False),
    ("disable_eagle_block_drop", "True", True), ("revision", None, False), ("posterior_threshold", 0.5, True),
])
def test_no_op_keys_say_so_in_one_log_line(key, value, logged, caplog):
    with caplog.at_level(logging.INFO, logger="draftwise"):
        parse({**NGRAM, key: value})
    lines = [r.getMessage() for r in caplog.records if f"[{key!r}]" in r.getMessage()]
    assert len(lines) == (1 if logged else 0), lines
    if logged:
        assert "is ignored: " + KEYS[key].why in lines[0]


# ------------------------------------------------------------------ keys that are refused
REFUSED = [  # (key, value, words the message must hold besides the key)
    ("parallel_drafting", True, ["not built"]),
    ("parallel_drafting", "True", ["not built"]),
    ("quantization", "fp8", ["does not quantize drafters"]),
    ("tensor_parallel_size", 2, ["1 or the target's tensor_parallel_size (1)"]),
    ("max_model_len", 0, ["int >= 1"]),
    ("max_model_len", "64", ["int >= 1"]),
    ("max_model_len", 513, ["target's max_model_len (512)"]),  # checked when the engine knows the target
    ("disable_by_batch_size", 0, ["int >= 1"]),
    ("disable_by_batch_size", 2.5, ["int >= 1"]),
    ("num_speculative_tokens_per_batch_size", [[2, 8, 3]], ["start at batch size 1"]),
    ("num_speculative_tokens_per_batch_size", [[1, 8, 3], [4, 9, 1]], ["overlap"]),
    ("num_speculative_tokens_per_batch_size", [[1, 8]], ["3 ints"]),
    ("use_heterogeneous_vocab", True, ["target's vocabulary"]),
    ("draft_load_config", {"load_format": "dummy"}, ["loader"]),
    ("rejection_sample_method", "block", ["enable_block_verify"]),
    ("rejection_sample_method", "synthetic", ["not built"]),
    ("synthetic_acceptance_length", 2.0, ["not built"]),
    ("acceptance_method", "typical_acceptance_sampler", ["enable_entropy_verify"]),
    ("enable_adaptive_verification", True, ["dspark"]),
    ("dspark_draft_topk", 8, ["dspark"]),
    ("draft_sample_method", "probabilistic", ["draft_model"]),
    ("revision", 3, ["must be a string"]),
    ("enforce_eager", "maybe", ["true or false"]),
    ("posterior_alpha", "high", ["must be a number"]),
    ("disable_padded_drafter_batch", 2, ["true or false"]),
    ("bogus_key", 1, ["unknown key"]),
]


@pytest.mark.parametrize("key, value, words", REFUSED, ids=[f"{k}={v!r}" for k, v, _ in REFUSED])
def test_refused_key_fails_naming_it(key, value, words, tiny_model_dir):
    with pytest.raises(ValueError) as info:
        spec_llm(tiny_model_dir, {**NGRAM, key: value})
    message = str(info.value)
    assert f"'{key}'" in message or f"['{key}']" in message
    for word in words:
        assert word in message


def test_vllm_keys_are_the_edges_not_the_cores():
    """The core SpeculativeConfig knows no vLLM key (one reaching it is unknown); the edge strips them, names
    them among the allowed keys, and leaves a method's own option keys (draft_sample_method) to its options."""
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['revision'\]") as info:
        SpeculativeConfig.from_value({**NGRAM, "revision": "main"})
    assert "'posterior_alpha'" not in str(info.value)
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['bogus'\]") as info:
        parse({**NGRAM, "bogus": 1, "revision": "main"})
    assert all(repr(key) in str(info.value) for key in KEYS)
    assert parse({**NGRAM, "revision": "main"}).to_dict() == SpeculativeConfig.from_value(NGRAM).to_dict()
    with pytest.raises(ValueError, match="needs 'model'"):  # the option passed the vLLM table; the method's check ran
        parse({"method": "draft_model", "num_speculative_tokens": 2, "draft_sample_method": "probabilistic"})


def test_both_tensor_parallel_spellings_must_agree():
    assert SpeculativeConfig.from_value({**NGRAM, "tensor_parallel_size": 1,
                                         "draft_tensor_parallel_size": 1}).draft_tensor_parallel_size == 1
    with pytest.raises(ValueError, match="'draft_tensor_parallel_size'=2 and 'tensor_parallel_size'=1"):
        SpeculativeConfig.from_value({**NGRAM, "tensor_parallel_size": 1, "draft_tensor_parallel_size": 2}, 2)
    assert SpeculativeConfig.from_value({**NGRAM, "tensor_parallel_size": 2}, 2).draft_tensor_parallel_size == 2


# ------------------------------------------------------------------ behaviour of max_model_len and batch limits
def step_all(llm: LLM, check) -> None:
    """Step the engine until it is empty, calling ``check(seqs)`` with every running sequence after each step."""
    engine = llm.llm_engine
    while engine.has_unfinished_requests():
        engine.step()
        check([s for r in engine.requests.values() for s in r.seqs if not s.is_finished])


def test_max_model_len_stops_drafting_past_it(tiny_model_dir):
    k = 3
    prompt_len = len(LLM(model=str(tiny_model_dir), dtype="float32").get_tokenizer().encode(REPEAT_PROMPT))
    limit = prompt_len + 15  # the 40 tokens generated pass it
    llm = spec_llm(tiny_model_dir, {**self_draft(tiny_model_dir), "max_model_len": limit})
    engine = llm.llm_engine
    engine.add_request("r", REPEAT_PROMPT, greedy(40, ignore_eos=True))
    seq = engine.requests["r"].seqs[0]
    seen = {"below": 0, "past": 0}

    def check(seqs):
        for s in seqs:
            if s.num_tokens + k > limit:
                assert s.spec.draft_token_ids == [], (s.num_tokens, s.spec.draft_token_ids)
                seen["past"] += 1
            else:
                assert len(s.spec.draft_token_ids) == k
                seen["below"] += 1

    step_all(llm, check)
    assert seen["below"] > 0 and seen["past"] > 0  # it drafted below the limit, and stopped past it
    assert num_drafts(llm) > 0
    ref = LLM(model=str(tiny_model_dir), dtype="float32", seed=0)
    assert seq.output_token_ids == ref.generate([REPEAT_PROMPT], greedy(40, ignore_eos=True))[0].outputs[0].token_ids


def two_requests(llm: LLM, check) -> list[list[int]]:
    """A short and a long request admitted together; stepped to the end with ``check``."""
    engine = llm.llm_engine
    engine.add_request("short", REPEAT_PROMPT, greedy(6, ignore_eos=True))
    engine.add_request("long", PROMPTS[4] + " " + REPEAT_PROMPT, greedy(30, ignore_eos=True))
    seqs = [engine.requests["short"].seqs[0], engine.requests["long"].seqs[0]]
    step_all(llm, check)
    return [s.output_token_ids for s in seqs]


def expected_two(tiny_model_dir) -> list[list[int]]:
    ref = LLM(model=str(tiny_model_dir), dtype="float32", seed=0)
    outs = ref.generate([REPEAT_PROMPT, PROMPTS[4] + " " + REPEAT_PROMPT],
                        [greedy(6, ignore_eos=True), greedy(30, ignore_eos=True)])
    return [o.outputs[0].token_ids for o in outs]


@pytest.mark.parametrize("method", ["draft_model", "eagle3"])  # a drafter with its own KV; one reading hidden states
def test_disable_by_batch_size_pauses_drafting_while_that_many_requests_run(method, tiny_model_dir, spec_dirs):
    spec = self_draft(tiny_model_dir) if method == "draft_model" else \
        {"method": "eagle3", "model": str(spec_dirs["eagle3"]), "num_speculative_tokens": 3}
    llm = spec_llm(tiny_model_dir, {**spec, "disable_by_batch_size": 2})
    phases = {"both": 0, "one": 0}

    def check(seqs):
        if len(seqs) >= 2:  # vLLM V0: running_queue_size >= disable_by_batch_size -> no speculation
            assert all(s.spec.draft_token_ids == [] for s in seqs)
            phases["both"] += 1
        elif any(s.spec.draft_token_ids for s in seqs):
            phases["one"] += 1

    drafts = []
    outputs = two_requests(llm, lambda seqs: (check(seqs), drafts.append(num_drafts(llm))))
    assert phases["both"] > 0 and phases["one"] > 0  # paused while both ran, resumed after one finished
    assert drafts[phases["both"]] == 0  # nothing was verified while both ran
    assert outputs == expected_two(tiny_model_dir)


def test_disable_by_batch_size_counts_requests_not_their_n_sequences(tiny_model_dir):
    llm = spec_llm(tiny_model_dir, {**self_draft(tiny_model_dir), "disable_by_batch_size": 2})
    params = SamplingParams(n=2, temperature=0.8, seed=7, max_tokens=20, ignore_eos=True)
    out = llm.generate([REPEAT_PROMPT], params)[0]
    assert num_drafts(llm) > 0  # one request of two sequences: below the threshold
    plain = LLM(model=str(tiny_model_dir), dtype="float32", seed=0).generate([REPEAT_PROMPT], params)[0]
    assert [c.token_ids for c in out.outputs] == [c.token_ids for c in plain.outputs]


def test_batch_size_schedule_sets_the_draft_length(tiny_model_dir):
    llm = spec_llm(tiny_model_dir, {**self_draft(tiny_model_dir),
                                    "num_speculative_tokens_per_batch_size": [[1, 1, 3], [2, 8, 1]]})
    longest = {1: 0, 2: 0}

    def check(seqs):
        if seqs:
            size = min(len(seqs), 2)
            longest[size] = max([longest[size]] + [len(s.spec.draft_token_ids) for s in seqs])

    outputs = two_requests(llm, check)
    assert longest == {1: 3, 2: 1}
    assert outputs == expected_two(tiny_model_dir)


# ------------------------------------------------------------------ string booleans
def bool_keys() -> list[tuple[str, str, str]]:
    """(method, key, where it is stored: 'options' / 'config' / '' for a no-op), found by type, not listed."""
    found = []
    for method in registered_methods():
        options = proposer_class(method).Options
        hints = typing.get_type_hints(options)
        found += [(method, f.name, "options") for f in dataclasses.fields(options) if _is_bool(hints[f.name])]
    hints = typing.get_type_hints(SpeculativeConfig)
    found += [("ngram", f.name, "config") for f in dataclasses.fields(SpeculativeConfig) if _is_bool(hints[f.name])]
    found += [("ngram", name, "") for name, key in KEYS.items() if key.kind == "bool"]
    return found


def _is_bool(hint) -> bool:
    return hint is bool or (bool in typing.get_args(hint) and set(typing.get_args(hint)) <= {bool, type(None)})


def base_config(method: str, dirs: dict) -> dict:
    models = {"draft_model": dirs["draft"], "eagle": dirs["eagle"], "eagle3": dirs["eagle3"],
              "medusa": dirs["medusa"], "mtp": dirs["mtp_target"], "dflash": dirs["dflash"]}
    config = {"method": method, "num_speculative_tokens": 1}
    if method in models:
        config["model"] = str(models[method])
    return config


def test_bool_keys_are_found():
    keys = {key for _, key, _ in bool_keys()}
    assert {"disable_padded_drafter_batch", "enforce_eager", "parallel_drafting"} <= keys


@pytest.mark.parametrize("method, key, where", bool_keys())
def test_every_bool_key_reads_vllm_spellings(method, key, where, spec_dirs):
    refused_if_true = key in KEYS and KEYS[key].refused
    for spelling in ["True", "False", "true", "false", True, False, "yes", "0", 1]:
        expected = pydantic.TypeAdapter(bool).validate_python(spelling)  # what vLLM's config reads
        raw = {**base_config(method, spec_dirs), key: spelling}
        if refused_if_true and expected:
            with pytest.raises(ValueError, match=f"'{key}'"):
                parse(raw)
            continue
        config = parse(raw)
        holder = {"options": config.options, "config": config}.get(where)
        if holder is not None:
            assert getattr(holder, key) is expected, (key, spelling)
    for bad in ["maybe", 2, "2", "", " true"]:
        pydantic_rejects(bad)
        with pytest.raises(ValueError, match=f"'{key}'"):
            parse({**base_config(method, spec_dirs), key: bad})


def pydantic_rejects(value) -> None:
    with pytest.raises(pydantic.ValidationError):
        pydantic.TypeAdapter(bool).validate_python(value)


# ------------------------------------------------------------------ medusa as practitioners write it
def heads_beside_target(tiny_model_dir, tmp_path, fmt: str, num_heads: int = 3):
    """A copy of the tiny target with FasterDecoding Medusa heads beside its weights, as
    ``medusa_lm_head.pt`` (the heads' bare state dict) or ``medusa_lm_head.safetensors``."""
    import drafter_ckpts

    vocab = len(LLM(model=str(tiny_model_dir), dtype="float32").get_tokenizer())
    heads = drafter_ckpts.write_medusa(tmp_path / "heads", vocab, num_heads=num_heads)
    state = {k.removeprefix("medusa_head."): v for k, v in
             torch.load(heads / "medusa_lm_head.pt", weights_only=True).items()}
    target = shutil.copytree(tiny_model_dir, tmp_path / "target")
    if fmt == "pt":
        torch.save(state, target / "medusa_lm_head.pt")
    else:
        save_file({k: v.contiguous() for k, v in state.items()}, str(target / "medusa_lm_head.safetensors"))
    return target


@pytest.mark.parametrize("fmt", ["pt", "safetensors"])
def test_medusa_num_heads_with_heads_beside_the_target(fmt, tiny_model_dir, tmp_path, plain):
    target = heads_beside_target(tiny_model_dir, tmp_path, fmt)
    llm = spec_llm(target, {"method": "medusa", "num_heads": 3})
    config = llm.llm_engine.config.speculative
    assert (config.model, config.num_speculative_tokens, config.options.num_heads) == (str(target), 3, 3)
    assert len(llm.llm_engine.speculator.proposer.heads.lm_heads) == 3
    assert_plain_outputs(llm, plain)
    assert num_drafts(llm) > 0
    assert spec_llm(target, {"method": "medusa", "num_heads": 3, "num_speculative_tokens": 2}) \
        .llm_engine.config.speculative.num_speculative_tokens == 2


@pytest.mark.parametrize("fmt", ["pt", "safetensors"])
def test_medusa_num_heads_must_match_the_heads(fmt, tiny_model_dir, tmp_path):
    target = heads_beside_target(tiny_model_dir, tmp_path, fmt)
    with pytest.raises(ValueError, match=r"\['num_heads'\]=4 is invalid: .* has 3 Medusa heads"):
        spec_llm(target, {"method": "medusa", "num_heads": 4})
    with pytest.raises(ValueError, match=r"\['num_speculative_tokens'\]=4 is invalid"):
        spec_llm(target, {"method": "medusa", "num_heads": 3, "num_speculative_tokens": 4})
    with pytest.raises(ValueError, match=r"\['num_heads'\]=0"):
        spec_llm(target, {"method": "medusa", "num_heads": 0})


def test_medusa_without_heads_names_what_is_missing(tiny_model_dir):
    needs = "method 'medusa' needs Medusa heads: pass speculative_config['model']"
    beside = "or put medusa_lm_head.{pt,safetensors} beside the target"
    with pytest.raises(ValueError) as info:
        spec_llm(tiny_model_dir, {"method": "medusa", "num_heads": 4})
    assert needs in str(info.value) and beside in str(info.value) and "num_speculative_tokens" not in str(info.value)
    with pytest.raises(ValueError) as info:
        SpeculativeConfig.from_value({"method": "medusa", "num_heads": 4})
    assert needs in str(info.value) and beside in str(info.value)
    with pytest.raises(ValueError, match="needs Medusa heads"):
        SpeculativeConfig.from_value({"method": "medusa"})


def test_medusa_heads_dir_with_other_safetensors_reads_the_pt_heads(spec_dirs, tmp_path, tiny_model_dir):
    """A heads directory holding some *.safetensors too still reads medusa_lm_head.pt."""
    heads = shutil.copytree(spec_dirs["medusa"], tmp_path / "heads")
    save_file({"unrelated.weight": torch.zeros(2, 2)}, str(heads / "extra.safetensors"))
    llm = spec_llm(tiny_model_dir, {"method": "medusa", "model": str(heads)})
    assert len(llm.llm_engine.speculator.proposer.heads.lm_heads) == 3

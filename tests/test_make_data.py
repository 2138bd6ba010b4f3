"""``make-data`` at scale: self-written conversations (magpie), chunks that resume, states on disk by index.

The tiny random model cannot write a usable request, so the pipeline tests replace the request
writer with a seeded fake (duplicates and unusable turns included); the real writer is tested on
the template and, with the real SmolLM2, on what it writes.
"""
from __future__ import annotations

import json
import random
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file

from draftwise import LLM
from draftwise.train import answers
from draftwise.train.dataset import load_dataset
from draftwise.train.magpie import OPENERS, Deduplicator, clean, user_turn_prefix, write_user_turns
from draftwise.train.make_data import make_data

WORDS = ["how", "do", "I", "bake", "bread", "plan", "a", "trip", "learn", "python", "fix", "my", "bike"]


def fake_user_turns(llm, conversations, seed, **kw):
    """Seeded requests: some repeat (deduplicated), some unusable (None)."""
    rng = random.Random(seed)
    turns = []
    for _ in conversations:
        roll = rng.random()
        turns.append(None if roll < 0.1 else "how do I bake bread" if roll < 0.2 else
                     " ".join(rng.choice(WORDS) for _ in range(6)))
    return turns


def records(out) -> list[dict]:
    return [json.loads(line) for line in (out / "answers.jsonl").read_text().splitlines()]


@pytest.fixture
def magpie(monkeypatch):
    monkeypatch.setattr(answers, "write_user_turns", fake_user_turns)


def run(model_dir, out, **kw):
    args = dict(max_tokens=12, num_samples=24, max_num_seqs=8, dtype="float32", chunk_size=8,
                follow_up_fraction=1.0, layer_ids=[1, 2])
    args.update(kw)
    return make_data(str(model_dir), ["magpie"], out, **args)


def test_magpie_conversations_are_deduplicated_grouped_and_followed_up(tiny_model_dir, tmp_path, magpie):
    manifest = run(tiny_model_dir, tmp_path / "data")
    saved = records(tmp_path / "data")
    firsts = [r for r in saved if len(r["messages"]) == 2]
    follow_ups = [r for r in saved if len(r["messages"]) == 4]
    users = [m["content"] for r in saved for m in r["messages"] if m["role"] == "user" and m is r["messages"][-1]]
    assert len(users) == len(set(users)) and 0 < len(firsts) < 24
    assert {r["group"] for r in follow_ups} <= {r["group"] for r in firsts}
    for r in follow_ups:  # the follow-up's prompt holds the first turn's answer
        first = next(f for f in firsts if f["group"] == r["group"])
        assert r["prompt_token_ids"][:len(first["prompt_token_ids"])] == first["prompt_token_ids"]
    assert manifest["num_groups"] == len(firsts) and manifest["hidden_dtype"] == "bfloat16"
    sample = manifest["samples"][0]
    tensors = load_file(str(tmp_path / "data" / sample["file"]))
    assert tensors["hidden_states"].dtype == torch.bfloat16 and tensors["hidden_states"].shape[1:] == (2, 64)
    assert tensors["token_ids"].tolist() == saved[0]["prompt_token_ids"] + saved[0]["answer_token_ids"]


def test_a_held_out_split_keeps_a_conversation_together(tiny_model_dir, tmp_path, magpie):
    run(tiny_model_dir, tmp_path / "data")
    train, held = load_dataset(tmp_path / "data").split(0.3, seed=0)
    assert held and train and not {s.group for s in train} & {s.group for s in held}


def test_an_interrupted_run_resumes_to_the_same_data(tiny_model_dir, tmp_path, magpie, monkeypatch):
    straight = run(tiny_model_dir, tmp_path / "straight")
    calls = {"n": 0}

    def stop_in_chunk_two(*args, **kw):
        calls["n"] += 1
        if calls["n"] == 3:  # chunk 1's first turns, chunk 1's follow-ups, then chunk 2: interrupted
            raise KeyboardInterrupt
        return fake_user_turns(*args, **kw)

    monkeypatch.setattr(answers, "write_user_turns", stop_in_chunk_two)
    with pytest.raises(KeyboardInterrupt):
        run(tiny_model_dir, tmp_path / "resumed")
    assert json.loads((tmp_path / "resumed" / "progress.json").read_text())["chunks_done"] == 1
    monkeypatch.setattr(answers, "write_user_turns", fake_user_turns)
    resumed = run(tiny_model_dir, tmp_path / "resumed")
    assert records(tmp_path / "resumed") == records(tmp_path / "straight")
    assert resumed["samples"] == straight["samples"]
    # the extract pass resumes too: a lost file is written again, the others are kept
    lost = tmp_path / "resumed" / resumed["samples"][1]["file"]
    kept = tmp_path / "resumed" / resumed["samples"][0]["file"]
    before = kept.stat().st_mtime_ns
    lost.unlink()
    (tmp_path / "resumed" / "manifest.json").unlink()
    run(tiny_model_dir, tmp_path / "resumed")
    assert lost.exists() and kept.stat().st_mtime_ns == before


def test_bad_options_name_the_flag(tiny_model_dir, tmp_path):
    for kw, flag in [({"hidden_dtype": "int8"}, "--hidden-dtype"), ({"chunk_size": 0}, "--chunk-size"),
                     ({"follow_up_fraction": 1.5}, "--follow-up-fraction")]:
        with pytest.raises(ValueError, match=flag):
            run(tiny_model_dir, tmp_path / "bad", **kw)


def test_the_user_turn_prefix_is_the_template_up_to_the_users_text(tokenizer):
    system = [{"role": "system", "content": "Be brief."}]
    assert user_turn_prefix(tokenizer, system) == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n"
    thread = [*system, {"role": "user", "content": "hi there"}, {"role": "assistant", "content": "hello"}]
    assert user_turn_prefix(tokenizer, thread).endswith("hello<|im_end|>\n<|im_start|>user\n")


def test_unusable_requests_are_dropped():
    assert clean("  How do I bake bread?  ", finished=True) == "How do I bake bread?"
    assert clean("How do I bake bread?", finished=False) is None  # cut off at the cap
    assert clean("Hi", finished=True) is None
    assert clean("What is <|im_start|> for?", finished=True) is None
    dedup = Deduplicator()
    assert dedup.first_time("How do I bake bread?") and not dedup.first_time("how do i bake  BREAD")


def test_the_writer_returns_one_turn_per_conversation(tiny_llm):
    turns = write_user_turns(tiny_llm, [[{"role": "system", "content": "Be brief."}]] * 3, seed=0, max_tokens=8)
    assert len(turns) == 3


def test_openers_start_the_share_of_turns_asked(tiny_llm, monkeypatch):
    """Each turn an opener starts is the opener followed by the model's continuation of it."""
    seen = []

    def generate(prompts, params, use_tqdm=False):
        seen.extend(prompts)
        return [SimpleNamespace(outputs=[SimpleNamespace(text=" a haiku about rain", finish_reason="stop")])
                for _ in prompts]

    monkeypatch.setattr(tiny_llm, "generate", generate)
    systems = [[{"role": "system", "content": "Be brief."}]] * 200
    turns = write_user_turns(tiny_llm, systems, seed=1, opener_fraction=0.6)
    opened = [t for t in turns if t.split()[0] != "a"]
    assert 0.5 < len(opened) / len(turns) < 0.7
    assert all(t.endswith(" a haiku about rain") and t[:-len(" a haiku about rain")] in OPENERS for t in opened)
    assert all(p.endswith(t[:-len(" a haiku about rain")]) for p, t in zip(seen, turns))
    assert write_user_turns(tiny_llm, systems[:5], seed=1) == ["a haiku about rain"] * 5  # no openers by default


@pytest.mark.slow
def test_smollm2_writes_distinct_usable_requests():
    llm = LLM(max_num_seqs=32)
    systems = [[{"role": "system", "content": "You are a helpful assistant."}]] * 32
    turns = [t for t in write_user_turns(llm, systems, seed=0) if t is not None]
    assert len(turns) >= 16 and len(set(turns)) == len(turns)


def test_the_draft_vocabulary_can_be_picked_by_coverage(tiny_model_dir, tmp_path, magpie):
    from draftwise.train.dataset import DraftVocab

    run(tiny_model_dir, tmp_path / "data")
    samples = load_dataset(tmp_path / "data").samples
    for coverage in (0.5, 0.9, 1.0):
        vocab = DraftVocab.covering(samples, coverage, max_size=400, vocab_size=400)
        assert vocab.coverage(samples) >= coverage  # enough ...
        smaller = DraftVocab.most_frequent(samples, vocab.size - 1, 400)
        assert smaller.coverage(samples) < coverage  # ... and no more than needed
    train, held = samples[: len(samples) // 2], samples[len(samples) // 2:]  # judged on held-out answers
    num_seen = len({int(t) for s in train for t in s.token_ids[s.num_prompt_tokens:]})
    goal = 0.8 * DraftVocab.most_frequent(train, num_seen, 400).coverage(held)  # reachable from training
    vocab = DraftVocab.covering(train, goal, max_size=400, vocab_size=400, held_out=held)
    assert vocab.coverage(held) >= goal > DraftVocab.most_frequent(train, vocab.size - 1, 400).coverage(held)
    assert DraftVocab.covering(samples, 1.0, max_size=8, vocab_size=400).size == 8
    with pytest.raises(ValueError, match="--draft-vocab-coverage"):
        DraftVocab.covering(samples, 1.5, max_size=8, vocab_size=400)

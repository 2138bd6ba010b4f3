"""LLM.generate / LLM.chat on the tiny random model: output shapes, stopping, logprobs."""
from __future__ import annotations

import gc
import math

import pytest
from conftest import PROMPTS, greedy

from draftwise import LLM, SamplingParams


def _one(llm, prompt, params):
    outs = llm.generate(prompt, params, use_tqdm=False)
    assert len(outs) == 1
    return outs[0]


def _first_new_index(tokens, start):
    """First index >= start whose token has not appeared earlier in ``tokens``."""
    return next(i for i in range(start, len(tokens)) if tokens[i] not in tokens[:i])


def test_greedy_outputs_are_not_degenerate(tiny_llm):
    """Sanity check of the fixture: different prompts give different greedy outputs."""
    outs = tiny_llm.generate(PROMPTS, greedy(8, ignore_eos=True), use_tqdm=False)
    seqs = {tuple(o.outputs[0].token_ids) for o in outs}
    assert len(seqs) == len(PROMPTS)
    for o in outs:
        assert len(set(o.outputs[0].token_ids)) > 2


def test_outputs_in_input_order(tiny_llm, tokenizer):
    # Earlier prompts get more tokens, so they finish last: order must not follow finishing.
    params = [greedy(12 - i, ignore_eos=True) for i in range(len(PROMPTS))]
    outs = tiny_llm.generate(PROMPTS, params, use_tqdm=False)
    assert [o.prompt for o in outs] == PROMPTS
    assert [len(o.outputs[0].token_ids) for o in outs] == [12 - i for i in range(len(PROMPTS))]
    for prompt, o in zip(PROMPTS, outs):
        assert o.prompt_token_ids == tokenizer(prompt).input_ids
        assert o.finished
        assert len(o.outputs) == 1 and o.outputs[0].index == 0
    assert len({o.request_id for o in outs}) == len(PROMPTS)
    # Reversing the input reverses the output; each prompt keeps its own completion.
    rev = tiny_llm.generate(PROMPTS[::-1], params[::-1], use_tqdm=False)
    assert [o.prompt for o in rev] == PROMPTS[::-1]
    assert [o.outputs[0].token_ids for o in rev] == [o.outputs[0].token_ids for o in outs][::-1]


def test_prompt_formats_are_equivalent(tiny_llm):
    params = greedy(10, ignore_eos=True)
    prompt = PROMPTS[2]
    from_str = _one(tiny_llm, prompt, params)
    from_list = _one(tiny_llm, [prompt], params)
    ids = list(from_str.prompt_token_ids)
    from_ids = _one(tiny_llm, {"prompt_token_ids": ids}, params)
    from_ids_list = _one(tiny_llm, [{"prompt_token_ids": ids}], params)
    ref = from_str.outputs[0].token_ids
    assert len(ref) == 10
    for other in (from_list, from_ids, from_ids_list):
        assert other.outputs[0].token_ids == ref
    assert from_ids.prompt is None
    assert from_ids.prompt_token_ids == ids
    assert from_ids.outputs[0].text == from_str.outputs[0].text
    # Mixed list of str and token-id prompts.
    mixed = tiny_llm.generate([PROMPTS[0], {"prompt_token_ids": ids}], params, use_tqdm=False)
    assert mixed[0].prompt == PROMPTS[0]
    assert mixed[1].outputs[0].token_ids == ref


def test_per_prompt_sampling_params(tiny_llm):
    params = [greedy(3, ignore_eos=True), greedy(7, ignore_eos=True), greedy(5, ignore_eos=True)]
    outs = tiny_llm.generate(PROMPTS[:3], params, use_tqdm=False)
    assert [len(o.outputs[0].token_ids) for o in outs] == [3, 7, 5]


@pytest.mark.parametrize("max_tokens", [1, 5, 17])
def test_max_tokens_gives_length_finish(tiny_llm, tokenizer, max_tokens):
    out = _one(tiny_llm, PROMPTS[0], greedy(max_tokens, ignore_eos=True)).outputs[0]
    assert len(out.token_ids) == max_tokens
    assert out.finish_reason == "length"
    assert out.stop_reason is None
    assert out.text == tokenizer.decode(out.token_ids, skip_special_tokens=True)


def test_default_max_tokens_is_16(tiny_llm):
    out = _one(tiny_llm, PROMPTS[1], SamplingParams(temperature=0.0, ignore_eos=True))
    assert len(out.outputs[0].token_ids) == 16
    # sampling_params=None -> default SamplingParams (random sampling, max_tokens=16).
    out = tiny_llm.generate(PROMPTS[1], use_tqdm=False)[0].outputs[0]
    assert 1 <= len(out.token_ids) <= 16
    assert out.finish_reason in ("stop", "length")


def test_eos_stops_and_ignore_eos_continues(tiny_llm, eos_info):
    eos, step = eos_info["eos_id"], eos_info["eos_step"]
    full = _one(tiny_llm, eos_info["eos_prompt"], greedy(step + 8, ignore_eos=True)).outputs[0]
    # The fixture model greedily emits EOS at generated position `step`.
    assert full.token_ids[step] == eos
    assert eos not in full.token_ids[:step]
    assert len(full.token_ids) == step + 8 and full.finish_reason == "length"

    out = _one(tiny_llm, eos_info["eos_prompt"], greedy(step + 8)).outputs[0]
    assert out.finish_reason == "stop"
    assert out.token_ids in (full.token_ids[:step], full.token_ids[:step + 1])
    assert "<|endoftext|>" not in out.text
    # skip_special_tokens=False keeps the (ignored) EOS in the text of a longer run.
    raw = _one(tiny_llm, eos_info["eos_prompt"],
               greedy(step + 8, ignore_eos=True, skip_special_tokens=False)).outputs[0]
    assert raw.token_ids == full.token_ids
    assert "<|endoftext|>" in raw.text and "<|endoftext|>" not in full.text


def test_stop_token_ids(tiny_llm, tokenizer):
    ref = _one(tiny_llm, PROMPTS[1], greedy(16, ignore_eos=True)).outputs[0].token_ids
    j = _first_new_index(ref, 4)
    stop_id = ref[j]
    out = _one(tiny_llm, PROMPTS[1], greedy(16, stop_token_ids=[stop_id])).outputs[0]
    assert out.finish_reason == "stop"
    assert out.stop_reason == stop_id
    assert out.token_ids in (ref[:j], ref[:j + 1])
    assert out.text == tokenizer.decode(ref[:j], skip_special_tokens=True)


def test_min_tokens_suppresses_stop_token(tiny_llm):
    ref = _one(tiny_llm, PROMPTS[1], greedy(16, ignore_eos=True)).outputs[0].token_ids
    j = _first_new_index(ref, 2)
    stop_id = ref[j]
    min_tokens = j + 4
    out = _one(tiny_llm, PROMPTS[1],
               greedy(16, stop_token_ids=[stop_id], min_tokens=min_tokens, ignore_eos=True)).outputs[0]
    assert len(out.token_ids) >= min_tokens
    assert out.token_ids[:j] == ref[:j]  # identical until the suppressed position
    assert stop_id not in out.token_ids[:min_tokens]
    if out.finish_reason == "stop":
        assert out.stop_reason == stop_id
    else:
        assert out.finish_reason == "length" and len(out.token_ids) == 16


def test_min_tokens_suppresses_eos(tiny_llm, eos_info):
    eos, step = eos_info["eos_id"], eos_info["eos_step"]
    min_tokens = step + 3
    out = _one(tiny_llm, eos_info["eos_prompt"], greedy(step + 8, min_tokens=min_tokens)).outputs[0]
    assert len(out.token_ids) >= min_tokens
    assert eos not in out.token_ids[:min_tokens]


def _ascii_stop_string(text, start=3, length=3):
    for i in range(start, len(text) - length + 1):
        chunk = text[i:i + length]
        if chunk.isascii() and chunk.isalpha() and text.find(chunk) == i:
            return chunk, i
    raise AssertionError(f"no ascii stop string candidate in {text!r}")


@pytest.mark.parametrize("as_list, include", [(False, False), (True, False), (False, True)])
def test_stop_string(tiny_llm, as_list, include):
    ref = _one(tiny_llm, PROMPTS[4], greedy(24, ignore_eos=True)).outputs[0]
    stop, pos = _ascii_stop_string(ref.text)
    c = _one(tiny_llm, PROMPTS[4], greedy(24, ignore_eos=True, include_stop_str_in_output=include,
                                          stop=[stop, "\x00never\x00"] if as_list else stop)).outputs[0]
    assert c.finish_reason == "stop"
    assert c.stop_reason == stop
    assert c.text == (ref.text[:pos + len(stop)] if include else ref.text[:pos])
    assert c.token_ids == ref.token_ids[:len(c.token_ids)]
    assert len(c.token_ids) < 24


def _check_logprobs(c, k):
    assert c.logprobs is not None and len(c.logprobs) == len(c.token_ids)
    total = 0.0
    for tok, entry in zip(c.token_ids, c.logprobs):
        assert tok in entry, "sampled token missing from its logprobs dict"
        assert k <= len(entry) <= k + 1
        for lp in entry.values():
            assert math.isfinite(lp.logprob) and lp.logprob <= 1e-6
        # Besides the sampled token, the entries are exactly the top-k: ranks 1..k.
        others = sorted(lp.rank for t, lp in entry.items() if t != tok)
        chosen_rank = entry[tok].rank
        assert sorted(others + [chosen_rank])[:k] == list(range(1, k + 1))
        assert chosen_rank >= 1 and (chosen_rank <= k or len(entry) == k + 1)
        # Lower rank <=> higher logprob.
        by_rank = sorted((lp.rank, lp.logprob) for lp in entry.values())
        assert all(a[1] >= b[1] - 1e-6 for a, b in zip(by_rank, by_rank[1:]))
        assert sum(math.exp(lp.logprob) for lp in entry.values()) <= 1 + 1e-4
        total += entry[tok].logprob
    assert c.cumulative_logprob is not None
    assert abs(c.cumulative_logprob - total) < 1e-4
    return total


def test_logprobs_greedy(tiny_llm):
    c = _one(tiny_llm, PROMPTS[3], greedy(8, ignore_eos=True, logprobs=3)).outputs[0]
    _check_logprobs(c, 3)
    for tok, entry in zip(c.token_ids, c.logprobs):
        assert entry[tok].rank == 1
        assert len(entry) == 3
        assert entry[tok].logprob == max(lp.logprob for lp in entry.values())
        assert entry[tok].decoded_token is None or isinstance(entry[tok].decoded_token, str)


def test_logprobs_sampled(tiny_llm):
    c = _one(tiny_llm, PROMPTS[3], SamplingParams(temperature=1.5, seed=11, max_tokens=16,
                                                  ignore_eos=True, logprobs=2)).outputs[0]
    _check_logprobs(c, 2)
    # At temperature 1.5 over a 400-token random model, some sampled tokens are not the argmax.
    assert any(entry[tok].rank > 1 for tok, entry in zip(c.token_ids, c.logprobs))


def test_logprobs_zero_and_none(tiny_llm):
    c = _one(tiny_llm, PROMPTS[3], greedy(5, ignore_eos=True, logprobs=0)).outputs[0]
    assert len(c.logprobs) == 5
    for tok, entry in zip(c.token_ids, c.logprobs):
        assert list(entry) == [tok]
    assert c.cumulative_logprob == pytest.approx(sum(e[t].logprob for t, e in zip(c.token_ids, c.logprobs)),
                                                 abs=1e-4)
    c = _one(tiny_llm, PROMPTS[3], greedy(5, ignore_eos=True)).outputs[0]
    assert c.logprobs is None
    assert c.cumulative_logprob is None


def test_n_samples_with_seed(tiny_llm):
    params = SamplingParams(n=2, temperature=1.0, seed=1234, max_tokens=12, ignore_eos=True)
    out = _one(tiny_llm, PROMPTS[0], params)
    assert [c.index for c in out.outputs] == [0, 1]
    a, b = (c.token_ids for c in out.outputs)
    assert len(a) == len(b) == 12
    assert a != b
    again = _one(tiny_llm, PROMPTS[0], params)
    assert [c.token_ids for c in again.outputs] == [a, b]


def test_chat_matches_generate_on_template(tiny_llm, tokenizer):
    messages = [{"role": "system", "content": "You are terse."},
                {"role": "user", "content": "What is the capital of France?"}]
    params = greedy(10, ignore_eos=True)
    chat_out = tiny_llm.chat(messages, params, use_tqdm=False)
    assert len(chat_out) == 1
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text.endswith("<|im_start|>assistant\n")
    ids = tokenizer(text, add_special_tokens=False).input_ids
    assert chat_out[0].prompt_token_ids == ids
    gen_out = _one(tiny_llm, {"prompt_token_ids": ids}, params)
    assert chat_out[0].outputs[0].token_ids == gen_out.outputs[0].token_ids
    assert chat_out[0].outputs[0].text == gen_out.outputs[0].text
    assert len(chat_out[0].outputs[0].token_ids) == 10

    # A list of conversations gives one output per conversation, in order.
    other = [{"role": "user", "content": "def fibonacci(n):"}]
    both = tiny_llm.chat([messages, other], params, use_tqdm=False)
    assert len(both) == 2
    assert both[0].outputs[0].token_ids == chat_out[0].outputs[0].token_ids
    other_ids = tokenizer(tokenizer.apply_chat_template(other, tokenize=False, add_generation_prompt=True),
                          add_special_tokens=False).input_ids
    assert both[1].prompt_token_ids == other_ids
    # add_generation_prompt=False: the template without the assistant header.
    no_gen = tiny_llm.chat(other, params, use_tqdm=False, add_generation_prompt=False)
    no_gen_text = tokenizer.apply_chat_template(other, tokenize=False, add_generation_prompt=False)
    assert not no_gen_text.endswith("assistant\n")
    assert no_gen[0].prompt_token_ids == tokenizer(no_gen_text, add_special_tokens=False).input_ids


def test_metrics_times_ordered(tiny_llm):
    outs = tiny_llm.generate(PROMPTS[:3], greedy(6, ignore_eos=True), use_tqdm=False)
    for o in outs:
        m = o.metrics
        assert m is not None
        assert m.arrival_time <= m.first_token_time <= m.finished_time
        assert m.num_generation_tokens == len(o.outputs[0].token_ids) == 6


def test_matches_transformers_reference(tiny_llm, tiny_model_dir):
    """Greedy tokens and their logprobs equal HF transformers' on the same weights."""
    import torch
    from transformers import AutoTokenizer, LlamaForCausalLM

    hf_tok = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    model = LlamaForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32).eval()
    prompts = [PROMPTS[0], PROMPTS[2], PROMPTS[4]]
    outs = tiny_llm.generate(prompts, greedy(12, ignore_eos=True, logprobs=1), use_tqdm=False)
    for prompt, out in zip(prompts, outs):
        ids = hf_tok(prompt, return_tensors="pt").input_ids
        assert out.prompt_token_ids == ids[0].tolist()
        with torch.no_grad():
            gen = model.generate(ids, max_new_tokens=12, min_new_tokens=12, do_sample=False,
                                 eos_token_id=None, pad_token_id=0, output_logits=True,
                                 return_dict_in_generate=True)
        hf_tokens = gen.sequences[0, ids.shape[1]:].tolist()
        c = out.outputs[0]
        assert c.token_ids == hf_tokens
        hf_lps = [torch.log_softmax(step[0].float(), -1)[t].item()
                  for step, t in zip(gen.logits, hf_tokens)]
        ours = [entry[t].logprob for entry, t in zip(c.logprobs, c.token_ids)]
        assert ours == pytest.approx(hf_lps, abs=1e-4)


def test_engine_start_up_heap_is_frozen(tiny_model_dir):
    # Full collections skip what start-up built (torch, tokenizer, model: ~0.4M objects with the
    # real model, a ~0.2 s pause per collection that stalled every stream).
    gc.unfreeze()
    LLM(model=str(tiny_model_dir), dtype="float32")
    assert gc.get_freeze_count() > 1000

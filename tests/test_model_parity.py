"""Logit parity of ``DecoderLM`` with transformers' own implementation of the same weights (fp32).

Every architecture ``DecoderLM`` covers is built as a tiny random Hugging Face
model (all parameters random, norm weights included, so a missing Gemma
``1 + w`` or a wrong norm mapping shows), saved with ``save_pretrained`` and
loaded back twice: by transformers (the reference, eager attention) and by
``build_model``. Our model then runs through the paged KV cache with a
non-contiguous block table: one-shot prefill, chunked prefill + decode, and a
varlen batch mixing prefill, decode and multi-token (verification-like)
queries. The ``slow`` tests compare against the real SmolLM2 checkpoint.
"""
from __future__ import annotations

import pytest
import torch

from draftwise.layers.attention import build_metadata
from draftwise.layers.forward_context import forward_context
from draftwise.models.registry import build_model, load_config

BLOCK_SIZE, NUM_BLOCKS, MAX_POS, VOCAB = 16, 8, 128, 256
ATOL = 1e-4
CPU = torch.device("cpu")
COMMON = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
              num_key_value_heads=2, head_dim=16, vocab_size=VOCAB, max_position_embeddings=MAX_POS,
              rms_norm_eps=1e-6, pad_token_id=0, bos_token_id=1, eos_token_id=2)
LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
GEMMA_ROPE = {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
              "full_attention": {"rope_type": "linear", "rope_theta": 1000000.0, "factor": 8.0}}


def _config(name: str):
    import transformers as tf

    if name == "llama":
        return tf.LlamaConfig(**COMMON, tie_word_embeddings=False)
    if name == "llama3_rope":
        return tf.LlamaConfig(**COMMON, tie_word_embeddings=True, rope_parameters=LLAMA3_ROPE)
    if name == "mistral":
        return tf.MistralConfig(**COMMON, tie_word_embeddings=False, sliding_window=8)
    if name == "qwen2":
        return tf.Qwen2Config(**COMMON, tie_word_embeddings=True)
    if name == "qwen3":  # head_dim != hidden / heads
        return tf.Qwen3Config(**{**COMMON, "head_dim": 32}, tie_word_embeddings=False)
    if name == "qwen3_swa":  # layer 0 full attention, layers 1-2 sliding
        return tf.Qwen3Config(**COMMON, tie_word_embeddings=True, use_sliding_window=True,
                              sliding_window=8, max_window_layers=1)
    if name == "gemma3":
        return tf.Gemma3TextConfig(
            **COMMON, tie_word_embeddings=True, sliding_window=8, query_pre_attn_scalar=24,
            layer_types=["sliding_attention", "full_attention", "sliding_attention"],
            rope_parameters=GEMMA_ROPE, final_logit_softcapping=5.0)
    raise KeyError(name)


ARCHS = ["llama", "llama3_rope", "mistral", "qwen2", "qwen3", "qwen3_swa", "gemma3"]



def _forward(model, ids, positions, kv_caches, meta, aux_layer_ids=()):
    """The model's forward as the runner calls it: inside the forward context."""
    with forward_context(model.attention_metadata(meta), kv_caches):
        return model(ids, positions, aux_layer_ids)

def random_checkpoint(name: str, path):
    """A transformers model of architecture ``name`` with every parameter random (norms around 1;
    Gemma: stored w, applied 1 + w), saved to ``path``; returns it."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(1234)
    model = AutoModelForCausalLM.from_config(_config(name)).float()
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.uniform_(0.5, 1.5) if "norm" in n else p.normal_(0.0, 0.2)
    model.save_pretrained(path)
    return model


@pytest.fixture(scope="module", params=ARCHS)
def pair(request, tmp_path_factory):
    """(name, hf_model, our_model) sharing the same random fp32 weights."""
    from transformers import AutoModelForCausalLM

    name = request.param
    path = tmp_path_factory.mktemp(f"parity-{name}")
    random_checkpoint(name, path)
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager").eval()
    cfg = load_config(path)
    ours = build_model(path, cfg, torch.float32, CPU, max_positions=MAX_POS)
    return name, hf, ours


def _tokens(n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, VOCAB, (n,), generator=g)


@torch.no_grad()
def _hf_logits(hf, ids: torch.Tensor) -> torch.Tensor:  # [n, vocab]
    return hf(ids[None]).logits[0].float()


def _kv_cache(model) -> torch.Tensor:  # as ModelRunner allocates it
    layer = model.layers[0]
    shape = (len(model.layers), 2, NUM_BLOCKS * BLOCK_SIZE, layer.num_kv_heads, layer.head_dim)
    return torch.zeros(shape, dtype=torch.float32)


def _window(model):
    return model.sliding_window if model.uses_sliding_window else None


@torch.no_grad()
def _run_schedule(model, seqs, tables, schedule):
    """Feed ``seqs`` (token tensors) through the paged model following ``schedule``.

    ``schedule`` is a list of steps; a step is a list of ``(seq_index, num_new_tokens)``
    in batch order. Returns, per sequence, the logits of all its tokens [len, vocab]
    (each row computed at the step that fed that token).
    """
    kv = _kv_cache(model)
    done = [0] * len(seqs)
    out = [[] for _ in seqs]
    for step in schedule:
        width = max(len(tables[i]) for i, _ in step)
        table = torch.full((len(step), width), -1, dtype=torch.int64)
        ids, pos, q_lens, ctx_lens = [], [], [], []
        for row, (i, n) in enumerate(step):
            assert done[i] + n <= len(seqs[i]), "schedule runs past the sequence"
            table[row, :len(tables[i])] = torch.tensor(tables[i])
            ids.append(seqs[i][done[i]:done[i] + n])
            pos.append(torch.arange(done[i], done[i] + n))
            q_lens.append(n)
            ctx_lens.append(done[i] + n)
        meta = build_metadata(table, q_lens, ctx_lens, BLOCK_SIZE, _window(model), CPU)
        hidden, _ = _forward(model, torch.cat(ids), torch.cat(pos), kv, meta)
        logits = model.compute_logits(hidden)
        assert logits.shape == (sum(q_lens), model.config.vocab_size)
        for (i, n), chunk in zip(step, logits.split(q_lens)):
            out[i].append(chunk)
            done[i] += n
    for i, s in enumerate(seqs):
        assert done[i] == len(s), "schedule must cover every token"
    return [torch.cat(o) for o in out]


def _assert_close(ours: torch.Tensor, ref: torch.Tensor, what: str, atol: float = ATOL):
    diff = (ours - ref).abs().max().item()
    assert diff < atol, f"{what}: max |ours - hf| = {diff:.3e} (atol {atol:.0e})"


def test_weights_are_random(pair):
    """Guard for the test itself: every norm weight is far from its init, so offsets matter."""
    _, hf, _ = pair
    norms = [p for n, p in hf.named_parameters() if "norm" in n]
    assert norms and all(p.std() > 0.1 for p in norms)


def test_full_prefill(pair):
    name, hf, ours = pair
    ids = _tokens(40, seed=0)
    ref = _hf_logits(hf, ids)
    [logits] = _run_schedule(ours, [ids], [[3, 0, 5, 1]], [[(0, 40)]])
    _assert_close(logits, ref, f"{name} one-step prefill")


def test_chunked_prefill_then_decode(pair):
    name, hf, ours = pair
    ids = _tokens(50, seed=1)
    ref = _hf_logits(hf, ids)
    schedule = [[(0, 13)]] * 3 + [[(0, 1)]] * 11  # 39 prompt tokens in chunks, then 11 decodes
    [logits] = _run_schedule(ours, [ids], [[3, 0, 5, 1]], schedule)
    for t in range(0, 50):
        _assert_close(logits[t], ref[t], f"{name} position {t}")


def test_varlen_batch(pair):
    """Two sequences in one batch: prefill+prefill, decode+prefill chunk, decode+decode, verify+decode."""
    name, hf, ours = pair
    seqs = [_tokens(45, seed=2), _tokens(25, seed=3)]
    refs = [_hf_logits(hf, s) for s in seqs]
    tables = [[3, 0, 5], [6, 2]]
    schedule = [
        [(0, 20), (1, 9)],  # both prefilling, different lengths
        [(1, 1), (0, 21)],  # seq 1 decodes while seq 0 prefills (batch order swapped)
        [(0, 1), (1, 1)],  # both decode
        [(1, 5), (0, 1)],  # seq 1: multi-token query (speculative verification shape)
        [(0, 1)],
        [(1, 9), (0, 1)],  # seq 1 crosses into its second block
    ]
    logits = _run_schedule(ours, seqs, tables, schedule)
    for i in range(2):
        _assert_close(logits[i], refs[i], f"{name} varlen seq {i}")


@torch.no_grad()
def test_aux_hidden_states(pair):
    """``aux_layer_ids`` returns the residual stream entering those layers (HF hidden_states[i])."""
    name, hf, ours = pair
    ids = _tokens(40, seed=4)
    ref = hf(ids[None], output_hidden_states=True).hidden_states
    meta = build_metadata(torch.tensor([[3, 0, 5, 1]]), [40], [40], BLOCK_SIZE, _window(ours), CPU)
    _, aux = _forward(ours, ids, torch.arange(40), _kv_cache(ours), meta, aux_layer_ids=(0, 1, 2))
    assert len(aux) == 3
    for i, a in enumerate(aux):
        _assert_close(a, ref[i][0], f"{name} aux hidden state entering layer {i}")


def test_sliding_window_is_exercised(pair):
    """The configs must actually put the window inside a 40-token prompt where they claim one."""
    name, hf, ours = pair
    expected = {"mistral": 8, "qwen3_swa": 8, "gemma3": 8}.get(name)
    assert _window(ours) == expected
    if expected:
        assert ours.layer_types == list(getattr(hf.config, "layer_types", None) or ours.layer_types)
        assert "sliding_attention" in ours.layer_types


# --- real model ---------------------------------------------------------------------------

SMOL_MESSAGES = [
    [{"role": "user", "content": "What is the capital of France? Answer in one short sentence."}],
    [{"role": "system", "content": "You are a helpful assistant."},
     {"role": "user", "content": "Write a haiku about the sea."}],
]


@pytest.fixture(scope="module")
def smol():
    from transformers import AutoTokenizer

    from draftwise.models.loader import load_transformers_model, resolve_model

    path = resolve_model(None)
    hf = load_transformers_model(path, torch.float32)  # transformers' own GGUF loader is the reference
    tok = AutoTokenizer.from_pretrained(path)
    prompts = [tok.apply_chat_template(m, tokenize=False, add_generation_prompt=True) for m in SMOL_MESSAGES]
    prompt_ids = [tok.encode(p, add_special_tokens=False) for p in prompts]
    return path, hf, prompt_ids


@pytest.mark.slow
def test_smollm2_logits(smol):
    path, hf, prompt_ids = smol
    ours = build_model(path, load_config(path), torch.float32, CPU, max_positions=2048)
    ids = torch.tensor(prompt_ids[0])
    assert 20 <= len(ids) <= 60
    ref = _hf_logits(hf, ids)
    n = len(ids)
    tables = [list(range(NUM_BLOCKS - 1, -1, -1))[: (n + BLOCK_SIZE - 1) // BLOCK_SIZE]]
    [logits] = _run_schedule(ours, [ids], tables, [[(0, n)]])
    _assert_close(logits, ref, "SmolLM2 prefill", atol=1e-3)
    [logits] = _run_schedule(ours, [ids], tables, [[(0, 13)], [(0, n - 14)], [(0, 1)]])
    _assert_close(logits, ref, "SmolLM2 chunked", atol=1e-3)
    assert torch.equal(logits.argmax(-1), ref.argmax(-1))


@pytest.mark.slow
def test_smollm2_greedy_generation(smol):
    """32 greedy tokens (EOS ignored) equal HF ``generate``; with EOS honoured ours stops right after it."""
    from draftwise import LLM, SamplingParams

    path, hf, prompt_ids = smol
    eos = hf.generation_config.eos_token_id
    llm = LLM(dtype="float32")
    prompts = [{"prompt_token_ids": p} for p in prompt_ids]
    full = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True), use_tqdm=False)
    stop = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=32), use_tqdm=False)
    for p, ours_full, ours_stop in zip(prompt_ids, full, stop):
        with torch.no_grad():
            gen = hf.generate(torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long),
                              do_sample=False, max_new_tokens=32, eos_token_id=[])  # [] = never stop
        ref = gen[0, len(p):].tolist()
        assert len(ref) == 32
        assert ours_full.outputs[0].token_ids == ref, f"prompt of {len(p)} tokens: ours != hf"
        expected = ref[:ref.index(eos) + 1] if eos in ref else ref
        assert ours_stop.outputs[0].token_ids == expected

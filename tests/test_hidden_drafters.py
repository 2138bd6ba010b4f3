"""Hidden-state drafters (eagle, eagle3, mtp, medusa): the drafts the engine proposes mid-generation
equal a from-scratch reference (plain torch over the whole sequence, target hidden states from
transformers), and bad checkpoints or configs fail with errors naming the problem.
Greedy equivalence for every method is in test_spec_equivalence.py."""
from __future__ import annotations

import json
import shutil

import pytest
import torch
import torch.nn.functional as F
from conftest import PROMPTS, greedy
from safetensors.torch import load_file, save_file

from draftwise import LLM

EPS = 1e-6


def rms(x, w):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * w


def rope(x, pos, theta=10000.0):  # [T, heads, d]
    d = x.shape[-1]
    freqs = pos[:, None].float() * (1.0 / theta ** (torch.arange(0, d, 2).float() / d))[None]
    emb = torch.cat((freqs, freqs), -1)
    rotated = torch.cat((-x[..., d // 2:], x[..., :d // 2]), -1)
    return x * emb.cos()[:, None] + rotated * emb.sin()[:, None]


def ref_layer(t, prefix, attn_in, residual):
    """One Llama layer over a whole sequence (causal), from Hugging Face-named tensors."""
    n, pos = attn_in.shape[0], torch.arange(attn_in.shape[0])
    q = rope((attn_in @ t[prefix + "self_attn.q_proj.weight"].T).view(n, 4, 16), pos)
    k = rope((attn_in @ t[prefix + "self_attn.k_proj.weight"].T).view(n, 2, 16), pos).repeat_interleave(2, 1)
    v = (attn_in @ t[prefix + "self_attn.v_proj.weight"].T).view(n, 2, 16).repeat_interleave(2, 1)
    a = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), is_causal=True)
    h = residual + a.transpose(0, 1).reshape(n, 64) @ t[prefix + "self_attn.o_proj.weight"].T
    m = rms(h, t[prefix + "post_attention_layernorm.weight"])
    mlp = F.silu(m @ t[prefix + "mlp.gate_proj.weight"].T) * (m @ t[prefix + "mlp.up_proj.weight"].T)
    return h + mlp @ t[prefix + "mlp.down_proj.weight"].T


def target_states(model_dir, tokens: list[int]) -> dict:
    """transformers' target over ``tokens``: final-norm hidden, inputs of each layer, pre-norm output."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    seen = {}

    def grab(key):
        def hook(module, args, kwargs):
            seen[key] = (args[0] if args else kwargs["hidden_states"])[0]
        return hook

    for i, layer in enumerate(model.model.layers):
        layer.register_forward_pre_hook(grab(i), with_kwargs=True)
    model.model.norm.register_forward_pre_hook(grab(len(model.model.layers)), with_kwargs=True)
    with torch.no_grad():
        out = model(torch.tensor([tokens]), output_hidden_states=True)
    seen["final"] = out.hidden_states[-1][0]
    seen["embed"] = model.model.embed_tokens.weight.detach()
    seen["lm_head"] = model.lm_head.weight.detach()
    return seen


def engine_drafts(model_dir, config: dict, num_steps: int = 4):
    """Run a request a few steps; return (all tokens so far, the drafts proposed for the next step)."""
    llm = LLM(model=str(model_dir), dtype="float32", speculative_config=config)
    engine = llm.llm_engine
    engine.add_request("r", PROMPTS[4], greedy(60, ignore_eos=True))
    for _ in range(num_steps):
        engine.step()
    seq = engine.requests["r"].seqs[0]
    assert seq.spec.draft_token_ids, "the proposer drafted nothing"
    return list(seq.all_token_ids), list(seq.spec.draft_token_ids)


def chain(first_hidden, tokens, num, forward, draft):
    """Reference chain: position p reads token p + 1 and hidden p; each draft extends both lists."""
    toks, hid, drafts = list(tokens[1:]), list(first_hidden), []
    for _ in range(num):
        out = forward(torch.tensor(toks), torch.stack(hid))
        drafts.append(int(draft(out[-1])))
        toks.append(drafts[-1])
        hid.append(out[-1])
    return drafts


def test_eagle_drafts_equal_reference(tiny_model_dir, spec_dirs):
    tokens, drafts = engine_drafts(tiny_model_dir, {"method": "eagle", "model": str(spec_dirs["eagle"]),
                                                    "num_speculative_tokens": 3})
    t, s = load_file(str(spec_dirs["eagle"] / "model.safetensors")), target_states(tiny_model_dir, tokens)

    def forward(toks, hidden):
        x = torch.cat((s["embed"][toks], hidden), -1) @ t["fc.weight"].T + t["fc.bias"]
        return ref_layer(t, "layers.0.", x, x)  # no input norm on EAGLE's layer 0

    ref = chain(s["final"][:len(tokens) - 1], tokens, len(drafts), forward, lambda h: (s["lm_head"] @ h).argmax())
    assert drafts == ref


def test_eagle3_drafts_equal_reference(tiny_model_dir, spec_dirs):
    tokens, drafts = engine_drafts(tiny_model_dir, {"method": "eagle3", "model": str(spec_dirs["eagle3"]),
                                                    "num_speculative_tokens": 4})
    t, s = load_file(str(spec_dirs["eagle3"] / "model.safetensors")), target_states(tiny_model_dir, tokens)
    n = len(tokens) - 1
    fused = torch.cat([s[0][:n], s[1][:n], s[2][:n]], -1) @ t["fc.weight"].T  # aux layer ids (0, 1, 2)

    def forward(toks, hidden):
        attn_in = torch.cat((rms(s["embed"][toks], t["midlayer.input_layernorm.weight"]),
                             rms(hidden, t["midlayer.hidden_norm.weight"])), -1)
        return ref_layer(t, "midlayer.", attn_in, hidden)

    def draft(h):
        d = (t["lm_head.weight"] @ rms(h, t["norm.weight"])).argmax()
        return d + t["d2t"][d]

    assert drafts == chain(fused, tokens, len(drafts), forward, draft)


def test_mtp_drafts_equal_reference(tiny_model_dir, spec_dirs):
    """Two MTP layers: layer 0 reads the target's hidden state, layer 1 layer 0's output one position back."""
    target = spec_dirs["mtp_target"]
    tokens, drafts = engine_drafts(tiny_model_dir, {"method": "mtp", "model": str(target),
                                                    "num_speculative_tokens": 2})
    t, s = load_file(str(target / "model.safetensors")), target_states(tiny_model_dir, tokens)

    def mtp_layer(i, toks, hidden):
        p = f"model.layers.{2 + i}."
        e = s["embed"][toks] * (torch.arange(len(toks)) != 0)[:, None]
        x = torch.cat((rms(e, t[p + "enorm.weight"]), rms(hidden, t[p + "hnorm.weight"])), -1)
        x = x @ t[p + "eh_proj.weight"].T
        return ref_layer(t, p, rms(x, t[p + "input_layernorm.weight"]), x)

    n = len(tokens) - 1
    out0 = mtp_layer(0, torch.tensor(tokens[1:]), s["final"][:n])
    head0, norm0 = t["model.layers.2.shared_head.head.weight"], t["model.layers.2.shared_head.norm.weight"]
    first = int((head0 @ rms(out0[-1], norm0)).argmax())
    shifted = torch.cat((torch.zeros(1, 64), out0), 0)  # layer 1 at p reads layer 0 at p - 1
    out1 = mtp_layer(1, torch.tensor(tokens[1:] + [first]), shifted)
    second = int((s["lm_head"] @ rms(out1[-1], t["model.layers.3.shared_head.norm.weight"])).argmax())
    assert drafts == [first, second]


def test_medusa_drafts_equal_reference(tiny_model_dir, spec_dirs):
    tokens, drafts = engine_drafts(tiny_model_dir, {"method": "medusa", "model": str(spec_dirs["medusa"])})
    t = torch.load(spec_dirs["medusa"] / "medusa_lm_head.pt", weights_only=True)
    h = target_states(tiny_model_dir, tokens)["final"][len(tokens) - 2]
    ref = []
    for i in range(3):
        x = h + F.silu(h @ t[f"medusa_head.{i}.0.linear.weight"].T + t[f"medusa_head.{i}.0.linear.bias"])
        ref.append(int((t[f"medusa_head.{i}.1.weight"] @ x).argmax()))
    assert drafts == ref


def test_dflash_drafts_equal_reference(tiny_model_dir, spec_dirs):
    """Context K/V from hidden_norm(fc(target layer outputs)), a non-causal block [last, mask, mask, mask]."""
    tokens, drafts = engine_drafts(tiny_model_dir, {"method": "dflash", "model": str(spec_dirs["dflash"])})
    t, s = load_file(str(spec_dirs["dflash"] / "model.safetensors")), target_states(tiny_model_dir, tokens)
    n = len(tokens) - 1  # context positions 0 .. n - 1; the block starts at n
    ctx = rms(torch.cat([s[1][:n], s[2][:n]], -1) @ t["fc.weight"].T, t["hidden_norm.weight"])
    x = s["embed"][torch.tensor([tokens[-1]] + [3] * 3)]
    pos = torch.arange(n + 4)
    for i in range(2):
        p = f"layers.{i}."
        h = rms(x, t[p + "input_layernorm.weight"])
        q = rms((h @ t[p + "self_attn.q_proj.weight"].T).view(4, 4, 16), t[p + "self_attn.q_norm.weight"])
        both = torch.cat((ctx, h), 0)
        k = rms((both @ t[p + "self_attn.k_proj.weight"].T).view(-1, 2, 16), t[p + "self_attn.k_norm.weight"])
        v = (both @ t[p + "self_attn.v_proj.weight"].T).view(-1, 2, 16)
        q, k = rope(q, pos[n:]), rope(k, pos).repeat_interleave(2, 1)
        a = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1),
                                           v.repeat_interleave(2, 1).transpose(0, 1))  # not causal
        x = x + a.transpose(0, 1).reshape(4, 64) @ t[p + "self_attn.o_proj.weight"].T
        m = rms(x, t[p + "post_attention_layernorm.weight"])
        x = x + (F.silu(m @ t[p + "mlp.gate_proj.weight"].T) * (m @ t[p + "mlp.up_proj.weight"].T)) \
            @ t[p + "mlp.down_proj.weight"].T
    ref = (rms(x, t["norm.weight"]) @ s["lm_head"].T).argmax(-1)[1:].tolist()
    assert drafts == ref


def test_padded_and_ragged_drafter_batches_agree(tiny_model_dir, spec_dirs):
    """Same drafts (hence the same acceptance counts) with either batch shape, batched and uneven."""
    prompts, params = PROMPTS[:5], [greedy(m, ignore_eos=True) for m in (9, 30, 17, 25, 4)]
    metrics = []
    for ragged in (False, True):
        llm = LLM(model=str(tiny_model_dir), dtype="float32", speculative_config={
            "method": "mtp", "model": str(spec_dirs["mtp_target"]), "num_speculative_tokens": 4,
            "disable_padded_drafter_batch": ragged})
        llm.generate(prompts, params, use_tqdm=False)
        metrics.append(llm.get_spec_decode_stats())
    assert metrics[0] == metrics[1] and metrics[0]["spec_decode_num_drafts"] > 0


def _broken_copy(src, dst, drop=(), config_update=None):
    shutil.copytree(src, dst)
    file = dst / "model.safetensors"
    tensors = {k: v for k, v in load_file(str(file)).items() if k not in drop}
    save_file(tensors, str(file))
    if config_update:
        config = json.loads((dst / "config.json").read_text())
        config.update(config_update)
        (dst / "config.json").write_text(json.dumps(config))
    return dst


@pytest.mark.parametrize("case", ["eagle missing fc", "eagle3 as eagle", "eagle3 missing d2t", "eagle hidden",
                                  "medusa layout", "mtp without layers", "mtp too many tokens", "no model",
                                  "dflash block", "dflash missing norm"])
def test_bad_drafter_checkpoints_are_named(case, tiny_model_dir, spec_dirs, tmp_path):
    d = spec_dirs
    cases = {
        "eagle missing fc": ({"method": "eagle", "model": str(_broken_copy(d["eagle"], tmp_path / "e", ["fc.weight"]))},
                             "'fc.weight'"),
        "eagle3 as eagle": ({"method": "eagle", "model": str(d["eagle3"])}, "fc.weight"),
        "eagle3 missing d2t": ({"method": "eagle3", "model": str(_broken_copy(d["eagle3"], tmp_path / "e3", ["d2t"]))},
                               "'d2t'"),
        "eagle hidden": ({"method": "eagle", "model": str(_broken_copy(d["eagle"], tmp_path / "eh",
                                                                         config_update={"hidden_size": 32}))},
                         "hidden_size is 32 but the target's is 64"),
        "medusa layout": ({"method": "medusa", "model": str(d["eagle"])}, "medusa_head"),
        "mtp without layers": ({"method": "mtp", "model": str(tiny_model_dir)}, "num_nextn_predict_layers"),
        "mtp too many tokens": ({"method": "mtp", "model": str(d["mtp_target"]), "num_speculative_tokens": 3},
                                "multiple of 2"),
        "no model": ({"method": "eagle3", "num_speculative_tokens": 2}, "needs 'model'"),
        "dflash block": ({"method": "dflash", "model": str(d["dflash"]), "num_speculative_tokens": 4},
                         "block size is 4"),
        "dflash missing norm": ({"method": "dflash", "model": str(_broken_copy(d["dflash"], tmp_path / "df",
                                                                                ["layers.1.self_attn.k_norm.weight"]))},
                                "layers.1.self_attn.k_norm.weight"),
    }
    config, needle = cases[case]
    config.setdefault("num_speculative_tokens", 2)
    with pytest.raises(ValueError, match="speculative_config") as err:
        LLM(model=str(tiny_model_dir), dtype="float32", speculative_config=config)
    assert needle in str(err.value)


def test_method_inferred_from_speculators_config(tiny_model_dir, spec_dirs):
    from draftwise.spec_decode import SpeculativeConfig

    config = SpeculativeConfig.from_value({"model": str(spec_dirs["eagle3_speculators"])})
    assert (config.method, config.num_speculative_tokens) == ("eagle3", 3)
    medusa = SpeculativeConfig.from_value({"model": str(spec_dirs["medusa"])})
    assert (medusa.method, medusa.num_speculative_tokens) == ("medusa", 3)

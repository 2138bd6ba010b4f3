"""``make-data`` and ``train-draft`` on the tiny model: data, learning, public layout, resume, errors."""
from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from draftwise import LLM, SamplingParams
from draftwise.cli import main
from draftwise.train.dataset import load_dataset
from draftwise.train.evaluate import evaluate
from draftwise.train.loop import STATE, TrainOptions, load_trained, train_draft
from draftwise.train.make_data import make_data

PROMPTS = ["Paris is the capital of", "def fibonacci(n):", "The quick brown fox", "Once upon a time",
           "import numpy as np", "The weather today is", "My favourite food is", "In the beginning",
           "for i in range(10):", "Dear Sir or Madam,", "The results show that", "class Stack:"]
METHODS = ["eagle3", "eagle", "medusa", "mtp"]
PUBLIC_NAMES = {"eagle3": ["midlayer.hidden_norm.weight", "midlayer.self_attn.q_proj.weight", "fc.weight", "d2t",
                           "t2d", "lm_head.weight", "norm.weight"],
                "eagle": ["fc.weight", "fc.bias", "layers.0.self_attn.q_proj.weight", "layers.0.mlp.up_proj.weight"],
                "medusa": ["blocks.0.layers.0.weight", "blocks.1.layers.0.bias", "lm_heads.1.weight", "token_map"],
                "mtp": ["model.layers.2.eh_proj.weight", "model.layers.2.enorm.weight",
                        "model.layers.2.self_attn.q_proj.weight", "model.layers.2.shared_head.norm.weight"]}


@pytest.fixture(scope="module")
def data_dir(tiny_model_dir, tmp_path_factory):
    prompts = tmp_path_factory.mktemp("prompts") / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    out = tmp_path_factory.mktemp("data") / "data"
    make_data(str(tiny_model_dir), [str(prompts)], out, max_tokens=24, max_num_seqs=8, dtype="float32")
    return out


def options(data_dir, out, method, **kw) -> TrainOptions:
    base = dict(method=method, data=str(data_dir), out=str(out), epochs=8, lr=3e-3, batch_tokens=128,
                ttt_steps=3, eval_steps=3, draft_vocab_size=64, num_heads=3, held_out_fraction=0.2,
                warmup_steps=2, export_dtype="float32", precision="float32")
    base.update(kw)
    return TrainOptions(**base)


def test_make_data_saves_greedy_answers_and_states(data_dir, tiny_llm):
    manifest = json.loads((data_dir / "manifest.json").read_text())
    assert manifest["num_samples"] == len(PROMPTS) and manifest["layer_ids"] == [0, 1, 2]
    first = manifest["samples"][0]
    tensors = load_file(str(data_dir / first["file"]))
    ids = tensors["token_ids"].tolist()
    assert tensors["hidden_states"].shape == (len(ids), 3, 64)
    out = tiny_llm.generate({"prompt_token_ids": ids[:first["num_prompt_tokens"]]},
                            SamplingParams(max_tokens=24, temperature=0.0), use_tqdm=False)[0]
    assert ids[first["num_prompt_tokens"]:] == list(out.outputs[0].token_ids)


@pytest.mark.parametrize("method", METHODS)
def test_training_lowers_loss_and_reloads_in_public_layout(method, data_dir, tmp_path, tiny_model_dir, tiny_llm):
    out = tmp_path / method
    summary = train_draft(options(data_dir, out, method))
    losses = [h["train_loss"] for h in summary["history"]]
    assert losses[-1] < 0.95 * losses[0], losses  # soft labels: the target's entropy is a floor
    agreement = [h["train_step0_agreement"] for h in summary["history"]]
    assert agreement[-1] > agreement[0], agreement
    held = summary["history"][-1]["held_out"]
    assert held["num_anchors"] > 0 and set(held["acceptance_length"]) == {"1", "2", "3"}
    assert set(PUBLIC_NAMES[method]) <= set(load_file(str(out / "model.safetensors")))

    config = {"method": method, "model": str(out), "num_speculative_tokens": 3}
    llm = LLM(model=str(tiny_model_dir), dtype="float32", seed=0, speculative_config=config)
    params = SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True)
    spec = llm.generate(PROMPTS[:4], params, use_tqdm=False)
    plain = tiny_llm.generate(PROMPTS[:4], params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in spec] == [o.outputs[0].token_ids for o in plain]
    assert llm.get_spec_decode_stats()["spec_decode_num_draft_tokens"] > 0


@pytest.mark.parametrize("method", METHODS)
def test_engine_accepts_what_training_estimates(method, data_dir, tmp_path, tiny_model_dir, monkeypatch):
    """The trained network is the one the engine runs: fitted to the data, the engine's measured
    mean acceptance length on the data's prompts matches the offline chained estimate on the same
    data (drafting from each answer's start, again after each acceptance) within 8%."""
    out = tmp_path / method
    train_draft(options(data_dir, out, method, epochs=40, held_out_fraction=0.0, draft_vocab_size=400))
    data = load_dataset(data_dir)
    figures = evaluate(load_trained(out, data), data.samples, 128, 3)
    estimate, per_position = figures["chain_acceptance_length"]["3"], figures["acceptance_length"]["3"]
    monkeypatch.setenv("DRAFTWISE_VERIFY_ROW_COST", "0")  # draft every step, whatever it costs
    config = {"method": method, "model": str(out), "num_speculative_tokens": 3}
    llm = LLM(model=str(tiny_model_dir), dtype="float32", seed=0, speculative_config=config)
    llm.generate(PROMPTS, SamplingParams(max_tokens=24, temperature=0.0), use_tqdm=False)
    measured = llm.get_spec_decode_stats()["spec_decode_mean_acceptance_length"]
    assert estimate > 1.6 and abs(measured - estimate) < 0.08 * estimate, (measured, estimate, per_position)


def test_resume_continues_where_it_stopped(data_dir, tmp_path):
    straight = train_draft(options(data_dir, tmp_path / "straight", "eagle3", epochs=2))

    def stop(epoch, result):
        raise KeyboardInterrupt  # interrupted right after epoch 1 was saved

    with pytest.raises(KeyboardInterrupt):
        train_draft(options(data_dir, tmp_path / "resumed", "eagle3", epochs=2), on_epoch_end=stop)
    assert torch.load(tmp_path / "resumed" / STATE, weights_only=False)["epoch"] == 0
    resumed = train_draft(options(data_dir, tmp_path / "resumed", "eagle3", epochs=2, resume=True))
    def drop_time(history):
        return [{k: v for k, v in h.items() if k != "seconds"} for h in history]

    assert drop_time(resumed["history"]) == drop_time(straight["history"])
    a = load_file(str(tmp_path / "straight" / "model.safetensors"))
    b = load_file(str(tmp_path / "resumed" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_bad_arguments_are_clear_errors(data_dir, tmp_path, tiny_model_dir):
    with pytest.raises(ValueError, match="--method 'dflash' is not trainable"):
        train_draft(options(data_dir, tmp_path / "a", "dflash"))
    with pytest.raises(ValueError, match="no manifest.json"):
        train_draft(options(tmp_path, tmp_path / "b", "eagle3"))
    empty = tmp_path / "empty"
    empty.mkdir()
    manifest = json.loads((data_dir / "manifest.json").read_text())
    (empty / "manifest.json").write_text(json.dumps(dict(manifest, samples=[])))
    with pytest.raises(ValueError, match="no samples"):
        train_draft(options(empty, tmp_path / "c", "eagle3"))
    other = tmp_path / "other"
    other.mkdir()
    (other / "manifest.json").write_text(json.dumps(dict(manifest, vocab_size=manifest["vocab_size"] + 7,
                                                         samples=manifest["samples"][:1])))
    (other / "hidden").symlink_to(data_dir / "hidden")
    with pytest.raises(ValueError, match="vocabulary mismatch"):
        train_draft(options(other, tmp_path / "d", "eagle3"))
    with pytest.raises(ValueError, match="no trainer_state.pt"):
        train_draft(options(data_dir, tmp_path / "e", "eagle3", resume=True))
    with pytest.raises(ValueError, match="--epochs must be a positive integer"):
        train_draft(options(data_dir, tmp_path / "f", "eagle3", epochs=0))
    with pytest.raises(ValueError, match="--out .* already holds a dataset"):
        make_data(str(tiny_model_dir), ["chat"], data_dir)
    with pytest.raises(ValueError, match="unknown source 'nope'"):
        make_data(str(tiny_model_dir), ["nope"], tmp_path / "g")


def test_cli_runs_make_data_then_train_draft(tiny_model_dir, tmp_path, capsys):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS[:4]))
    assert main(["make-data", "--model", str(tiny_model_dir), "--prompts", str(prompts), "--out",
                 str(tmp_path / "data"), "--max-tokens", "8", "--dtype", "float32"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["num_samples"] == 4
    assert main(["train-draft", "--method", "medusa", "--data", str(tmp_path / "data"), "--out",
                 str(tmp_path / "medusa"), "--epochs", "1", "--num-heads", "2", "--draft-vocab-size", "32"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["draft_vocab_size"] == 32 and summary["last_epoch"]["epoch"] == 1
    config = json.loads((tmp_path / "medusa" / "config.json").read_text())
    assert config["num_heads"] == 2 and config["truncated_vocab_size"] == 32


def test_cli_reports_bad_method_with_exit_status_2(data_dir, tmp_path, capsys):
    assert main(["train-draft", "--method", "ngram", "--data", str(data_dir), "--out", str(tmp_path / "x")]) == 2
    assert "--method 'ngram' is not trainable" in capsys.readouterr().err


@pytest.mark.slow
def test_bundled_smollm2_eagle3_drafter(monkeypatch):
    """The shipped drafter resolves by name, is small bf16, keeps greedy outputs and gets accepted."""
    from draftwise.drafters import resolve_drafter
    from draftwise.bench.workloads import load_workload

    name = "draftwise/SmolLM2-135M-Instruct-eagle3"
    weights = load_file(resolve_drafter(name) + "/model.safetensors")
    assert sum(t.numel() * t.element_size() for t in weights.values()) <= 25 * 2 ** 20
    assert weights["fc.weight"].dtype == torch.bfloat16
    monkeypatch.setenv("DRAFTWISE_VERIFY_ROW_COST", "0")
    chats = [p.messages for p in load_workload("chat", num_prompts=2)]
    params = SamplingParams(max_tokens=48, temperature=0.0)
    plain = LLM(dtype="float32").chat(chats, params, use_tqdm=False)
    llm = LLM(dtype="float32", speculative_config={"method": "eagle3", "model": name, "num_speculative_tokens": 3})
    spec = llm.chat(chats, params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in spec] == [o.outputs[0].token_ids for o in plain]
    assert llm.get_spec_decode_stats()["spec_decode_mean_acceptance_length"] > 1.3  # an untrained drafter: ~1.0


def test_bfloat16_training_learns_and_resumes_in_its_precision(data_dir, tmp_path):
    """Autocast bf16 (chosen, or measured by ``auto``): the loss falls, and a resumed run keeps the
    precision its first epochs ran in whatever a new measurement would say."""
    summary = train_draft(options(data_dir, tmp_path / "bf16", "eagle3", epochs=4, precision="bfloat16"))
    losses = [h["train_loss"] for h in summary["history"]]
    assert summary["precision"] == "bfloat16" and losses[-1] < 0.95 * losses[0], losses
    resumed = train_draft(options(data_dir, tmp_path / "bf16", "eagle3", epochs=5, precision="float32",
                                  resume=True))
    assert resumed["precision"] == "bfloat16"
    with pytest.raises(ValueError, match="--precision"):
        train_draft(options(data_dir, tmp_path / "bad", "eagle3", precision="fp8"))


def test_eagle3_reads_the_aux_layers_it_is_given(data_dir, tmp_path, tiny_model_dir, tiny_llm):
    """``--aux-layer-ids``: the head reads those target layers (the last output included) and the engine,
    reading them from the exported config, keeps greedy outputs."""
    out = tmp_path / "aux"
    train_draft(options(data_dir, out, "eagle3", epochs=2, aux_layer_ids=[1, 2]))
    config = json.loads((out / "config.json").read_text())
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 2]
    assert load_file(str(out / "model.safetensors"))["fc.weight"].shape == (64, 2 * 64)
    llm = LLM(model=str(tiny_model_dir), dtype="float32", seed=0,
              speculative_config={"method": "eagle3", "model": str(out), "num_speculative_tokens": 3})
    params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
    assert [o.outputs[0].token_ids for o in llm.generate(PROMPTS[:3], params, use_tqdm=False)] == \
        [o.outputs[0].token_ids for o in tiny_llm.generate(PROMPTS[:3], params, use_tqdm=False)]
    with pytest.raises(ValueError, match="layer 5"):
        train_draft(options(data_dir, tmp_path / "bad", "eagle3", aux_layer_ids=[1, 5]))


def test_device_is_checked_and_auto_follows_the_machine(data_dir, tmp_path):
    with pytest.raises(ValueError, match="--device must be auto, cpu, cuda or cuda:N, got 'tpu'"):
        train_draft(options(data_dir, tmp_path / "a", "eagle3", device="tpu"))
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="--device cuda: this machine has no CUDA device"):
            train_draft(options(data_dir, tmp_path / "b", "eagle3", device="cuda"))
    summary = train_draft(options(data_dir, tmp_path / "c", "eagle3", epochs=1))
    assert summary["device"] == ("cuda" if torch.cuda.is_available() else "cpu")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("method", METHODS)
def test_training_on_cuda_follows_the_cpu_run(method, data_dir, tmp_path):
    """The same seeded run on the GPU and the CPU (fp32): the same losses and weights up to rounding."""
    runs = {device: train_draft(options(data_dir, tmp_path / device, method, epochs=2, device=device))
            for device in ("cpu", "cuda")}
    for cpu, gpu in zip(runs["cpu"]["history"], runs["cuda"]["history"]):
        assert gpu["train_loss"] == pytest.approx(cpu["train_loss"], rel=2e-3)
    a, b = (load_file(str(tmp_path / device / "model.safetensors")) for device in ("cpu", "cuda"))
    assert a.keys() == b.keys()
    for name in a:
        assert torch.allclose(a[name].float(), b[name].float(), atol=2e-3, rtol=2e-2), name

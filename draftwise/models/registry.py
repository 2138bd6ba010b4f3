"""Architecture registry: Hugging Face ``model_type`` -> ``ArchSpec``, and weight loading.

``build_model`` is the only way the engine makes a target model. Adding an
architecture that fits ``DecoderLM`` is one line in ``ARCH_SPECS``.

``load_config`` and ``load_tokenizer`` read a model folder. The folder draftwise writes for a
GGUF file holds a complete config (every default resolved when it was written: ``gguf_config.py``)
and a ``tokenizer.json``: those load into transformers' base config and fast
tokenizer classes, without importing the architecture's classes (whose import chain takes
about a second). Other folders go through ``AutoConfig`` and ``AutoTokenizer``.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from ..layers import gguf_linear
from ..layers.common import RMSNorm
from ..layers.kernel_choice import AttentionGroup, LinearGroup, choose_kernels
from ..layers.linear import PackedLinear, can_pack
from .decoder import ArchSpec, DecoderLM
from .decoder_stack import build_stack
from .gguf_blocks import BlockLoader, apply_gguf_blocks
from .gguf_config import config_from_values
from .gguf_file import GGUFFile
from .hf_names import layer_names
from .loader import cache_root, gguf_source, open_checkpoint, take_written_tokenizer
from .quantize import WEIGHT_ONLY, quantize_linears
from .shard_layout import ShardLayout
from .shard_weights import read_param

GEMMA = ArchSpec(norm_offset=1.0, sandwich_norms=True, qk_norm=True, embed_scale=True,
                 default_act="gelu_pytorch_tanh")
ARCH_SPECS: dict[str, ArchSpec] = {
    "llama": ArchSpec(),
    "mistral": ArchSpec(),
    "qwen2": ArchSpec(qkv_bias=True),
    "qwen3": ArchSpec(qk_norm=True),
    "phi3": ArchSpec(),  # q/k/v and gate/up stored fused (hf_names.py); one sliding window for every layer
    "gemma3_text": GEMMA,
    "gemma3": GEMMA,
}


def load_config(path: Path):
    config = _written_config(path)
    if config is None:
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(path)
    if config.model_type not in ARCH_SPECS:
        raise ValueError(f"model architecture {config.model_type!r} is not supported; "
                         f"supported: {sorted(ARCH_SPECS)}")
    return getattr(config, "text_config", None) or config


def load_tokenizer(name_or_path):
    """The tokenizer of a model folder or hub name (``tokenizer=`` of the engine, else the model's)."""
    path = Path(name_or_path)
    if gguf_source(path) is not None and _tokenizer_class(path) in _GENERIC_TOKENIZERS:
        from transformers import PreTrainedTokenizerFast

        written = take_written_tokenizer(path)  # a first load: the object whose files were just written
        if isinstance(written, PreTrainedTokenizerFast):
            written.name_or_path = str(path)
            return written
        return PreTrainedTokenizerFast.from_pretrained(path)
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(name_or_path)


_GENERIC_TOKENIZERS = ("TokenizersBackend", "PreTrainedTokenizerFast")  # no architecture-specific class


def _tokenizer_class(path: Path) -> str | None:
    config = path / "tokenizer_config.json"
    if not (path / "tokenizer.json").is_file() or not config.is_file():
        return None
    return json.loads(config.read_text()).get("tokenizer_class")


def _written_config(path: Path):
    """The config draftwise wrote for a GGUF file, in transformers' base class; None for other folders
    and nested (multimodal) configs."""
    if gguf_source(path) is None:
        return None
    values = json.loads((Path(path) / "config.json").read_text())
    if "text_config" in values:
        return None
    return config_from_values(values)


def runs_on_blocks(gguf: Path | None, device: torch.device, world_size: int, gguf_weights: str,
                   quantization: str | None) -> bool:
    """Whether ``build_model`` runs the linears of a model from the GGUF file ``gguf`` on its blocks."""
    return (gguf is not None and gguf_weights == "quantized"
            and quantization not in WEIGHT_ONLY and device.type == "cpu" and world_size == 1
            and gguf_linear.available())


def load_blocks_ahead(gguf: Path | None, **where) -> BlockLoader | None:
    """Start making the GGUF linears of the file ``gguf`` in the background (``runs_on_blocks(gguf,
    **where)`` must hold, else None), even before its folder is written: pass the loader to
    ``build_model``, which then waits for it."""
    if not runs_on_blocks(gguf, **where):
        return None
    reader = GGUFFile(gguf)
    return BlockLoader(reader, int(reader.header.get(f"{reader.arch}.block_count")))


def build_model(path: Path, config, dtype: torch.dtype, device: torch.device,
                max_positions: int, tp=None, gguf_weights: str = "dequantized",
                quantization: str | None = None, blocks: BlockLoader | None = None) -> DecoderLM:
    """Load a model. On CPU, a GGUF model's linears keep the file's blocks and its embedding stays in the
    file (``gguf_blocks.py``: no float copy is made) unless ``gguf_weights="dequantized"`` or the
    model is sharded (the blocks are not split across ranks); float weights are read from the
    file one tensor at a time. ``quantization`` (``quantize.WEIGHT_ONLY``) quantizes any model's
    linears at load instead. On CPU its linears then run the kernels measured fastest on this
    machine (``kernel_choice.py``). With ``tp`` (a ``TPGroup`` of more than one rank) it is that
    rank's shard, and only the shard's slices of the weights are read (``shard_layout.py``,
    ``shard_weights.py``). ``blocks``: the linears ``load_blocks_ahead`` started making."""
    spec = ARCH_SPECS[config.model_type]
    layout = ShardLayout.of(config, tp.rank, tp.world_size) if tp is not None else ShardLayout.whole(config)
    with torch.device("meta"):  # no random init: every parameter comes from the checkpoint
        model = DecoderLM(config, spec, max_positions, layout, tp)
    on_blocks = runs_on_blocks(gguf_source(path), device, layout.world_size, gguf_weights, quantization)
    reader = blocks.gguf if blocks is not None and on_blocks else open_checkpoint(path)
    model.num_gguf_linears = apply_gguf_blocks(model, reader, blocks) if on_blocks else 0
    _materialize(model)
    _load_state(model, reader)
    model = model.to_device(device, dtype).eval()
    if quantization in WEIGHT_ONLY:
        _check_can_quantize(quantization, device, layout)
        model.num_gguf_linears = quantize_linears(model, quantization)
    if model.num_gguf_linears:
        model.stack = build_stack(model)
    if can_pack(device, dtype):
        model.kernel_plans = choose_kernels(kernel_groups(model, dtype), cache_root() / "kernels")
    return model


def _materialize(model: nn.Module) -> None:
    """Give every parameter still on the meta device uninitialized CPU storage (to be loaded)."""
    for module in model.modules():
        for name, param in list(module.named_parameters(recurse=False)):
            if param.is_meta:
                # torch.empty, not empty_like: on a meta tensor that runs torch's Python reference ops,
                # whose first use imports the compiler stack (about half a second)
                setattr(module, name, nn.Parameter(torch.empty(param.shape, dtype=param.dtype), requires_grad=False))


def _check_can_quantize(quantization: str, device: torch.device, layout: ShardLayout) -> None:
    where = None
    if device.type != "cpu":
        where = f"device {device.type} (the kernels are CPU kernels)"
    elif layout.world_size > 1:
        where = "tensor_parallel_size > 1 (quantized weights are not sharded)"
    elif not gguf_linear.available():
        where = "a machine where draftwise's C++ CPU kernels did not build"
    if where:
        raise ValueError(f"quantization={quantization!r} cannot run with {where}; allowed there: None")


def kernel_groups(model: DecoderLM, dtype: torch.dtype) -> dict:
    """What a CPU step runs, as timed together: the decoder layers' linears, the head's, and
    the attention."""
    groups = {}
    layers = [m for layer in model.layers for m in layer.modules() if isinstance(m, PackedLinear)]
    if layers:
        groups["layers"] = LinearGroup(layers)
    if isinstance(model.lm_head, PackedLinear):
        groups["head"] = LinearGroup([model.lm_head])
    layer = model.layers[0]
    groups["attention"] = AttentionGroup(layer.num_heads, layer.num_kv_heads, layer.head_dim, dtype,
                                         model.set_attention_plan)
    return groups


def _load_state(model: DecoderLM, reader) -> None:  # a CheckpointReader or a GGUFFile
    head_dim = model.layers[0].head_dim
    for name, param in model.named_parameters():
        parts = _source_names(name, reader, model.spec.sandwich_norms)
        missing = [part for part in parts if part not in reader]
        if missing:
            raise ValueError(f"checkpoint is missing the weight for {name} ({missing[0]})")
        module, leaf = name.split(".")[-2:]
        tensor = read_param(reader, module, leaf, parts, model.layout, head_dim)
        if tuple(tensor.shape) != tuple(param.shape):
            raise ValueError(f"weight {name}: checkpoint shape {tuple(tensor.shape)} != {tuple(param.shape)}")
        param.data = tensor
    for module in model.modules():
        if isinstance(module, RMSNorm) and module.offset:
            module.weight.data += module.offset


def _source_names(name: str, reader, sandwich: bool) -> list[str]:
    """The checkpoint tensors (fused along dim 0) behind our parameter ``name``."""
    if name in ("embed_tokens.weight", "norm.weight"):
        return ["model." + name]
    if name == "lm_head.weight":  # tied checkpoints may store the embedding only
        return ["lm_head.weight" if "lm_head.weight" in reader else "model.embed_tokens.weight"]
    _, idx, module, leaf = name.split(".", 3)  # layers.{i}.{module}.{weight|bias}
    return layer_names(f"model.layers.{idx}.", module, leaf, sandwich, reader)


def load_layer(layer: nn.Module, weights: dict[str, torch.Tensor], prefix: str, what: str,
               skip: tuple[str, ...] = ()) -> None:
    """Fill a ``DecoderLayer`` from Hugging Face tensors named ``{prefix}self_attn.q_proj.weight`` etc.

    ``skip`` names our modules that the checkpoint does not have (they keep their values);
    a missing tensor raises ``ValueError`` naming it and ``what`` (the checkpoint)."""
    for name, param in layer.named_parameters():
        module, leaf = name.split(".", 1)
        if module in skip:
            continue
        tensor = layer_tensor(weights, prefix, module, leaf, False)
        if tensor is None:
            raise ValueError(f"{what} is missing tensor {_missing(weights, prefix, module, leaf)}")
        if tuple(tensor.shape) != tuple(param.shape):
            raise ValueError(f"{what}: tensor for {prefix}{module}.{leaf} has shape {tuple(tensor.shape)}, "
                             f"expected {tuple(param.shape)}")
        param.data = tensor.float()


def layer_hf_tensors(layer: nn.Module, prefix: str, skip: tuple[str, ...] = ()) -> dict[str, torch.Tensor]:
    """The inverse of ``load_layer``: a ``DecoderLayer``'s parameters under Hugging Face names
    (q/k/v and gate/up split again), leaving out the modules named in ``skip``."""
    out = {}
    for name, param in layer.named_parameters():
        module, leaf = name.split(".", 1)
        if module in skip:
            continue
        names = layer_names(prefix, module, leaf, False)
        sizes = layer.split if module == "qkv_proj" else (param.shape[0] // len(names),) * len(names)
        out.update(zip(names, param.detach().split(sizes)))
    return out


def _missing(weights: dict, prefix: str, module: str, leaf: str) -> str:
    return next(name for name in layer_names(prefix, module, leaf, False, weights) if name not in weights)


def layer_tensor(weights: dict, prefix: str, module: str, leaf: str, sandwich: bool) -> torch.Tensor | None:
    """The checkpoint tensor (q/k/v and gate/up fused) behind one of our per-layer parameters."""
    parts = [weights.get(name) for name in layer_names(prefix, module, leaf, sandwich, weights)]
    return None if any(p is None for p in parts) else torch.cat(parts, 0)

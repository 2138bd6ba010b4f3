"""Our per-layer modules and the Hugging Face checkpoint tensors behind them.

``DecoderLayer`` fuses q/k/v into ``qkv_proj`` and gate/up into ``gate_up_proj``. Most checkpoints
store the parts (``self_attn.q_proj``, ...); some store them fused as we do (Phi-3:
``self_attn.qkv_proj``, ``mlp.gate_up_proj``, in the same order). ``layer_names`` gives the tensors
to concatenate: the fused tensor where the checkpoint (``reader``, anything with ``in``) holds it
and not the parts, else the parts. Safetensors folders, GGUF files (``GGUFFile`` maps these names to its own) and
drafter checkpoints all go through it.
"""
from __future__ import annotations

FUSED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}
GROUP = {"qkv_proj": "self_attn.", "gate_up_proj": "mlp."}
HF_NAMES = {  # our per-layer module -> its Hugging Face name
    "o_proj": "self_attn.o_proj", "down_proj": "mlp.down_proj", "input_norm": "input_layernorm",
    "post_attn_norm": "post_attention_layernorm", "post_mlp_norm": "post_feedforward_layernorm",
    "q_norm": "self_attn.q_norm", "k_norm": "self_attn.k_norm",
}


def layer_names(prefix: str, module: str, leaf: str, sandwich: bool, reader=None) -> list[str]:
    """The checkpoint names behind one of our per-layer parameters (q/k/v and gate/up: three / two
    parts, or the one fused tensor where ``reader`` holds it)."""
    if module in FUSED:
        parts = [f"{prefix}{GROUP[module]}{p}.{leaf}" for p in FUSED[module]]
        fused = f"{prefix}{GROUP[module]}{module}.{leaf}"
        # fused only where the parts are absent: gguf's name tables map a fused name to a part's
        # tensor in some architectures (llama's ffn_up answers for mlp.gate_up_proj)
        if reader is not None and parts[0] not in reader and fused in reader:
            return [fused]
        return parts
    if module == "pre_mlp_norm":  # Llama calls the pre-MLP norm post_attention_layernorm
        hf = "pre_feedforward_layernorm" if sandwich else "post_attention_layernorm"
    else:
        hf = HF_NAMES[module]
    return [f"{prefix}{hf}.{leaf}"]


def is_fused(parts: list[str], module: str) -> bool:
    """Whether ``parts`` (from ``layer_names``) is one tensor holding all of ``module``'s parts."""
    return module in FUSED and len(parts) == 1

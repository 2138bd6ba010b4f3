"""What ``train-draft`` trains: one ``TrainableDrafter`` subclass per method, registered by name.

A trainable drafter computes, for a padded batch, the same function its inference
proposer computes, but for every anchor position at once and differentiably:
``unroll(batch, num_steps)`` returns per draft step ``j`` the states ``[B, T, H]`` whose
row ``p`` predicts token ``p + 2 + j`` (the target's distribution at position
``p + 1 + j``), plus an optional extra loss; ``logits(j, rows)`` turns the rows that are
scored into draft-vocabulary logits (only those: the head is the costly part). ``export(out)``
writes the drafter in its method's public layout (config.json + model.safetensors),
which the inference proposer (and vLLM) loads.

``TargetParts`` are the frozen pieces of the target a drafter reads or starts from:
config, token embedding, final norm and lm_head, read from the target's weight files
(no full model is built).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from torch import nn

from ..models.loader import open_checkpoint, resolve_model
from ..models.registry import layer_hf_tensors, load_config
from ..spec_decode.drafter_modules import RopeCache
from .dataset import Batch, DraftVocab

TRAINERS: dict[str, type["TrainableDrafter"]] = {}


def register(cls):
    TRAINERS[cls.method] = cls
    return cls


@dataclass
class TargetParts:
    path: Path
    config: object  # transformers config of the target
    embed: torch.Tensor  # [vocab, H]
    norm_weight: torch.Tensor  # [H]
    lm_head: torch.Tensor  # [vocab, H]

    @classmethod
    def load(cls, model: str | None, device: torch.device = torch.device("cpu")) -> "TargetParts":
        path = resolve_model(model)
        config = load_config(path)
        weights = open_checkpoint(path)  # a GGUF's tensors are read from its file
        embed = weights.read("model.embed_tokens.weight").to(device)
        lm_head = weights.read("lm_head.weight").to(device) if "lm_head.weight" in weights else embed
        return cls(path, config, embed, weights.read("model.norm.weight").to(device), lm_head)

    @property
    def num_layers(self) -> int:
        return self.config.num_hidden_layers

    @property
    def vocab_size(self) -> int:
        return self.embed.shape[0]

    def final_norm(self, hidden: torch.Tensor) -> torch.Tensor:  # [..., H] pre-norm -> final-norm state
        return F.rms_norm(hidden.float(), (hidden.shape[-1],), self.norm_weight, self.config.rms_norm_eps)

    def config_dict(self) -> dict:
        config = self.config.to_dict()
        for key in ("architectures", "auto_map", "_name_or_path", "transformers_version", "dtype", "torch_dtype"):
            config.pop(key, None)
        return config


class TrainableDrafter(nn.Module):
    method: str = ""
    layer_ids: tuple[int, ...] = ()  # which saved target layers the drafter reads

    def __init__(self, target: TargetParts, vocab: DraftVocab, options: dict):
        super().__init__()
        self.target = target
        self.vocab = vocab
        self.options = options

    @classmethod
    def needed_layers(cls, target: TargetParts, options: dict) -> list[int]:
        """Target layer ids read from the data (default: ``L``, the last layer's output); their
        positions in the data arrive as ``options["layer_index"]``."""
        return [target.num_layers]

    @property
    def device(self) -> torch.device:
        return torch.device(self.options.get("device", "cpu"))

    def rope_cache(self, head_dim: int) -> RopeCache:
        """fp32 rotary tables on the training device, for every position the target serves."""
        config = self.target.config
        return RopeCache(config, head_dim, config.max_position_embeddings + 16, self.device, torch.float32)

    def final_state(self, batch: Batch) -> torch.Tensor:  # [B, T, H] the target's final-norm hidden state
        return self.target.final_norm(batch.hidden_states[:, :, self.options["layer_index"][0]])

    def unroll(self, batch: Batch, num_steps: int) -> tuple[list[torch.Tensor], torch.Tensor]:
        """(per step states [B, T, H], extra loss scalar)."""
        raise NotImplementedError

    def logits(self, step: int, rows: torch.Tensor) -> torch.Tensor:  # [N, H] -> [N, draft_vocab]
        raise NotImplementedError

    def max_steps(self) -> int | None:
        """The most draft steps this drafter can make (Medusa: its heads), None if unbounded."""
        return None

    def tensors(self) -> dict[str, torch.Tensor]:
        """Weights under their public names."""
        raise NotImplementedError

    def public_config(self) -> dict:
        raise NotImplementedError

    def export(self, out: Path, dtype: torch.dtype) -> None:
        out.mkdir(parents=True, exist_ok=True)
        tensors = {name: (t.to(dtype) if t.is_floating_point() else t).cpu().contiguous()
                   for name, t in self.tensors().items()}
        save_file(tensors, str(out / "model.safetensors.tmp"))
        (out / "model.safetensors.tmp").replace(out / "model.safetensors")
        (out / "config.json").write_text(json.dumps(self.public_config(), indent=1) + "\n")


def frozen(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().clone().requires_grad_(False)


def layer_tensors(layer: nn.Module, prefix: str, input_norm: bool = True) -> dict[str, torch.Tensor]:
    """A ``DecoderLayer``'s weights under Hugging Face Llama names (``input_norm=False``: EAGLE's layer 0)."""
    return layer_hf_tensors(layer, prefix, skip=() if input_norm else ("input_norm",))


class ChainTrainable(TrainableDrafter):
    """EAGLE, EAGLE-3 and MTP: one layer unrolled on its own outputs (training-time test).

    Step ``j`` at index ``p`` reads token ``p + 1 + j`` (the true token: a draft only counts
    when the drafts before it were right, and then it equals the truth in greedy data) and
    the previous step's output (step 0: the target's features at ``p``)."""

    def first_hidden(self, batch: Batch) -> torch.Tensor:  # [B, T, H]
        raise NotImplementedError

    def step(self, step: int, token_ids: torch.Tensor,  # [B, T]
             hidden: torch.Tensor, cache) -> torch.Tensor:  # [B, T, H] -> [B, T, H]
        raise NotImplementedError

    def extra_loss(self, step: int, out: torch.Tensor, batch: Batch) -> torch.Tensor:
        return out.new_zeros(())

    def unroll(self, batch: Batch, num_steps: int) -> tuple[list[torch.Tensor], torch.Tensor]:
        from .ttt import TTTCache

        cache, hidden = TTTCache(), self.first_hidden(batch)
        states, extra = [], hidden.new_zeros(())
        for j in range(num_steps):
            token_ids = shift_left(batch.token_ids, 1 + j)
            hidden = self.step(j, token_ids, hidden, cache)
            states.append(hidden)
            extra = extra + self.extra_loss(j, hidden, batch)
        return states, extra


def shift_left(x: torch.Tensor, n: int) -> torch.Tensor:
    """``x[:, p + n]`` at ``p`` (zeros past the end); x is [B, T, ...]."""
    out = torch.zeros_like(x)
    if n < x.shape[1]:
        out[:, :x.shape[1] - n] = x[:, n:]
    return out

"""``extract_hidden_states``: save the target's hidden states of every prompt, to train EAGLE drafters.

Configured as in vLLM::

    LLM(model=..., speculative_config={"method": "extract_hidden_states", "num_speculative_tokens": 1,
        "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": [1, 2, 3]}}},
        kv_transfer_config={"kv_connector": "ExampleHiddenStatesConnector", "kv_role": "kv_producer",
                            "kv_connector_extra_config": {"shared_storage_path": DIR}})

For each request, once its prompt has run, one safetensors file
``DIR/{request_id}.safetensors`` holds ``token_ids`` [num_prompt_tokens] and
``hidden_states`` [num_prompt_tokens, num_layers, hidden] (float32, or
``kv_connector_extra_config["hidden_states_dtype"]``): the inputs
of the listed target layers (id ``num_hidden_layers`` = the last layer's
output before the final norm; default: EAGLE-3's (2, L // 2, L - 3)).
The output's ``kv_transfer_params["hidden_states_path"]`` names the file.
As a producer, each request yields exactly one output token; it never drafts,
so ``num_speculative_tokens`` must be 1.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

import torch
from safetensors.torch import save_file

from ...validate import PREFIX
from ..interface import DraftBatch, ProposeBatch, Proposer, ProposerNeeds, register
from .eagle3 import aux_layer_ids


@register
class ExtractHiddenStatesProposer(Proposer):
    method = "extract_hidden_states"

    @dataclass
    class Options:
        draft_model_config: dict = field(default_factory=dict)

        def __post_init__(self) -> None:
            hf_config = self.draft_model_config.get("hf_config", {}) if isinstance(self.draft_model_config, dict) \
                else None
            if not isinstance(hf_config, dict) or set(self.draft_model_config) - {"hf_config"}:
                raise ValueError(f"{PREFIX}['draft_model_config'] must be {{'hf_config': {{...}}}}, got "
                                 f"{self.draft_model_config!r}")

    @classmethod
    def default_num_speculative_tokens(cls, options, model) -> int:
        return 1

    @classmethod
    def check_config(cls, config) -> None:
        if config.num_speculative_tokens != 1:
            raise ValueError(f"{PREFIX}['num_speculative_tokens']={config.num_speculative_tokens} is invalid: "
                             "extract_hidden_states produces one token per request and never drafts; use 1")

    def __init__(self, config, target):
        super().__init__(config, target)
        if target.kv_transfer is None:
            raise ValueError(f"{PREFIX}: method 'extract_hidden_states' needs kv_transfer_config="
                             "{'kv_connector': 'ExampleHiddenStatesConnector', 'kv_role': 'kv_producer', "
                             "'kv_connector_extra_config': {'shared_storage_path': DIR}}")
        hf_config = self.options.draft_model_config.get("hf_config", {})
        ids = aux_layer_ids(hf_config, target.hf_config.num_hidden_layers, f"{PREFIX}['draft_model_config']")
        self.needs = ProposerNeeds(aux_layer_ids=ids, prefix_cacheable=False)  # it saves every prompt row
        self.directory = target.kv_transfer.shared_storage_path
        self.dtype = getattr(torch, target.kv_transfer.hidden_states_dtype)
        self.directory.mkdir(parents=True, exist_ok=True)
        self._rows: dict[int, list[torch.Tensor]] = {}  # seq_id -> [num_rows, num_layers, hidden] chunks

    @torch.inference_mode()
    def propose(self, batch: ProposeBatch) -> DraftBatch:
        target = batch.target_hidden
        for i, seq in enumerate(target.seqs if target is not None else []):
            if seq.index != 0 or seq.kv_transfer_params is not None:
                continue  # one file per request (its n sequences share the prompt)
            start, first_row = target.starts[i], target.cu_num_tokens[i]
            end = min(start + target.cu_num_tokens[i + 1] - first_row, seq.num_prompt_tokens)
            if end > start:
                rows = slice(first_row, first_row + end - start)
                states = torch.stack([aux[rows] for aux in target.aux_hidden_states], dim=1)
                self._rows.setdefault(seq.seq_id, []).append(states.to(self.dtype).cpu())
            if end == seq.num_prompt_tokens:
                self._write(seq)
        return DraftBatch.from_lists([[] for _ in batch.seqs])

    def _write(self, seq) -> None:
        hidden = torch.cat(self._rows.pop(seq.seq_id), dim=0)  # [num_prompt_tokens, num_layers, hidden]
        name = re.sub(r"[^A-Za-z0-9._-]", "_", seq.request_id) + ".safetensors"
        path = self.directory / name
        tmp = path.with_suffix(".tmp")
        save_file({"token_ids": torch.tensor(seq.prompt_token_ids, dtype=torch.int64), "hidden_states": hidden},
                  str(tmp))
        os.replace(tmp, path)  # readers never see a half-written file
        seq.kv_transfer_params = {"hidden_states_path": str(path)}

    def on_finished(self, seq) -> None:
        self._rows.pop(seq.seq_id, None)

    def tracked_seq_ids(self) -> set[int]:
        return set(self._rows)

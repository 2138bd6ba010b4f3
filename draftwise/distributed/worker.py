"""A tensor-parallel worker: one rank's shard of the model, stepped by the driver's messages.

Ranks 1..N-1 run ``run_worker`` (in a process the ``mp`` executor starts with
``python -m draftwise.distributed.worker``, or in a Ray actor). It joins the
driver's group, builds its shard of the target (``build_model(tp=group)``),
then loops over the driver's messages (``TPGroup.broadcast_object``), each a
tuple that the driver's rank runs too, at the same time:

* ``("build", model, path)``: also build a shard of the model at ``path`` (a draft
  model with ``draft_tensor_parallel_size`` equal to the target's);
* ``("kv", num_blocks)``: allocate this rank's KV cache (its own KV heads) with
  the driver's number of blocks, so block ids mean the same slots everywhere;
* ``("forward", model, batch, aux_layer_ids, logit_rows)``: one paged forward of
  the batch (``[(token_ids, start, block_ids), ...]``), writing this rank's K/V,
  then, when ``logit_rows`` (an index tensor) is given, the vocab shard's logits
  of those rows of the hidden states, gathered on the driver: a step is one message;
* ``("logits_of", model, hidden)`` / ``("embed", model, token_ids)``: the
  lm_head / embedding on tensors the driver sends (prompt logprobs, drafters
  that share the target's);
* ``("stop",)``: leave the loop.

A worker never decides anything: the scheduler, the drafts and the sampling
stay on the driver. It exits when the driver stops it or its connection to the
driver closes (the driver died).
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from dataclasses import asdict, dataclass

import torch

from ..models.registry import build_model, load_config
from ..paged import ForwardInput, KVPool, PagedModel
from .group import TPGroup
from .shm_collectives import ShmCollectives

logger = logging.getLogger("draftwise")


@dataclass
class WorkerSpec:
    """What every rank needs to build its shard (JSON-serialisable)."""
    model_path: str
    dtype: str  # "float32" / "bfloat16" / "float16"
    device: str  # "cpu" / "cuda"
    max_model_len: int
    block_size: int
    num_threads: int  # torch threads of this rank
    shm_path: str | None = None  # the host's shared-memory collectives file (mp executor on CPU)
    shm_slot_bytes: int = 0

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype)

    def to_json(self) -> str:
        return json.dumps(asdict(self))


class Worker:
    def __init__(self, spec: WorkerSpec, group: TPGroup):
        self.spec, self.group = spec, group
        self.device = torch.device(spec.device if spec.device != "cuda" else f"cuda:{group.rank}")
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        config = load_config(spec.model_path)
        model = build_model(spec.model_path, config, spec.torch_dtype, self.device, spec.max_model_len, tp=group)
        self.models = {"target": model}
        self.paged: dict[str, PagedModel] = {}

    def loop(self) -> None:
        while True:
            message = self.group.broadcast_object()
            if message[0] == "stop":
                return
            getattr(self, "_" + message[0])(*message[1:])

    def _build(self, name: str, path: str) -> None:
        spec = self.spec
        self.models[name] = build_model(path, load_config(path), spec.torch_dtype, self.device, spec.max_model_len,
                                        tp=self.group)

    def _kv(self, num_blocks: int) -> None:
        pool = KVPool(self.spec.block_size, self.spec.torch_dtype, self.device)
        for name, model in self.models.items():
            pool.add(name, PagedModel.kv_cache_spec(model))
        pool.allocate_blocks(num_blocks)
        for name, model in self.models.items():
            self.paged[name] = PagedModel(model, pool.tensor(name), self.spec.block_size, self.device)

    @torch.inference_mode()
    def _forward(self, name: str, batch: list[tuple], aux_layer_ids: tuple[int, ...],
                 logit_rows: torch.Tensor | None) -> None:
        items = [ForwardInput(ids, start, blocks) for ids, start, blocks in batch]
        hidden, _, _ = self.paged[name].forward(items, aux_layer_ids)
        if logit_rows is not None:
            self.models[name].compute_logits(hidden[logit_rows.to(self.device)])

    @torch.inference_mode()
    def _logits_of(self, name: str, hidden: torch.Tensor) -> None:
        self.models[name].compute_logits(hidden.to(self.device))

    @torch.inference_mode()
    def _embed(self, name: str, token_ids: torch.Tensor) -> None:
        self.models[name].embed_tokens(token_ids.to(self.device))


def run_worker(spec: WorkerSpec, rank: int, world_size: int, host: str, port: int) -> None:
    """A worker's whole life: join, build, serve the driver's messages until ``stop``."""
    if "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(spec.num_threads)
    group = TPGroup.connect(host, port, rank, world_size, torch.device(spec.device))
    if spec.shm_path is not None:  # the driver is this process's parent: spin only while it lives
        parent = os.getppid()
        group.shm = ShmCollectives(spec.shm_path, rank, world_size, spec.shm_slot_bytes, create=False,
                                   alive=lambda: os.getppid() == parent)
    try:
        Worker(spec, group).loop()
    finally:
        group.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="a draftwise tensor-parallel worker (started by the engine)")
    parser.add_argument("--spec", required=True, help="WorkerSpec as JSON")
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world-size", type=int, required=True)
    parser.add_argument("--host", required=True)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format=f"%(asctime)s rank {args.rank} %(levelname)s %(message)s")
    run_worker(WorkerSpec(**json.loads(args.spec)), args.rank, args.world_size, args.host, args.port)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""``draftwise train-draft``: train a drafter on ``make-data`` output, evaluate, checkpoint, resume.

``train_draft(TrainOptions(...))``:

* loads the data and the target's frozen parts, checks they belong together (hidden
  size, vocabulary), picks the draft vocabulary (most frequent answer tokens),
* trains with AdamW (linear warm-up, cosine decay over the planned steps) on the
  target's own distribution: per draft step ``j`` a soft cross-entropy against the
  target's probabilities over the draft vocabulary (from the saved last-layer states;
  hard next-token labels if the data lacks them), weighted ``0.8 ** j`` as in EAGLE-3,
* after each epoch estimates acceptance on held-out samples (``evaluate``: greedy chain
  acceptance length at K = 1..eval_steps), writes the drafter in its public layout to
  ``out`` and ``out/trainer_state.pt`` (weights, optimizer, schedule, epoch, history).

``resume=True`` continues from ``trainer_state.pt`` exactly where the last finished epoch
left off (same data order, same schedule): an interrupted run resumed gives the weights
an uninterrupted run gives.
"""
from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from . import methods  # noqa: F401  (registers the trainable drafters)
from .dataset import Batch, Dataset, DraftVocab, batches, load_dataset, prefetched
from .evaluate import evaluate
from .precision import CHOICES as PRECISIONS
from .precision import autocast, use_bfloat16
from .trainable import TRAINERS, TargetParts, TrainableDrafter, shift_left

STATE = "trainer_state.pt"


@dataclass
class TrainOptions:
    method: str
    data: str
    out: str
    model: str | None = None  # default: the model named in the data's manifest
    epochs: int = 3
    lr: float = 5e-4
    batch_tokens: int = 4096
    ttt_steps: int = 4  # draft steps unrolled in training (chain drafters): the deepest K served
    eval_steps: int = 5
    draft_vocab_size: int = 8192  # the most it holds
    draft_vocab_coverage: float | None = None  # else: the fewest tokens covering this share of answers
    num_heads: int = 4  # medusa
    num_head_layers: int = 1  # medusa residual blocks per head
    held_out_fraction: float = 0.05
    warmup_steps: int = 50
    seed: int = 0
    resume: bool = False
    export_dtype: str = "bfloat16"
    precision: str = "auto"  # matrix products in float32 or bfloat16 (precision.py)
    device: str = "auto"  # cpu, cuda, cuda:N; auto: cuda where one is present
    aux_layer_ids: list[int] | None = None  # eagle3: the target layers it reads (default 2, L // 2, L - 3)
    extra: dict = field(default_factory=dict)

    def check(self) -> None:
        if self.method not in TRAINERS:
            raise ValueError(f"--method {self.method!r} is not trainable; choose one of {', '.join(sorted(TRAINERS))}")
        for name in ("epochs", "batch_tokens", "ttt_steps", "eval_steps", "num_heads", "num_head_layers"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be a positive integer, got {getattr(self, name)}")
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise ValueError(f"--lr must be a positive number, got {self.lr}")
        if not 0 <= self.held_out_fraction < 1:
            raise ValueError(f"--held-out-fraction must be in [0, 1), got {self.held_out_fraction}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"--precision must be one of {', '.join(PRECISIONS)}, got {self.precision!r}")
        if self.export_dtype not in ("bfloat16", "float16", "float32"):
            raise ValueError(f"--export-dtype must be bfloat16, float16 or float32, got {self.export_dtype!r}")
        self.torch_device()

    def torch_device(self) -> torch.device:
        """Where the drafter trains: ``auto`` is the first CUDA device where one is present, else the CPU."""
        if self.device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        try:
            device = torch.device(self.device)
        except RuntimeError:
            device = None
        if device is None or device.type not in ("cpu", "cuda"):
            raise ValueError(f"--device must be auto, cpu, cuda or cuda:N, got {self.device!r}")
        if device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"--device {self.device}: this machine has no CUDA device; use --device cpu")
        return device


def soft_targets(model: TrainableDrafter, target: TargetParts, data: Dataset, batch: Batch) -> torch.Tensor:
    """[B, T, draft_vocab] the target's probabilities over the draft vocabulary (renormalised) at
    the scored positions (zeros elsewhere), or [B, T] hard draft-id labels of the next token
    (-1: outside the draft vocabulary) when the data lacks layer L."""
    if target.num_layers not in data.layer_ids:
        return model.vocab.to_draft(shift_left(batch.token_ids, 1))
    rows = batch.loss_mask.nonzero(as_tuple=True)
    last = batch.hidden_states[:, :, data.layer_index(target.num_layers, "")][rows]  # [N, H]
    probs = torch.zeros(*batch.loss_mask.shape, model.vocab.size, device=last.device)
    probs[rows] = torch.softmax(target.final_norm(last) @ target.lm_head[model.vocab.draft_ids].T, dim=-1)
    return probs


def step_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of draft ``logits`` [N, V] against soft [N, V] or hard [N] labels (in fp32)."""
    logits = logits.float()
    if labels.dim() == 1:
        keep = labels >= 0
        return F.cross_entropy(logits[keep], labels[keep]) if keep.any() else logits.new_zeros(())
    return -(labels * F.log_softmax(logits, dim=-1)).sum(-1).mean() if len(labels) else logits.new_zeros(())


def batch_loss(model: TrainableDrafter, target: TargetParts, data: Dataset, batch: Batch,
               num_steps: int) -> tuple[torch.Tensor, float]:
    """(loss, step-0 top-1 agreement with the target on scored positions)."""
    with torch.no_grad(), torch.autocast(batch.token_ids.device.type, enabled=False):  # the target's in fp32
        labels = soft_targets(model, target, data, batch)
    states, loss = model.unroll(batch, num_steps)
    agree = 0.0
    for j, state in enumerate(states):
        b, p = shift_left(batch.loss_mask, 1 + j).nonzero(as_tuple=True)  # rows scored at step j
        logits = model.logits(j, state[b, p])
        loss = loss + 0.8 ** j * step_loss(logits, labels[b, p + 1 + j])
        if j == 0 and len(b):
            truth = model.vocab.to_draft(batch.token_ids[b, p + 2])
            agree = (logits.argmax(-1) == truth).float().mean().item()
    return loss, agree


def _schedule(optimizer, warmup: int, total: int):
    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))
    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def train_draft(opts: TrainOptions, on_epoch_end: Callable[[int, dict], None] | None = None) -> dict:
    """Train (or resume) to ``opts.epochs``; returns the summary written to ``out/train_log.json``."""
    run = _Run(opts)
    for epoch in range(run.first_epoch, opts.epochs):
        start = time.perf_counter()
        loss, agree = _train_epoch(run, epoch)
        result = {"epoch": epoch + 1, "train_loss": round(loss, 4), "train_step0_agreement": round(agree, 4),
                  "seconds": round(time.perf_counter() - start, 1)}
        if run.held_out:
            result["held_out"] = evaluate(run.model, run.held_out, opts.batch_tokens, opts.eval_steps)
        run.history.append(result)
        tqdm.write(json.dumps(result))
        run.save(epoch)
        if on_epoch_end is not None:
            on_epoch_end(epoch, result)
    return run.summary()


class _Run:
    """Everything one training run holds: data, target parts, drafter, optimizer, schedule, history."""

    def __init__(self, opts: TrainOptions):
        opts.check()
        self.opts, self.out = opts, Path(opts.out)
        saved = self._saved_state()
        self.data = load_dataset(opts.data)
        self.device = opts.torch_device()
        self.target = TargetParts.load(opts.model or self.data.manifest.get("model"), self.device)
        _check_match(self.data, self.target)
        self.train, self.held_out = self.data.split(opts.held_out_fraction, opts.seed)
        vocab_size = self.target.vocab_size
        if saved:
            vocab = DraftVocab(saved["draft_ids"], vocab_size)
        elif opts.draft_vocab_coverage is not None:
            vocab = DraftVocab.covering(self.train, opts.draft_vocab_coverage, opts.draft_vocab_size, vocab_size,
                                        self.held_out)
        else:
            vocab = DraftVocab.most_frequent(self.train, min(opts.draft_vocab_size, vocab_size), vocab_size)
        self.model = build(opts, self.data, self.target, vocab).to(self.device)
        self.num_steps = min(opts.ttt_steps, self.model.max_steps() or opts.ttt_steps)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=opts.lr, betas=(0.9, 0.95),
                                           weight_decay=0.0)
        per_epoch = len(batches(self.train, opts.batch_tokens, None))
        self.scheduler = _schedule(self.optimizer, opts.warmup_steps, per_epoch * opts.epochs)
        self.history, self.first_epoch = [], 0
        # a resumed run keeps the precision it started with (a new measurement could choose the other)
        self.bf16 = saved["bf16"] if saved and "bf16" in saved else use_bfloat16(opts.precision, self.device)
        if saved:  # a larger --epochs than before stretches the cosine to the new total
            self.model.load_state_dict(saved["model"])
            self.optimizer.load_state_dict(saved["optimizer"])
            self.scheduler.load_state_dict(saved["scheduler"])
            self.history, self.first_epoch = saved["history"], saved["epoch"] + 1

    def _saved_state(self) -> dict | None:
        path = self.out / STATE
        if self.opts.resume and not path.is_file():
            raise ValueError(f"--resume: {self.out} has no {STATE} to resume from")
        if not self.opts.resume and path.is_file():
            raise ValueError(f"--out {self.out} already holds a training run; pass --resume to continue it or "
                             "choose a new directory")
        if not self.opts.resume:
            return None
        saved = torch.load(path, weights_only=False, map_location="cpu")
        if saved["method"] != self.opts.method:
            raise ValueError(f"--resume: {self.out} holds a {saved['method']} run, not {self.opts.method}")
        return saved

    def summary(self) -> dict:
        return {"method": self.opts.method, "num_train_samples": len(self.train),
                "num_held_out_samples": len(self.held_out), "draft_vocab_size": self.model.vocab.size,
                "draft_vocab_coverage": round(self.model.vocab.coverage(self.train), 4),
                "held_out_draft_vocab_coverage":
                    round(self.model.vocab.coverage(self.held_out), 4) if self.held_out else None,
                "num_parameters": sum(p.numel() for p in self.model.parameters()),
                "precision": "bfloat16" if self.bf16 else "float32", "device": str(self.device),
                "history": self.history}

    def save(self, epoch: int) -> None:
        """The drafter in its public layout, the resumable state, and the log, each replaced atomically."""
        self.model.export(self.out, getattr(torch, self.opts.export_dtype))
        state = {"method": self.opts.method, "epoch": epoch, "model": self.model.state_dict(),
                 "optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict(),
                 "draft_ids": self.model.vocab.draft_ids, "history": self.history, "options": asdict(self.opts),
                 "bf16": self.bf16}
        torch.save(state, self.out / (STATE + ".tmp"))
        (self.out / (STATE + ".tmp")).replace(self.out / STATE)
        (self.out / "train_log.json").write_text(json.dumps(self.summary(), indent=1))


def build(opts: TrainOptions, data: Dataset, target: TargetParts, vocab: DraftVocab) -> TrainableDrafter:
    """A freshly initialised (seeded) trainable drafter reading ``data``'s layers."""
    cls = TRAINERS[opts.method]
    layer_ids = cls.needed_layers(target, asdict(opts))
    options = dict(asdict(opts), layer_ids=layer_ids, device=str(target.embed.device),
                   layer_index=[data.layer_index(i, f"--method {opts.method}") for i in layer_ids])
    torch.manual_seed(opts.seed)
    return cls(target, vocab, options)


def load_trained(out: str | Path, data: Dataset) -> TrainableDrafter:
    """The drafter of the training run saved in ``out`` (its ``trainer_state.pt``), to evaluate on ``data``."""
    saved = torch.load(Path(out) / STATE, weights_only=False, map_location="cpu")
    opts = TrainOptions(**dict(saved["options"], device="cpu"))
    target = TargetParts.load(opts.model or data.manifest.get("model"))
    model = build(opts, data, target, DraftVocab(saved["draft_ids"], target.vocab_size))
    model.load_state_dict(saved["model"])
    return model


def _train_epoch(run: _Run, epoch: int) -> tuple[float, float]:
    """One pass over the training samples in this epoch's seeded order: (mean loss, mean agreement)."""
    run.model.train()
    groups = batches(run.train, run.opts.batch_tokens, run.opts.seed + epoch)
    total_loss = total_agree = 0.0
    bar = tqdm(prefetched(groups, run.device), total=len(groups), desc=f"epoch {epoch + 1}/{run.opts.epochs}",
               dynamic_ncols=True)
    for n, batch in enumerate(bar, start=1):
        with autocast(run.bf16, run.device):
            loss, agree = batch_loss(run.model, run.target, run.data, batch, run.num_steps)
        run.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(run.model.parameters(), 1.0)
        run.optimizer.step()
        run.scheduler.step()
        total_loss, total_agree = total_loss + loss.item(), total_agree + agree
        bar.set_postfix(loss=f"{total_loss / n:.3f}", acc=f"{total_agree / n:.3f}")
    return total_loss / max(1, len(groups)), total_agree / max(1, len(groups))


def _check_match(data: Dataset, target: TargetParts) -> None:
    manifest = data.manifest
    for key, value in (("vocab_size", target.vocab_size), ("hidden_size", target.config.hidden_size),
                       ("num_hidden_layers", target.num_layers)):
        if manifest.get(key) != value:
            kind = " (vocabulary mismatch)" if key == "vocab_size" else ""
            raise ValueError(f"the data was made with a model whose {key} is {manifest.get(key)}, but the target "
                             f"{target.path} has {value}; make the data with the same model{kind}")

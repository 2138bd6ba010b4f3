"""Train the bundled model's EAGLE-3 head and keep the epoch with the best held-out acceptance.

``train-draft`` exports the head after every epoch, over the one before; this keeps, in
``--keep``, the export of the epoch whose held-out chained acceptance length at K = 3 is the highest
(``model.safetensors`` in pieces of at most 15 MB, so a device call can bring them back;
join with ``cat model.safetensors.part* > model.safetensors``) and ``meta.json`` (its
``config.json``, that epoch's figures, the training log). Used by ``scripts/device_drafter.sh
train``; runs on any device.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from draftwise.train.loop import TrainOptions, train_draft

PIECE = 15_000_000


def keep_export(head: Path, keep: Path, result: dict) -> None:
    for old in keep.glob("model.safetensors.part*"):
        old.unlink()
    data = (head / "model.safetensors").read_bytes()
    for n, first in enumerate(range(0, len(data), PIECE)):
        (keep / f"model.safetensors.part{n}").write_bytes(data[first:first + PIECE])
    write_meta(head, keep, {"config": json.loads((head / "config.json").read_text()), "best_epoch": result})


def write_meta(head: Path, keep: Path, update: dict) -> None:
    path = keep / "meta.json"
    meta = json.loads(path.read_text()) if path.is_file() else {}
    meta.update(update, train_log=json.loads((head / "train_log.json").read_text()))
    path.write_text(json.dumps(meta, indent=1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--data", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--keep", required=True)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--batch-tokens", type=int, default=4096)
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument("--draft-vocab-size", type=int, default=16384, help="the most (98%% coverage otherwise)")
    args = parser.parse_args()
    head, keep = Path(args.out), Path(args.keep)
    keep.mkdir(parents=True, exist_ok=True)
    best = {"score": -1.0}

    def on_epoch_end(epoch: int, result: dict) -> None:
        held_out = result.get("held_out", {})
        score = held_out.get("chain_acceptance_length", held_out.get("acceptance_length", {})).get("3", 0.0)
        if score > best["score"]:
            best["score"] = score
            keep_export(head, keep, result)
        write_meta(head, keep, {})
        print(json.dumps({"epoch": epoch + 1, "held_out_k3": score, "best": best["score"]}), flush=True)

    options = TrainOptions(method="eagle3", data=args.data, out=args.out, epochs=args.epochs, lr=args.lr,
                           batch_tokens=args.batch_tokens, ttt_steps=4, draft_vocab_size=args.draft_vocab_size,
                           draft_vocab_coverage=0.98, device=args.device)
    train_draft(options, on_epoch_end=on_epoch_end)


if __name__ == "__main__":
    main()

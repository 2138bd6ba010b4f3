"""Cut a make-data directory back to the answer chunks whose hidden states are all written.

``make-data`` writes record ``i``'s states to ``hidden/{i:07d}.safetensors`` in record order; after
an extraction pass that ran out of time, this keeps the leading chunks fully covered (rewriting
``answers.jsonl`` and ``progress.json``), so running ``make-data`` again finishes at once with a
smaller dataset. Used by ``scripts/device_drafter.sh``.

    python scripts/keep_extracted_chunks.py DATA_DIR
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from draftwise.train.make_data import hidden_file


def main(data: Path) -> None:
    records = [json.loads(line) for line in (data / "answers.jsonl").read_text().splitlines() if line.strip()]
    usable = [r for r in records if r["answer_token_ids"]]  # what make-data extracts, in its order
    written = 0
    while written < len(usable) and (data / hidden_file(written)).exists():
        written += 1
    # every chunk before the one holding the first record without states is whole
    chunks = usable[written]["chunk"] if written < len(usable) else 1 + max((r["chunk"] for r in records), default=-1)
    kept = [r for r in records if r["chunk"] < chunks]
    (data / "answers.jsonl").write_text("".join(json.dumps(r) + "\n" for r in kept))
    progress = json.loads((data / "progress.json").read_text())
    (data / "progress.json").write_text(json.dumps(dict(progress, chunks_done=chunks)))
    print(f"kept {chunks} chunks ({len(kept)} of {len(records)} records; {written} states written)")


if __name__ == "__main__":
    main(Path(sys.argv[1]))

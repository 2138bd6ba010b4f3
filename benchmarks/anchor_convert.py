"""Convert a GGUF file into a Hugging Face directory vLLM loads (run in the anchor venv).

    .venv-anchor/bin/python benchmarks/anchor_convert.py MODEL.gguf OUT_DIR

transformers de-quantizes the GGUF tensors (as draftwise's own converter does) and
``save_pretrained`` writes them with Hugging Face names; the quantizer and
``quantization_config`` are cleared first so vLLM sees plain weights. The tokenizer (with
its chat template) is saved beside them. Written to a temporary directory, then renamed.
"""
from __future__ import annotations

import shutil
import sys
from pathlib import Path

from transformers import AutoModelForCausalLM, AutoTokenizer


def main() -> None:
    gguf, out = Path(sys.argv[1]), Path(sys.argv[2])
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(tmp)
    AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(tmp)
    tmp.rename(out)


if __name__ == "__main__":
    main()

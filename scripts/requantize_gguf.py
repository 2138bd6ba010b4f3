"""Requantize a GGUF file with llama.cpp's own quantizer (llama-cpp-python's ``llama_model_quantize``).

    .venv-llamacpp/bin/python scripts/requantize_gguf.py IN.gguf OUT.gguf [--ftype Q4_0]

For comparisons on llama.cpp's strongest CPU path: the bundled SmolLM2 is Q4_1, which llama.cpp
does not repack for AVX2/AVX512, while Q4_0 and Q4_K are. Run it with the python of the venv
``make llamacpp`` builds; the output is a local file, never committed.
"""
from __future__ import annotations

import argparse
import sys

FTYPES = ("Q4_0", "Q4_1", "Q5_0", "Q8_0", "Q4_K_M", "Q5_K_M", "Q6_K")


def main() -> int:
    import llama_cpp

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source")
    parser.add_argument("out")
    parser.add_argument("--ftype", default="Q4_0", choices=FTYPES)
    args = parser.parse_args()
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{args.ftype}")
    params.allow_requantize = True  # the source's blocks are already quantized
    status = llama_cpp.llama_model_quantize(args.source.encode(), args.out.encode(), params)
    if status != 0:
        print(f"llama_model_quantize failed ({status})", file=sys.stderr)
    return int(status != 0)


if __name__ == "__main__":
    sys.exit(main())

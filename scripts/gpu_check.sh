#!/usr/bin/env bash
# Everything that needs a CUDA GPU, in one command, from the repository root:
#
#     bash scripts/gpu_check.sh
#
# 1. uses the active virtual environment, or creates/uses $KADJ_GPU_VENV (default
#    .venv, with system site packages) and installs kadj with its test and cuda
#    extras (plus cupy-cuda12x when it installs; its failure is ignored).  Without a
#    network, an environment that already has the dependencies is used as it is;
#    KADJ_GPU_OFFLINE=1 skips the installs (and the virtual environment) altogether
#    and uses ${PYTHON:-python3} with what it has;
# 2. GPU and PTX tests: tests/test_cuda_gpu.py tests/test_cuda_slots.py tests/test_cuda_ptx.py;
# 3. scripts/bench_cuda.py --size large (table; JSON into the results folder);
# 4. perf/test_bench_cuda.py (pytest-benchmark; JSON into the results folder), and
#    scripts/bench_cuda_gallery.py (every gallery kernel's adjoint/forward);
# 5. the tape tests: tests/test_buffer_pool.py on the GPU (KADJ_BUFFER_POOL_GPU=1), and
#    tests/test_tape_device.py, tests/test_tape_streams.py, tests/test_checkpointed_cuda.py
#    (these run their cases in the CUDA simulator, in a subprocess, on any machine);
# 6. scripts/bench_tape.py --cuda (tape overhead per CUDA launch, heat gradient with
#    checkpointing on the device; table into the results folder).
#
# Every step runs even when an earlier one fails; the exit status is 1 when any failed.
# Results go to $KADJ_RESULTS_DIR (default: $OUT when set, else /tmp/kadj-gpu-check).
# Each step has a time limit (15 minutes in all at worst); about 6 minutes on an H200
# once the packages are installed.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
RESULTS="${KADJ_RESULTS_DIR:-${OUT:-/tmp/kadj-gpu-check}}"
mkdir -p "$RESULTS"
failed=()

step() {  # step NAME TIMEOUT_S CMD...: run, report, remember failures
    local name=$1 limit=$2
    shift 2
    echo
    echo "=== $name: $*"
    local start=$SECONDS rc=0
    timeout "$limit" "$@" || rc=$?
    echo "=== $name: exit $rc after $((SECONDS - start)) s"
    if [ "$rc" -ne 0 ]; then failed+=("$name (exit $rc)"); fi
}

if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
else
    echo "nvidia-smi not found"
fi

# ---- environment -------------------------------------------------------------------
if [ "${KADJ_GPU_OFFLINE:-0}" = "1" ]; then
    bin_dir=$(mktemp -d)          # "python" (also under timeout) is ${PYTHON:-python3}
    printf '#!/bin/sh\nexec "%s" "$@"\n' "$(command -v "${PYTHON:-python3}")" \
        > "$bin_dir/python"
    chmod +x "$bin_dir/python"
    export PATH="$bin_dir:$PATH"
else
    if [ -z "${VIRTUAL_ENV:-}" ]; then
        VENV="${KADJ_GPU_VENV:-.venv}"
        if [ ! -x "$VENV/bin/python" ]; then
            "${PYTHON:-python3}" -m venv --system-site-packages "$VENV"
        fi
        # shellcheck disable=SC1091
        source "$VENV/bin/activate"
    fi
    install_rc=0
    timeout 120 python -m pip install --disable-pip-version-check --retries 1 --timeout 20 \
        -q -e ".[test,cuda]" || install_rc=$?
    if [ "$install_rc" -ne 0 ]; then
        echo "pip install -e .[test,cuda] failed (exit $install_rc); checking the environment"
    fi
    timeout 60 python -m pip install --disable-pip-version-check --retries 1 --timeout 20 \
        -q cupy-cuda12x || echo "cupy-cuda12x not installed (the CuPy test will be skipped)"
fi
echo "python: $(command -v python) ($(python --version 2>&1))"
if ! python -c "import numba.cuda, numpy, pytest, pytest_benchmark, hypothesis" ; then
    echo "FAILED: the test dependencies are missing and could not be installed"
    exit 1
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"   # kadj from this checkout
python -c "import kadj, numba, numba.cuda as c; print('kadj', kadj.__file__); \
print('numba', numba.__version__, '| GPU available:', c.is_available())"

# ---- checks --------------------------------------------------------------------------
step "GPU and PTX tests" 120 \
    python -m pytest -q tests/test_cuda_gpu.py tests/test_cuda_slots.py tests/test_cuda_ptx.py
step "benchmark table" 90 \
    python scripts/bench_cuda.py --size large --require-gpu --json "$RESULTS/bench_cuda.json"
step "pytest-benchmark" 90 \
    python -m pytest -q perf/test_bench_cuda.py --benchmark-json "$RESULTS/bench_pytest.json"
step "gallery benchmark" 600 \
    python scripts/bench_cuda_gallery.py --require-gpu --budget 540 \
    --json "$RESULTS/bench_cuda_gallery.json"
step "buffer pool on the GPU" 90 \
    env KADJ_BUFFER_POOL_GPU=1 python -m pytest -q tests/test_buffer_pool.py
step "tape tests (CUDA simulator)" 120 \
    python -m pytest -q tests/test_tape_device.py tests/test_tape_streams.py \
    tests/test_checkpointed_cuda.py
step "tape benchmark on the GPU" 180 \
    bash -c 'set -o pipefail; python scripts/bench_tape.py --cuda --repeat 2 \
    | tee "$1/bench_tape_cuda.md"' _ "$RESULTS"

echo
if [ "${#failed[@]}" -ne 0 ]; then
    echo "FAILED steps:"
    printf '  %s\n' "${failed[@]}"
    exit 1
fi
echo "all GPU checks passed; results in $RESULTS"

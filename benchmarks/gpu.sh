#!/usr/bin/env bash
# Every GPU benchmark in one go, for a machine with one NVIDIA GPU and a Python that has torch,
# transformers, peft and sentencepiece (modsent's own environment, or an image that holds them):
#
#   bash benchmarks/gpu.sh RESULTS_DIR [PYTHON]
#
# Each benchmark writes RESULTS_DIR/<name>_<gpu>.txt and runs under its own time limit, so one
# failure does not lose the others. Wheels in .whl/ (e.g. ctranslate2, pycountry for Python 3.12)
# are installed into a private directory first when the environment lacks them.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT_DIR="${1:?usage: bash benchmarks/gpu.sh RESULTS_DIR [PYTHON]}"
PY="${2:-python3}"
mkdir -p "$OUT_DIR"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" TOKENIZERS_PARALLELISM=false
if ls .whl/*.whl >/dev/null 2>&1; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        && export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi
GPU="$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tr -c 'A-Za-z0-9\n' '-' | sed 's/-*$//')"
{
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
    "$PY" -c 'import sys, torch, transformers, peft; print(sys.version.split()[0], "torch", torch.__version__,
"cuda", torch.version.cuda, "transformers", transformers.__version__, "peft", peft.__version__)'
} 2>&1 | tee "$OUT_DIR/environment_$GPU.txt"

bench() {  # bench NAME SECONDS ARGS...: one benchmark, its output kept whatever happens
    local name="$1" limit="$2"
    shift 2
    echo "== $name: $*"
    { echo "# $*"; timeout "$limit" "$PY" "$@" 2>&1 | grep -v -e 'it/s\]' -e '^\s*warnings.warn'; } \
        | tee "$OUT_DIR/${name}_$GPU.txt"
}

bench mlm_throughput 150 benchmarks/mlm_throughput.py --labse-random --device cuda --seq-len 256 \
    --batch-size 128 --steps 10 --compile
bench mlm_throughput_b64 90 benchmarks/mlm_throughput.py --labse-random --device cuda --seq-len 128 256 \
    --batch-size 64 --steps 10
bench pair_throughput 120 benchmarks/pair_throughput.py --labse-random --device cuda --seq-len 128 \
    --batch-size 128 --steps 40 --warmup 10
bench profile_steps 120 -m benchmarks.profile_steps --device cuda --steps 5 --top 12
bench mexma_throughput 90 benchmarks/mexma_throughput.py --size base --device cuda --seq-len 128 256 --steps 10
# CTranslate2's wheels are built for CUDA 12; where only CUDA 13's cuBLAS is present the script
# points CTranslate2 at it (same C API for what it calls), and says so in the output.
if ! "$PY" -c 'import ctypes; ctypes.CDLL("libcublas.so.12")' 2>/dev/null; then
    lib="$(dirname "$(find /opt /usr /lib -name 'libcublas.so.13*' 2>/dev/null | head -1)")"
    if [ -n "$lib" ] && [ -e "$lib/libcublas.so.13" ]; then
        mkdir -p /tmp/cublas12
        ln -sf "$lib/libcublas.so.13" /tmp/cublas12/libcublas.so.12
        ln -sf "$lib/libcublasLt.so.13" /tmp/cublas12/libcublasLt.so.12
        export LD_LIBRARY_PATH="/tmp/cublas12:$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
        echo "note: no libcublas.so.12; CTranslate2 uses CUDA 13's cuBLAS from $lib" | tee -a "$OUT_DIR/environment_$GPU.txt"
    fi
fi
bench translation_speed 200 benchmarks/translation_speed.py --size 600M --device cuda --units 512 \
    --batch-size 64 --tokens 32 --ct2-compute-types bfloat16,int8_bfloat16

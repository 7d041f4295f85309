#!/usr/bin/env bash
# Every GPU benchmark in one go, for a machine with one NVIDIA GPU and a Python that has torch,
# transformers, peft and sentencepiece (modsent's own environment, or an image that holds them):
#
#   bash benchmarks/gpu.sh RESULTS_DIR [PYTHON]
#   BENCHMARKS="tests mlm_throughput" DEADLINE=500 bash benchmarks/gpu.sh RESULTS_DIR
#
# Each benchmark writes RESULTS_DIR/<name>_<gpu>.txt and runs under its own time limit, so one
# failure does not lose the others. Wheels in .whl/ (pycountry for Python 3.12), .whl-translation/
# (CTranslate2) and, from .whl/workflow, the ones modsent imports that such an image lacks (jsonschema,
# the built-in data's packages: for the tests block) go into a private directory first, after the
# image's own packages on the path (benchmarks/gpu_wheels.sh downloads them).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT_DIR="${1:?usage: bash benchmarks/gpu.sh RESULTS_DIR [PYTHON]}"
PY="${2:-python3}"
mkdir -p "$OUT_DIR"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" TOKENIZERS_PARALLELISM=false
WHEELS=()
for wheel in .whl/*.whl .whl-translation/*.whl .whl/workflow/{jsonschema,jsonschema_specifications,referencing,rpds_py,babel,django,django_allauth,asgiref,sqlparse}-*.whl; do
    [ -e "$wheel" ] && WHEELS+=("$wheel")
done
if ((${#WHEELS[@]})); then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "${WHEELS[@]}" \
        && export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi
GPU="$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tr -c 'A-Za-z0-9\n' '-' | sed 's/-*$//')"
{
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
    "$PY" -c 'import sys, torch, transformers, peft; print(sys.version.split()[0], "torch", torch.__version__,
"cuda", torch.version.cuda, "transformers", transformers.__version__, "peft", peft.__version__)'
} 2>&1 | tee "$OUT_DIR/environment_$GPU.txt"

# BENCHMARKS="name ..." runs only those (default: all, in this order); DEADLINE=SECONDS stops
# starting benchmarks that would outlast it (each one's limit is cut to what is left).
WANT=" ${BENCHMARKS:-triton_kernels mlm_triton tests_kernels profile_la_triton pair_throughput_triton mexma_triton vocab_loss workflow_triton recipe_throughput recipe_throughput_xxl tests mlm_fused la_graphs profile_la_fused mlm_fused_128 mlm_throughput mlm_throughput_graphs workflow mlm_throughput_outside profile_la_compiled mlm_throughput_compiled mlm_throughput_b64 pair_throughput_compiled_cla pair_throughput_compiled pair_throughput pair_throughput_b256 pair_throughput_strata pair_pipeline pair_throughput_graphs encode_throughput profile_steps mexma_throughput mexma_throughput_compiled translation_speed translation_batching translation_batching_int8 translation_speed_3.3B} "
DEADLINE="${DEADLINE:-100000}"

bench() {  # bench NAME SECONDS ARGS...: one benchmark, its output kept whatever happens
    local name="$1" limit="$2" left
    shift 2
    [[ "$WANT" == *" $name "* ]] || return 0
    left=$((DEADLINE - SECONDS))
    if ((left < 20)); then echo "== $name: skipped, ${left}s left"; return 0; fi
    ((limit > left)) && limit=$left
    echo "== $name (${limit}s at most): $*"
    { echo "# $*"; timeout "$limit" "$PY" "$@" 2>&1 | grep -v -e 'it/s\]' -e '^\s*warnings.warn'; } \
        | tee "$OUT_DIR/${name}_$GPU.txt"
}

# modsent's Triton kernels (modsent.training.kernels): each LoRA layer's dropout drawn inside its products
# (fastpath.fuse_lora_dropout: an attention's query, key and value through one kernel each way, and each layer
# alone), dropout + residual add + LayerNorm as one kernel each way (fastpath.fuse_residual_norms(kernel="triton"))
# and the MLM loss's cross-entropy (fastpath.fuse_cross_entropy): each alone against the eager layers (checked
# against them with the kernels' masks, then timed; other tiles), the LA step with them, their CUDA tests, the step's
# profile, and the SE step (host-bound at 128 pairs, where a Python autograd function may cost more than the
# launches it saves)
bench triton_kernels 120 benchmarks/triton_kernels.py --device cuda --tiles 128x8x8/64x8x4 32x8x4/32x8x4x4 \
    64x8x8/32x8x8x4 --qkv-tiles 64x8x8/32x8x8 32x4x8/16x8x4 --norm-tiles 2x4 8x8 1x4 --ce-tiles 4096x8 1024x4
bench mlm_triton 230 benchmarks/mlm_throughput.py --labse-random --device cuda --seq-len 256 --batch-size 128 \
    --steps 10 --repeats 2 --bf16-residual --triton --only "masked, bf16, fused, fast, bf16 residual" \
    "masked, bf16, fused, fast, Triton LoRA, bf16 residual" "masked, bf16, fused, fast, Triton LoRA alone, bf16 residual" \
    "masked, bf16, fused, fast, Triton norms, bf16 residual" \
    "masked, bf16, fused, fast, Triton cross-entropy, bf16 residual" \
    "masked, bf16, fused, fast, Triton LoRA, norms and cross-entropy, bf16 residual" "masked, bf16, fused, fast" \
    "masked, bf16, fused, fast, Triton LoRA, norms and cross-entropy"
bench tests_kernels 120 -m pytest -q -p no:cacheprovider tests/test_kernels.py tests/test_vocab_loss.py
bench profile_la_triton 120 -m benchmarks.profile_steps --device cuda --steps 5 --top 16 --stages LA \
    --bf16-residual --triton
# methods.MEXMA.kernels: triton: the cross-unmasking loss's cross-entropy over XLM-R's 250,002 words as Triton's
# kernel (about 6,500 masked positions a step at 64 pairs of 128 tokens: the eager loss's fp32 copies are GBs), and
# methods.MEXMA.loss_chunk_rows: the loss 2,048 positions at a time, no logits kept (eager and Triton), and
# methods.MEXMA.gradient_checkpointing (alone and with the chunks), each with its peak memory
bench mexma_triton 180 benchmarks/mexma_throughput.py --size base --device cuda --seq-len 128 --steps 10 --triton \
    --loss-chunk-rows 2048 --gradient-checkpointing
# the cross-unmasking loss alone at 6,451 masked positions x 250,002 words: whole against chunks, eager and Triton
bench vocab_loss 90 benchmarks/vocab_loss.py --device cuda --chunk-rows 1024 2048 4096 --triton
bench pair_throughput_triton 150 benchmarks/pair_throughput.py --labse-random --device cuda --seq-len 128 \
    --batch-size 128 --steps 40 --warmup 10 --stages SE --rounds 3 --triton --only "bf16, random, fast" \
    "bf16, Triton"
# the recipes' and the full baselines' training steps, each through its own run_training (never measured on a
# GPU): m-ST5 on a random mt5-large encoder, DuEAM (every weight) and InteMATs-ST (serial adapters) on a random
# XLM-R base, Full_c on a random LaBSE; fp32 beside bf16 autocast and length_groups 4; pairs/s, MFU, memory, padding
recipe_block() {  # recipe_block NAME SECONDS ARGS...: bench with modsent's pinned stack (.whl/workflow) first on the
    # path: the recipes load their models through modsent's transformers and sentence-transformers, as their jobs do
    [[ "$WANT" == *" $1 "* ]] || return 0
    if [ ! -d .whl/workflow ]; then
        echo "== $1: skipped: carry .whl with its workflow wheels (bash benchmarks/gpu_wheels.sh)"; return 0
    fi
    local saved="$PYTHONPATH" site
    # the same install as the workflow block's (gpu_workflow.install: one place for the pinned stack)
    site="$("$PY" -c 'import sys; from pathlib import Path; sys.path.insert(0, "benchmarks"); import gpu_workflow
print(gpu_workflow.install([Path(".whl/workflow")]))')" \
        || { echo "== $1: skipped: pip could not install .whl/workflow"; return 0; }
    export PYTHONPATH="$PWD:$site:${PYTHONPATH#"$PWD:"}"
    bench "$@"
    export PYTHONPATH="$saved"
}
recipe_block recipe_throughput 300 benchmarks/recipe_throughput.py --device cuda --size paper --steps 10 --warmup 3 \
    --length-groups 4
# m-ST5 on the paper's mt5-xxl encoder (5.7B, frozen in bf16, gradient checkpointing: configs/mst5.yaml), 128
# triplets a step: its speed at NLI-like lengths, and with texts of 6 sentences (near the 128-token limit) the
# peak memory that config estimates for the worst case at ~50 GB (not yet measured)
recipe_block recipe_throughput_xxl 300 benchmarks/recipe_throughput.py --device cuda --size paper --mst5 xxl \
    --checkpointing --recipes mST5-xnli --variants auto --steps 5 --warmup 2 --join 1 6
# the fast path's, mixed precision's and the no-wait steps' tests on this GPU (their CUDA cases run only where
# there is one; MEXMA's CPU test of checkpointing with Inductor left out, its GPU one kept)
bench tests 150 -m pytest -q -p no:cacheprovider tests/test_fastpath.py tests/test_kernels.py tests/test_optim.py tests/test_precision.py tests/test_tokenizing.py \
    tests/test_training_loop.py tests/test_mexma.py -k "not two_processes and not workflow and not with_compile_trains"
bench mlm_throughput 150 benchmarks/mlm_throughput.py --labse-random --device cuda --seq-len 128 256 \
    --batch-size 128 --steps 10 --bf16-residual
# fewer, fuller kernels for the LA with its products and attention eager: one product for each attention's
# query, key and value (fastpath.fuse_projections) and dropout + residual add + LayerNorm compiled into one
# kernel each way (fastpath.fuse_residual_norms); on an H200 (2026-12-04) 0.98x and 0.84x the eager step
bench mlm_fused 200 benchmarks/mlm_throughput.py --labse-random --device cuda --seq-len 256 --batch-size 128 \
    --steps 10 --repeats 2 --bf16-residual --fused --only "masked, bf16, fused, fast, bf16 residual" \
    "masked, bf16, fused, fast, fused projections, bf16 residual" "masked, bf16, fused, fast, fused norms, bf16 residual" \
    "masked, bf16, fused, fast, fused norms and projections, bf16 residual" "masked, bf16, fused, fast" \
    "masked, bf16, fused, fast, fused norms and projections"
# what torch.compile makes of the LA's encoder on this GPU (the attention kernel in the graphs, fp32 products,
# what the graphs keep for the backward against the eager step): why the compiled and graphed LA lost
bench la_graphs 120 -m benchmarks.la_graphs --device cuda --layers 12 --batch-size 128 --seq-len 256 --bf16-residual
bench profile_la_fused 150 -m benchmarks.profile_steps --device cuda --steps 5 --top 16 --stages LA --bf16-residual --fused
bench mlm_fused_128 150 benchmarks/mlm_throughput.py --labse-random --device cuda --seq-len 128 --batch-size 128 \
    --steps 10 --repeats 2 --bf16-residual --fused --only "masked, bf16, fused, fast, bf16 residual" \
    "masked, bf16, fused, fast, fused norms and projections, bf16 residual"
# the LA's encoder replayed as CUDA graphs of its eager kernels (cudagraphs backend, no Inductor): how
# much of the eager step is the host launching its ~1,500 kernels (the GPU was busy 80% of it, profiled)
bench mlm_throughput_graphs 150 -X faulthandler benchmarks/mlm_throughput.py --labse-random --device cuda --seq-len 256 \
    --batch-size 128 --steps 10 --repeats 2 --graphs --bf16-residual --only "masked, bf16, fused, fast, bf16 residual" \
    "masked, bf16, fused, fast, graphs, bf16 residual"
# the tests' whole-DAG workflow with every training and encoding job on this GPU: the CPU rules' outputs
# prepared beforehand (python benchmarks/gpu_workflow.py prepare .gpu-workflow, carried with the wheels of
# .whl/workflow: Snakemake and modsent's pinned transformers stack, which the GPU image lacks); Snakemake
# is stopped in time for the script to report what ran
workflow_block() {  # workflow_block NAME ARGS...: a run of at most 300 s, Snakemake stopped 50 s before its end
    local name="$1" left stop
    shift
    left=$((DEADLINE - SECONDS)); ((left > 300)) && left=300
    stop=$((left - 50)); ((stop < 10)) && stop=10
    bench "$name" 300 benchmarks/gpu_workflow.py run .gpu-workflow --wheels .whl/workflow --time-limit "$stop" "$@"
}
if [ -d .gpu-workflow ] && [ -d .whl/workflow ]; then
    workflow_block workflow
    # the same with the LA's Triton kernels (language_adapter.kernels: triton, a runtime setting: the
    # prepared jobs stay done): the stage's path to them on a GPU, and what its jobs logged of them
    workflow_block workflow_triton --set language_adapter.kernels=triton
elif [[ "$WANT" == *" workflow "* || "$WANT" == *" workflow_triton "* ]]; then
    echo "== workflow: skipped: prepare .gpu-workflow (python benchmarks/gpu_workflow.py prepare .gpu-workflow) and carry it with .whl/workflow"
fi
# the LA compiled with its attention kept out of the graphs (fastpath.attention_outside_graph): the
# eager step's attention kernel, Inductor fusing the element-wise work between the products
bench mlm_throughput_outside 150 benchmarks/mlm_throughput.py --labse-random --device cuda --seq-len 256 \
    --batch-size 128 --steps 10 --repeats 2 --compile --bf16-residual --only "masked, bf16, fused, fast" \
    "masked, bf16, fused, fast, bf16 residual" "masked, bf16, fused, fast, compiled, attention outside, bf16 residual"
# the LA step's kernels with the bf16 stream, eager and compiled whole (which lost, 0.83x: which
# attention kernel the graph runs, what is left unfused)
bench profile_la_compiled 160 -m benchmarks.profile_steps --device cuda --steps 5 --top 16 --stages LA \
    --bf16-residual --compile whole
# the LA under torch.compile (the fast path traces into one graph): Inductor fusing the element-wise
# residual stream the LA step is bound by, against the eager step in the same run
bench mlm_throughput_compiled 240 benchmarks/mlm_throughput.py --labse-random --device cuda --seq-len 256 \
    --batch-size 128 --steps 10 --compile --bf16-residual
bench mlm_throughput_b64 90 benchmarks/mlm_throughput.py --labse-random --device cuda --seq-len 128 256 \
    --batch-size 64 --steps 10
# sentence_adapter.compile / alignment.compile: the pair steps' encoder under plain torch.compile (fewer,
# fused kernels for the launch-bound step at 128 pairs), beside the eager step of the same run
# (SE alone with every variant took up to 195 s on an H200: here the ones to compare, SE and CLA)
bench pair_throughput_compiled 260 benchmarks/pair_throughput.py --labse-random --device cuda --seq-len 128 \
    --batch-size 128 --steps 40 --warmup 20 --compile --rounds 3 \
    --only "bf16, random, fast" "bf16, grouped, fast" "bf16, fast, cuDNN" "bf16, fast, compiled"
# the CLA alone (its compiled step never measured on a GPU: the run above ran out of time while compiling,
# and so did this block in 170 s on 2026-12-04; it prints how long its warm-up and compilation took)
bench pair_throughput_compiled_cla 300 benchmarks/pair_throughput.py --labse-random --device cuda --seq-len 128 \
    --batch-size 128 --steps 40 --warmup 20 --compile --rounds 3 --stages CLA \
    --only "bf16, random, fast" "bf16, fast, cuDNN" "bf16, fast, compiled"
# three rounds, the variants in turn: the step at 128 pairs is bound by the host, whose speed drifts
# (one variant ran at 2,481 and 1,709 pairs/s in two runs on one H200); SE and CLA took ~150 s each
bench pair_throughput 330 benchmarks/pair_throughput.py --labse-random --device cuda --seq-len 128 \
    --batch-size 128 --steps 40 --warmup 10 --bf16-residual --rounds 3
bench pair_throughput_b256 120 benchmarks/pair_throughput.py --labse-random --device cuda --seq-len 128 \
    --batch-size 256 --steps 20 --warmup 5
# length_groups as the stages group (each pair ranked by length within its dataset) beside random batches
# and grouping by length alone, on the tests' fixture of short names and long sentences, labelled by dataset
bench pair_throughput_strata 200 benchmarks/pair_throughput.py --labse-random --device cuda --seq-len 128 \
    --batch-size 128 --steps 40 --warmup 20 --two-datasets --rounds 3 \
    --only "bf16, random, fast" "bf16, grouped, fast" "bf16, strata, fast"
# the host's share of the SE step and of evaluation encoding: lean tokenising, ahead on a thread, the
# loss read at logged steps only, the padding mask decided on the host, results copied back without waiting
bench pair_pipeline 150 benchmarks/pair_pipeline.py --labse-random --device cuda --batch-size 128 --steps 40 \
    --repeats 3 --encode-sentences 16384 --encode-batch 512
# CUDA graphs for the launch-bound pair steps at 128 pairs: torch.compile's reduce-overhead mode, one graph per
# padded width (multiples of 16 keep them few), beside the eager step of the same run (padded the same way)
bench pair_throughput_graphs 300 benchmarks/pair_throughput.py --labse-random --device cuda --seq-len 128 \
    --batch-size 128 --steps 40 --warmup 20 --pad-multiple 16 --compile --compile-mode reduce-overhead \
    --bf16-residual --only "bf16, random, fast" "bf16, fast, bf16 res." "bf16, fast, graphs"
# evaluation encoding by batch size through the evaluation's loop (no waits: host mask, copies behind the kernels)
bench encode_throughput 120 benchmarks/encode_throughput.py --labse-random --device cuda --batch-size 64 512 \
    --sentences 8000
bench profile_steps 150 -m benchmarks.profile_steps --device cuda --steps 5 --top 12 --bf16-residual
bench mexma_throughput 90 benchmarks/mexma_throughput.py --size base --device cuda --seq-len 128 256 --steps 10
# methods.MEXMA.compile: the same step with the body compiled (and the eager steps beside it), and with
# gradient_checkpointing too (the body compiled again with its dropout by eager's kernels, as the trainer does)
bench mexma_throughput_compiled 300 benchmarks/mexma_throughput.py --size base --device cuda --seq-len 128 \
    --steps 10 --compile --gradient-checkpointing
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
# translation.batch_tokens: a token budget beside the fixed 64 sentences, each batch generating
# as many tokens as its longest source
bench translation_batching 200 benchmarks/translation_speed.py --size 600M --device cuda --units 1024 \
    --batch-size 64 --batch-tokens 4096 --max-sentences 256 --tokens source --ct2-compute-types bfloat16
# the same with CTranslate2's int8 weights beside bf16 (int8 gave the most at 32 tokens a sentence)
bench translation_batching_int8 220 benchmarks/translation_speed.py --size 600M --device cuda --units 1024 \
    --batch-size 64 --batch-tokens 4096 --max-sentences 256 --tokens source --ct2-compute-types bfloat16,int8_bfloat16
bench translation_speed_3.3B 300 benchmarks/translation_speed.py --size 3.3B --device cuda --units 512 \
    --batch-size 64 --tokens 32 --ct2-compute-types bfloat16,int8_bfloat16

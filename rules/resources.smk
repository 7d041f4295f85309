# Compute resources of every rule, declared in one place.
#
# Each rule names the kind of job it is and takes that kind's resources and threads, as in
#
#     threads: job_threads("gpu_train")
#     resources:
#         **job_resources("gpu_train"),
#
# The keys are those of Snakemake and its SLURM executor plugin: `gpu` (sbatch --gpus=N, or
# --gpus=MODEL:N with `gpu_model`), `cpus_per_gpu`, `mem_mb` (--mem), `runtime` (minutes, -t).
# CPU jobs get --cpus-per-task from the rule's threads. Partition and account come from the
# profile (slurm/config.yaml); a config's `resources:` section (below) overrides a kind.
# Without SLURM (`snakemake --cores N`) only threads matter, and `--resources gpu=1` keeps
# GPU jobs from sharing a local GPU.

# kind: GPUs, CPU cores (the threads of a rule that uses them), memory in MB and runtime in
# minutes for the first attempt. Sized for the paper's runs (LaBSE / mE5-base, 200K LA steps,
# NLLB-200 3.3B); the demo and the tests use a fraction of them.
RESOURCE_CLASSES = {
    # LA (MLM), SE (MNRL) and CLA training: one GPU, data loading and tokenisation on CPUs
    "gpu_train": {"gpu": 1, "cpus": 8, "mem_mb": 32000, "runtime": 24 * 60},
    # NLLB / M2M100 translation of one shard (bf16 on the GPU; the checkpoint loads in RAM)
    "gpu_translate": {"gpu": 1, "cpus": 8, "mem_mb": 48000, "runtime": 12 * 60},
    # a forward pass over a fixed set of sentences (the frozen English encoder)
    "gpu_encode": {"gpu": 1, "cpus": 4, "mem_mb": 16000, "runtime": 2 * 60},
    # data preparation, merges, summaries, plots
    "cpu": {"gpu": 0, "cpus": 1, "mem_mb": 8000, "runtime": 2 * 60},
    # tokenizer training, fastText, FOCUS, model download and conversion: 10M-line corpora
    "cpu_heavy": {"gpu": 0, "cpus": 8, "mem_mb": 32000, "runtime": 8 * 60},
}

# A retried job (profile: retries) asks for more than the attempt before: memory × attempt
# (an out-of-memory kill is the usual reason), runtime × RUNTIME_GROWTH per attempt up to
# MAX_RUNTIME (most clusters cap a job at 2 days; training and translation resume from their
# checkpoints, so a timed-out job continues where it stopped).
RUNTIME_GROWTH = 1.5
MAX_RUNTIME = 48 * 60


def resource_class(kind):
    """The class `kind` with the config's overrides (`resources: {kind: {key: value}}`) applied.

    Override keys: gpu, cpus, mem_mb, runtime, max_runtime, and any other resource the SLURM
    plugin reads (slurm_partition, slurm_account, constraint, gpu_model, qos, slurm_extra)."""
    if kind not in RESOURCE_CLASSES:
        raise WorkflowError(
            f"unknown resource kind {kind!r}; known: {', '.join(RESOURCE_CLASSES)}"
        )
    values = {"max_runtime": MAX_RUNTIME, **RESOURCE_CLASSES[kind]}
    values.update((config.get("resources") or {}).get(kind) or {})
    return values


def job_threads(kind):
    """The thread count of a rule of `kind` (Snakemake caps it at --cores when run locally)."""
    return int(resource_class(kind)["cpus"])


def _grows_with_attempt(base, factor, cap=None):
    """mem_mb / runtime as a callable of (wildcards, attempt): base × factor(attempt), capped."""

    def value(wildcards, attempt):
        grown = int(base * factor(attempt))
        return min(grown, cap) if cap else grown

    return value


def job_resources(kind):
    """The resources of a job of `kind`. GPU kinds request one GPU (and cpus_per_gpu), CPU
    kinds none; mem_mb and runtime grow with the attempt on retries."""
    values = resource_class(kind)
    gpus, cpus = int(values.pop("gpu")), int(values.pop("cpus"))
    base_mem, base_runtime = values.pop("mem_mb"), values.pop("runtime")
    max_runtime = values.pop("max_runtime")
    resources = {
        "mem_mb": _grows_with_attempt(base_mem, lambda attempt: attempt),
        "runtime": _grows_with_attempt(
            base_runtime, lambda attempt: RUNTIME_GROWTH ** (attempt - 1), max(max_runtime, base_runtime)
        ),
    }
    if gpus > 0:
        resources.update(gpu=gpus, cpus_per_gpu=cpus)
    resources.update(values)  # partition, constraint, gpu_model, ... from the config
    return resources

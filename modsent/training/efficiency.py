"""How well a training run used its device: model FLOPs, the FLOP rate and the MFU.

Every training stage (LA, SE, CLA, the ablations, the full baselines, the full-parameter
methods, which train in their loop, and the recipes: m-ST5, DuEAM, MEXMA, InteMATs' three
stages) records in its ``metrics.json``:

- ``model_flops``: the run's model FLOPs, counted as the benchmarks count them (6N + 12·L·d·s
  per real token: N the body's parameters outside the embeddings, L layers, d the attention's
  width, s the token's sequence length; the usual dense estimate of a training step, forward and backward,
  with the attention scores). The LA adds its MLM head's vocabulary projection on the masked
  positions (6·d·V per masked position, and its d x d transform), which it runs on those
  positions only. Each recipe counts every encoder pass of its step: m-ST5's three (anchors,
  positives, negatives), MEXMA's four (the clean and the masked sequence of each side), its
  unmasking head's layers and its vocabulary projection on the masked positions
  (:func:`modsent.methods.mexma.training.model_flops`); InteMATs its backbone, adapters and
  fusion up to the hidden state it pools (:func:`modsent.methods.intemats.training.flop_shape`).
  Padding is not counted, nor are layers whose output nothing reads: that is work, not model
  FLOPs. One exception: MEXMA's masked pass counts its backward also with ``detach_tokens``
  (a zero gradient, but computed: the pass runs in one call with the clean pass).
  ``model_flops`` is the whole run's, over all its processes (data parallelism).
- ``model_tflops_per_second``: those FLOPs over the run's seconds, per process (every step of
  this run, its first steps and checkpoints included: what the job paid, not a steady-state
  figure; a resumed run counts the steps after its checkpoint).
- ``mfu``: that rate against the device's dense 16-bit tensor peak (:func:`peak_tflops`), on a
  GPU whose peak is known, else None. A frozen body with LoRA needs no weight gradients, so its
  real work is nearer 4N than 6N; 6N is the convention of published MFU figures and of the
  goals, and the benchmarks print both.
- ``gpu_peak_memory_gib``: the main process's peak of allocated GPU memory since the stage built
  its model (None on the CPU).

A stage calls :func:`start` once its model is built, before its first step (a bad
``MODSENT_PEAK_TFLOPS`` or a model without a layer count fails there, not after the training),
and :func:`run_figures` at its end. The LA's ``mfu`` counts its head, as the benchmarks' "+head"
column does (``benchmarks/mlm_throughput.py``); their "6N" column leaves it out.

Counting real tokens needs only the host's attention masks (:class:`TrainingLog
<modsent.training.loop.TrainingLog>` counts them with the padding), so the figures cost the
GPU nothing.
"""

from __future__ import annotations

# torch and modules that import it are imported inside the functions: modsent.logs.start_job
# checks MODSENT_PEAK_TFLOPS in every job, also in those that never import torch
import os
import re

PEAK_ENV = "MODSENT_PEAK_TFLOPS"

# Dense (no sparsity) bf16 tensor-core peaks in TFLOP/s from the vendors' datasheets; fp16 for
# GPUs without bf16 (V100, T4), whose runs use fp16 autocast. The first pattern that matches the
# device's name (torch.cuda.get_device_name) wins: the specific forms before the general ones.
PEAK_TFLOPS: tuple[tuple[str, float], ...] = (
    (r"\bGH200\b", 989.4),
    (r"\bGB200\b", 2500.0),
    (r"\bB200\b", 2250.0),
    (r"\bH200 NVL\b", 835.5),
    (r"\bH200\b", 989.4),
    (r"\bH100 NVL\b", 835.5),
    (r"\bH100 PCIe\b", 756.5),
    (r"\bH100\b", 989.4),  # SXM5 ("NVIDIA H100 80GB HBM3")
    (r"\bA100\b", 312.0),
    (r"\bA30\b", 165.0),
    (r"\bA10\b", 125.0),
    (r"\bL40S\b", 362.05),
    (r"\bL40\b", 181.05),
    (r"\bL4\b", 121.0),
    (r"\bV100[- ]PCIE\b", 112.0),
    (r"\bV100\b", 125.0),
    (r"\bT4\b", 65.0),
    (r"\bMI300X\b", 1307.4),
)


def peak_tflops(device) -> tuple[float | None, str]:
    """(dense 16-bit peak TFLOP/s of ``device``, where it comes from); (None, why) where unknown.

    ``MODSENT_PEAK_TFLOPS`` in the job's environment overrides the table (a GPU it lacks, or a
    clock the datasheet's figure does not hold at); the CPU has no peak here."""
    import torch

    from modsent.training.precision import device_type

    if device_type(device) != "cuda" or not torch.cuda.is_available():
        return None, "no GPU"
    override = environment_peak()
    if override is not None:
        return override, PEAK_ENV
    return peak_of_name(torch.cuda.get_device_name(torch.device(device)))


def environment_peak() -> float | None:
    """``MODSENT_PEAK_TFLOPS`` as a number, None when unset; a clear error when it is no
    positive number (every workflow job checks it as it starts: modsent.logs.start_job)."""
    override = os.environ.get(PEAK_ENV)
    if not override:
        return None
    try:
        value = float(override)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise ValueError(f"{PEAK_ENV}={override!r}: expected the GPU's dense bf16 peak in TFLOP/s, "
                         f"a positive number (e.g. 989.4 for an H100 SXM)")
    return value


def peak_of_name(name: str) -> tuple[float | None, str]:
    """The table's peak for a device called ``name`` (:data:`PEAK_TFLOPS`)."""
    for pattern, value in PEAK_TFLOPS:
        if re.search(pattern, name, flags=re.IGNORECASE):
            return value, name
    return None, f"{name}: not in modsent.training.efficiency.PEAK_TFLOPS (set {PEAK_ENV})"


# a parameter of layer i: BERT's encoder.layer.i, adapters' layers.i, T5's block.i (before its layer.j)
LAYER_INDEX = re.compile(r"\.(?:block|layers?)\.(\d+)\.")


def body_shape(model, layers: int | None = None) -> tuple[int, int, int]:
    """(N, L, d) of the transformer in ``model``: N its parameters outside the embeddings and the
    pooler (each once, LoRA's and adapters' included: they run at every token; a lookup table,
    such as T5's shared embeddings and relative position biases, computes no product), L its
    layers, d its attention's width (heads x head size: the model's width but in a T5 whose
    ``d_kv`` x ``num_heads`` differs from ``d_model``, such as mT5-small), read from the first
    submodule's Hugging Face config. ``layers``: only the first ``layers`` layers count (and
    their parameters, named by :data:`LAYER_INDEX`): those a model whose vector
    is read below the top needs (InteMATs); the layers above run, but that is work, not model
    FLOPs, as padding is."""
    from torch import nn

    config = next((module.config for module in model.modules()
                   if hasattr(getattr(module, "config", None), "to_dict")), None)
    if config is None:
        raise ValueError(f"{type(model).__name__} holds no transformers model with a config")
    total = getattr(config, "num_hidden_layers", None) or getattr(config, "num_layers", None)
    width = getattr(config, "hidden_size", None) or getattr(config, "d_model", None)
    if not total or not width:
        raise ValueError(f"{type(config).__name__} names no layer count or width")
    heads, head_size = getattr(config, "num_heads", None), getattr(config, "d_kv", None)  # the T5 family's
    if heads and head_size:
        width = heads * head_size
    seen = {id(p) for module in model.modules() if isinstance(module, nn.Embedding) for p in module.parameters()}
    if layers is None:
        layers = total
    elif not 0 <= layers <= total:
        raise ValueError(f"{layers} of a {total}-layer model's layers")
    n = 0
    for name, parameter in model.named_parameters(remove_duplicate=False):
        if id(parameter) in seen or "embeddings" in name or "pooler" in name:
            continue
        seen.add(id(parameter))
        index = LAYER_INDEX.search(f".{name}") if layers < total else None
        if index is None or int(index.group(1)) < layers:
            n += parameter.numel()
    return n, int(layers), int(width)


def encoder_flops(shape: tuple[int, int, int], tokens: int, token_squares: int) -> float:
    """Training FLOPs (forward and backward) of encoding sequences whose real lengths s sum to
    ``tokens`` and whose s² sum to ``token_squares``: 6N per token, 12·L·d·s² per sequence
    (the scores and their weighted sum, 4·d·s² a layer forward, twice that backward)."""
    n, layers, width = shape
    return 6.0 * n * tokens + 12.0 * layers * width * token_squares


def mlm_head_flops(head, masked: int) -> float:
    """Training FLOPs of an MLM head run on ``masked`` positions only (as
    :class:`modsent.losses.MaskedLanguageModelingLoss` runs it): 6 per parameter and position,
    its transform and its vocabulary projection (tied to the embeddings or not)."""
    return 6.0 * sum(p.numel() for p in {id(p): p for p in head.parameters()}.values()) * masked


def start(model, device, layers: int | None = None) -> tuple[int, int, int]:
    """The start of a stage's training: ``MODSENT_PEAK_TFLOPS`` checked, the GPU's peak memory
    statistic reset, and :func:`body_shape` of ``model`` (its first ``layers``) returned (for
    :func:`encoder_flops`)."""
    import torch

    from modsent.training.precision import device_type

    environment_peak()
    shape = body_shape(model, layers)
    if device_type(device) == "cuda" and torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats(torch.device(device))
    return shape


def run_figures(flops: float, seconds: float, device, processes: int = 1) -> dict:
    """The metrics above for ``flops`` done in ``seconds`` by ``processes`` processes (each on
    its own device like ``device``); no rate where nothing was counted (a run resumed at its
    end)."""
    import torch

    from modsent.training.precision import device_type

    rate = flops / seconds / processes if seconds > 0 and flops > 0 else None
    peak, _ = peak_tflops(device)
    memory = None
    if device_type(device) == "cuda" and torch.cuda.is_available():
        memory = torch.cuda.max_memory_allocated(torch.device(device)) / 2 ** 30
    return {"model_flops": flops,
            "model_tflops_per_second": None if rate is None else rate / 1e12,
            "mfu": None if rate is None or peak is None else rate / (peak * 1e12),
            "peak_tflops": peak, "gpu_peak_memory_gib": memory}


def describe(figures: dict) -> str:
    """``12.3 model TFLOP/s (4.5% MFU, 12.1 GiB)`` for a log line."""
    rate = figures.get("model_tflops_per_second")
    if rate is None:
        return "no model FLOPs counted"
    extra = []
    if figures.get("mfu") is not None:
        extra.append(f"{figures['mfu']:.1%} MFU of {figures['peak_tflops']:g}")
    if figures.get("gpu_peak_memory_gib") is not None:
        extra.append(f"peak {figures['gpu_peak_memory_gib']:.1f} GiB")
    return f"{rate:.3g} model TFLOP/s" + (f" ({', '.join(extra)})" if extra else "")

"""Mixed precision, one rule for every stage and method:

- ``auto``: bf16 autocast on GPUs that compute in bf16 (A100, H100, ...); on GPUs without it
  (V100, T4) fp16 autocast with a loss scaler, as ``fp16``; full precision on the CPU;
- ``fp16``: fp16 autocast with a loss scaler on GPUs; full precision on the CPU;
- ``fp32``: full precision everywhere.

A training step with any of them (the scaler is a pass-through unless fp16 runs)::

    scaler = grad_scaler(device, cfg.precision)
    with autocast(device, cfg.precision):
        loss = ...
    scaler.scale(loss).backward()
    optimizer_step(optimizer, trainable, cfg.max_grad_norm, scaler)   # unscale, clip, step, update

and checkpoints keep the scaler's state (modsent.training.checkpoints), so a resumed fp16 run
goes on with the loss scale the unbroken run had.
"""

from __future__ import annotations

import contextlib
import logging

import torch

from modsent.schema import PRECISIONS

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
# bodies whose activations overflow fp16's range (T5's feed-forward outputs: trained in bf16)
FP16_UNSAFE = ("t5", "mt5", "umt5")

log = logging.getLogger(__name__)
_DESCRIBED: set[tuple[str, str]] = set()  # (device, precision) pairs this process has logged


def device_type(device) -> str:
    """``cuda`` for ``cuda``, ``cuda:1`` or such a torch.device; ``cpu``, ``mps``, ... likewise."""
    return str(device).split(":")[0]


def default_device(device=None):
    """``device`` when given; else where a job's work goes by default: the GPU when the process
    sees one (its current device), the CPU otherwise."""
    if device:
        return device
    return "cuda" if torch.cuda.is_available() else "cpu"


def describe_device(device) -> str:
    """``device`` as a job's log names it: ``cuda:0 (NVIDIA H200)`` for a GPU (its index the
    process's own, after ``CUDA_VISIBLE_DEVICES``), ``cpu (2 threads)`` for the CPU; so a log
    says where a job ran (a SLURM job that asked for a GPU and trained on the CPU shows it)."""
    if device_type(device) == "cuda" and torch.cuda.is_available():
        index = torch.device(device).index
        index = torch.cuda.current_device() if index is None else index
        return f"cuda:{index} ({torch.cuda.get_device_name(index)})"
    if device_type(device) == "cpu":
        threads = torch.get_num_threads()
        return f"cpu ({threads} thread{'' if threads == 1 else 's'})"
    return str(device)


def resolve(device, precision: str = "auto") -> str:
    """What runs on ``device`` under ``precision``: ``bf16``, ``fp16`` (with a loss scaler) or
    ``fp32``. CPU autocast is never used: it is slower than fp32 on most CPUs and changes
    results."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    if device_type(device) != "cuda" or precision == "fp32":
        return "fp32"
    if precision == "fp16":
        return "fp16"
    # bf16 emulated on a GPU without bf16 units is slower than fp16 and gains nothing in range
    # over fp16 with a loss scaler. Asked of the device itself: ``cuda:1`` on a node of mixed GPUs
    # is not the current device (torch asks about the current one)
    index = torch.device(device).index
    with torch.cuda.device(index) if index is not None else contextlib.nullcontext():
        return "bf16" if torch.cuda.is_bf16_supported(including_emulation=False) else "fp16"


def autocast(device, precision: str = "auto") -> contextlib.AbstractContextManager:
    """Autocast to what :func:`resolve` says runs; a no-op for ``fp32``."""
    mode = resolve(device, precision)
    if mode == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device_type(device), dtype=DTYPES[mode])


def grad_scaler(device, precision: str = "auto") -> torch.amp.GradScaler:
    """The loss scaler fp16 needs (small gradients underflow in fp16), enabled when
    :func:`resolve` says fp16; otherwise disabled, every call a pass-through. Use:
    ``scaler.scale(loss).backward()``, then ``scaler.unscale_(optimizer)`` before clipping,
    ``scaler.step(optimizer)``, ``scaler.update()`` (modsent.training.loop.optimizer_step). The
    first scaler a process makes for a device and precision logs where and how it trains
    (:func:`describe_device`): every training loop makes one before its first step."""
    mode = resolve(device, precision)
    if (str(device), mode) not in _DESCRIBED:
        _DESCRIBED.add((str(device), mode))
        log.info("training on %s in %s", describe_device(device), "fp32" if mode == "fp32" else f"{mode} autocast")
    enabled = mode == "fp16"
    scaler = torch.amp.GradScaler(device_type(device) if enabled else "cpu", enabled=enabled)
    if enabled:
        # the scale exists from the start (GradScaler makes it on the first scaled loss): a
        # data-parallel process with no share of a batch scales nothing, and unscales all the same
        scaler.scale(torch.zeros((), device=device))
    return scaler


def for_model(model: torch.nn.Module, device, precision: str = "auto") -> str:
    """``precision`` for training or encoding ``model``: ``auto`` on a GPU without bf16 would run fp16, in
    which T5-family bodies (mT5: m-ST5) overflow (every step skipped by the loss scaler, the model
    left as it was), so there it is ``fp32``, and the log says so. An explicit ``fp16`` is kept,
    with a warning."""
    types = {getattr(getattr(m, "config", None), "model_type", None) for m in model.modules()}
    unsafe = sorted(t for t in types if t in FP16_UNSAFE)
    if not unsafe or resolve(device, precision) != "fp16":
        return precision
    if precision == "auto":
        log.warning("precision auto: this GPU has no bf16 and %s overflows in fp16; fp32 instead", unsafe[0])
        return "fp32"
    log.warning("precision fp16 with a %s body: its activations may overflow fp16 (steps skipped)", unsafe[0])
    return precision

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

import torch

from modsent.schema import PRECISIONS

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def device_type(device) -> str:
    """``cuda`` for ``cuda``, ``cuda:1`` or such a torch.device; ``cpu``, ``mps``, ... likewise."""
    return str(device).split(":")[0]


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
    # over fp16 with a loss scaler
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
    ``scaler.step(optimizer)``, ``scaler.update()`` (modsent.training.loop.optimizer_step)."""
    enabled = resolve(device, precision) == "fp16"
    return torch.amp.GradScaler(device_type(device) if enabled else "cpu", enabled=enabled)

"""Mixed precision: bf16 autocast on GPUs (``precision: auto``), fp16 autocast with a gradient
scaler (``fp16``: GPUs without bf16, V100/T4), full precision otherwise."""

from __future__ import annotations

import contextlib

import torch

PRECISIONS = ("auto", "fp16", "fp32")


def autocast(device, precision: str = "auto") -> contextlib.AbstractContextManager:
    """bf16 autocast on a CUDA device with ``precision="auto"``, fp16 with ``"fp16"``; a no-op
    on the CPU or with ``"fp32"`` (CPU autocast to bf16 is slower than fp32 on most CPUs and
    changes results)."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    if str(device).startswith("cuda") and precision == "auto":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    if str(device).startswith("cuda") and precision == "fp16":
        return torch.autocast("cuda", dtype=torch.float16)
    return contextlib.nullcontext()


def grad_scaler(device, precision: str) -> torch.amp.GradScaler:
    """The loss scaler fp16 needs (small gradients underflow in fp16); disabled (every call a
    pass-through) for bf16, fp32 and the CPU. Use: ``scaler.scale(loss).backward()``, then
    ``scaler.unscale_(optimizer)`` before clipping, ``scaler.step(optimizer)``, ``scaler.update()``."""
    enabled = str(device).startswith("cuda") and precision == "fp16"
    return torch.amp.GradScaler("cuda" if enabled else "cpu", enabled=enabled)

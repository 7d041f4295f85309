"""Mixed precision: bf16 autocast on GPUs (``precision: auto``), full precision otherwise."""

from __future__ import annotations

import contextlib

import torch

PRECISIONS = ("auto", "fp32")


def autocast(device, precision: str = "auto") -> contextlib.AbstractContextManager:
    """bf16 autocast on a CUDA device with ``precision="auto"``; a no-op on the CPU or with
    ``"fp32"`` (CPU autocast to bf16 is slower than fp32 on most CPUs and changes results)."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    if str(device).startswith("cuda") and precision == "auto":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()

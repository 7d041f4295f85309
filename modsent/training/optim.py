"""The optimizer every training stage uses."""

from __future__ import annotations

import torch


def fused_options(params) -> dict:
    """``{"fused": True}`` when every parameter is a floating-point CUDA tensor: PyTorch's fused
    AdamW does the whole update in a few kernels instead of a chain of per-tensor ones (the same
    arithmetic; it also works with fp16's GradScaler). Empty otherwise: on the CPU PyTorch's
    default (one tensor at a time) keeps runs bit-identical to earlier ones; its fused CPU kernel
    rounds differently (up to 2.4e-7 on an update of multilingual-e5-small's shapes)."""
    params = list(params)
    if params and all(p.is_cuda and p.is_floating_point() for p in params):
        return {"fused": True}
    return {}


def adamw(trainable, learning_rate: float, weight_decay: float) -> torch.optim.AdamW:
    """AdamW over ``trainable`` (in order): weight decay on the matrices (``ndim >= 2``: linear
    and embedding weights, LoRA factors), none on the vectors (biases, LayerNorm weights), as
    transformers' Trainer and sentence-transformers group them. Fused on CUDA
    (:func:`fused_options`): move the model to its device first."""
    trainable = list(trainable)
    decay = [p for p in trainable if p.ndim >= 2]
    no_decay = [p for p in trainable if p.ndim < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                              {"params": no_decay, "weight_decay": 0.0}], lr=learning_rate,
                             **fused_options(trainable))

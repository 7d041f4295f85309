"""The optimizer every training stage uses."""

from __future__ import annotations

import torch


def adamw(trainable, learning_rate: float, weight_decay: float) -> torch.optim.AdamW:
    """AdamW over ``trainable`` (in order): weight decay on the matrices (``ndim >= 2``: linear
    and embedding weights, LoRA factors), none on the vectors (biases, LayerNorm weights), as
    transformers' Trainer and sentence-transformers group them."""
    trainable = list(trainable)
    decay = [p for p in trainable if p.ndim >= 2]
    no_decay = [p for p in trainable if p.ndim < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                              {"params": no_decay, "weight_decay": 0.0}], lr=learning_rate)

"""Learning-rate schedules, as functions of the step (the optimizer's rate is set every step)."""

from __future__ import annotations


def warmup_linear(step: int, total_steps: int, warmup_steps: int, peak: float) -> float:
    """Linear warm-up from ``peak / warmup_steps`` to ``peak`` over ``warmup_steps`` steps, then
    linear decay to zero at ``total_steps`` (sentence-transformers' WarmupLinear)."""
    if step < warmup_steps:
        return peak * (step + 1) / warmup_steps
    return peak * max(total_steps - step, 0) / max(total_steps - warmup_steps, 1)


def warmup_steps_of(ratio: float, total_steps: int) -> int:
    """The warm-up steps of a warm-up ``ratio`` of ``total_steps``."""
    return int(round(ratio * total_steps))


def warmup_ratio_linear(step: int, total_steps: int, warmup_ratio: float, peak: float) -> float:
    """:func:`warmup_linear` with the warm-up given as a ratio of ``total_steps``."""
    return warmup_linear(step, total_steps, warmup_steps_of(warmup_ratio, total_steps), peak)


def warmup_cosine(step: int, total_steps: int, warmup_steps: int, peak: float, start_factor: float = 0.1,
                  final: float = 0.0) -> float:
    """Linear warm-up from ``start_factor * peak`` (step 0) towards ``peak`` over
    ``warmup_steps`` steps, then cosine annealing from ``peak`` to ``final`` over the remaining
    steps: torch's ``SequentialLR([LinearLR(start_factor, total_iters=warmup_steps),
    CosineAnnealingLR(T_max=total_steps - warmup_steps, eta_min=final)])``, as MEXMA's public
    training script schedules it (30% warm-up from 0.1 x lr)."""
    import math

    if step < warmup_steps:
        return peak * (start_factor + (1 - start_factor) * step / warmup_steps)
    span = max(total_steps - warmup_steps, 1)
    progress = min(step - warmup_steps, span) / span
    return final + (peak - final) * (1 + math.cos(math.pi * progress)) / 2

"""Random streams that are pure functions of the training step.

A run killed and resumed at step s must draw the batches, masks and dropout an unbroken run
draws at step s; so every random choice of a step is seeded from (seed, step), not from a
stream that the steps before it advanced. The fresh weights the recipes and the CLA add
(adapters, a LoRA, a head, built on the CPU) are drawn from the run's seed in a private CPU
stream (:func:`private_cpu_stream`); the LA and SE seed the global streams at their start.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterator

import torch


def dropout_seed(step: int, seed: int, rank: int = 0) -> int:
    """The dropout seed of process ``rank`` at ``step`` (``torch.manual_seed`` before the step's
    forward pass): each process of a data-parallel run draws its own masks, and a resumed run
    draws the same ones again."""
    digest = hashlib.sha256(f"dropout {seed} {step} {rank}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def step_generator(step: int, seed: int) -> torch.Generator:
    """A generator for one step's other random draws (the MLM masking)."""
    return torch.Generator().manual_seed(seed * 1_000_003 + step + 1)


@contextlib.contextmanager
def private_cpu_stream(seed: int | None = None) -> Iterator[None]:
    """Draws of the CPU's default generator inside come from a private stream, seeded with
    ``seed`` when one is given (fresh weights built on the CPU: the same in every run, wherever
    the run trains); the caller's stream is restored on exit. GPU generators are neither saved
    nor seeded: ``torch.manual_seed`` would reseed them and leave them so after the block."""
    with torch.random.fork_rng(devices=[]):
        if seed is not None:
            torch.random.default_generator.manual_seed(seed)
        yield

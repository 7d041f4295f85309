"""The cross-entropy of a vocabulary projection, whole against in chunks: time, what it keeps for
the backward and its peak memory, measured side by side.

    python benchmarks/vocab_loss.py                                  # CPU: 1,024 positions, XLM-R's vocabulary
    python benchmarks/vocab_loss.py --device cuda --positions 6451 --chunk-rows 1024 2048 4096 --triton

The loss of MEXMA's cross-unmasking head at the masked positions: random states (``--positions``
x ``--width``, 768 for XLM-R base) projected onto ``--vocab`` words (250,002) by a trainable tied
weight and bias, each row's cross-entropy summed, and the backward to the states, the weight and
the bias. ``whole`` is what modsent runs by default (``F.cross_entropy(F.linear(...).float())``:
autograd keeps the fp32 log-softmax); ``chunks of R`` is ``methods.MEXMA.loss_chunk_rows: R``
(:func:`modsent.training.vocab_loss.linear_cross_entropy`: no logits kept, the backward projects
each chunk again); ``--triton`` adds both with Triton's cross-entropy kernel (``kernels: triton``;
a GPU only: the interpreter would take hours at these sizes). For each: the median time of a
forward and backward, the bytes autograd keeps for the backward beyond the inputs (counted by a
saved-tensors hook, ``la_graphs.saved_storage``: exact, on any device) and the peak memory above
what was allocated before the step (a GPU's allocator peak; on the CPU each variant runs in a
process of its own, and the peak is its resident set's high-water mark above its size before the
step). On a GPU under bf16 autocast, on the CPU in fp32 (``--dtype``). 6,451 positions are
MEXMA's at 64 pairs of 128 tokens (40% of the 126 tokens between a sentence's two special tokens,
both sides).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.la_graphs import saved_storage  # noqa: E402
from benchmarks.modular_encoder import rss_mib  # noqa: E402
from modsent.training import fastpath  # noqa: E402


def run(args: argparse.Namespace, variant: str) -> dict:
    """One variant's figures ({"seconds", "kept", "peak"}) in this process."""
    device, cuda = args.device, args.device.startswith("cuda")
    generator = torch.Generator().manual_seed(0)
    states = torch.randn(args.positions, args.width, generator=generator).to(device).requires_grad_()
    weight = (torch.randn(args.vocab, args.width, generator=generator) * 0.02).to(device).requires_grad_()
    bias = torch.zeros(args.vocab, device=device, requires_grad=True)
    targets = torch.randint(0, args.vocab, (args.positions,), generator=generator).to(device)
    head = torch.nn.Module()
    fastpath.fuse_cross_entropy(head, variant.startswith("triton"))
    rows = int(variant.rsplit(" ", 1)[1]) if "chunks" in variant else None
    inputs = frozenset(t.untyped_storage().data_ptr() for t in (states, weight, bias, targets))
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": None}[args.dtype]

    def step() -> None:
        with torch.autocast(device.split(":")[0], dtype=dtype or torch.float32, enabled=dtype is not None):
            if rows is None:
                loss = fastpath.mlm_cross_entropy(head, F.linear(states, weight, bias), targets, "sum")
            else:
                loss = fastpath.projection_cross_entropy(head, states, weight, bias, targets, "sum", rows)
        loss.backward()
        states.grad = weight.grad = bias.grad = None

    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    else:
        before = rss_mib() * 2**20
    # the first step: the peak, a warm-up and what it keeps for its backward beyond the inputs (each storage once)
    kept = sum(saved_storage(step, inputs).values())
    if cuda:
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - before
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before
    times = []
    for _ in range(args.steps):
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        step()
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return {"seconds": statistics.median(times), "kept": kept, "peak": peak}


def size(n: float) -> str:
    return f"{n / 2**30:6.2f} GiB" if abs(n) >= 2**30 / 10 else f"{n / 2**20:6.1f} MiB"


def check_options(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """What the options' types cannot check (tests/test_gpu_blocks.py runs it on gpu.sh's lines)."""
    if min(args.chunk_rows) < 1 or (args.positions or 1) < 1 or (args.steps or 1) < 1:
        parser.error("--chunk-rows, --positions and --steps must be positive")
    if args.triton and not args.device.startswith("cuda"):
        parser.error("--triton: Triton's kernels at these sizes need a CUDA GPU (--device cuda)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--positions", type=int, default=None,
                        help="masked positions (default: 1,024 on the CPU, 6,451 on a GPU)")
    parser.add_argument("--width", type=int, default=768)
    parser.add_argument("--vocab", type=int, default=250_002)
    parser.add_argument("--chunk-rows", type=int, nargs="+", default=[256], metavar="R")
    parser.add_argument("--dtype", choices=["bf16", "fp16", "fp32"], default=None,
                        help="autocast's dtype (default: bf16 on a GPU, fp32 on the CPU)")
    parser.add_argument("--steps", type=int, default=None, help="timed steps (default: 1 on the CPU, 10 on a GPU)")
    parser.add_argument("--triton", action="store_true", help="also with Triton's cross-entropy kernel (a GPU)")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # a child process: this variant alone, as JSON
    args = parser.parse_args()
    check_options(parser, args)
    cuda = args.device.startswith("cuda")
    args.positions = args.positions or (6451 if cuda else 1024)
    args.dtype = args.dtype or ("bf16" if cuda else "fp32")
    args.steps = args.steps or (10 if cuda else 1)
    if args.triton:
        from modsent.training import kernels

        if not kernels.runs_on(args.device):
            parser.error(f"--triton: Triton's kernels cannot run on {args.device} here (Triton installed?)")
    if args.one:
        print(json.dumps(run(args, args.one)))
        return
    variants = ["whole"] + [f"chunks of {r}" for r in args.chunk_rows]
    if args.triton:
        variants += [f"triton {v}" for v in variants]
    name = torch.cuda.get_device_name() if cuda else "CPU"
    print(f"vocabulary projection + cross-entropy, {args.positions} positions x {args.width} -> {args.vocab:,} "
          f"words, {args.dtype}, {args.device} ({name}), torch {torch.__version__}")
    results = {}
    for variant in variants:
        if cuda:  # one process: the allocator's peak is reset for each
            results[variant] = run(args, variant)
            torch.cuda.empty_cache()
        else:  # a process each: the resident set's high-water mark is the process's
            command = [sys.executable, os.path.abspath(__file__), *sys.argv[1:], "--one", variant]
            out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
            results[variant] = json.loads(out.strip().splitlines()[-1])
    for variant, r in results.items():
        kernel = variant.startswith("triton")
        base = results["triton whole" if kernel else "whole"]
        print(f"{variant:22s} {r['seconds'] * 1000:9.1f} ms  kept {size(r['kept'])}  "
              f"peak {size(r['peak'])}  ({base['seconds'] / r['seconds']:.2f}x the speed, "
              f"{r['peak'] / base['peak']:.2f}x the peak of the whole loss{' with the kernel' if kernel else ''})")


if __name__ == "__main__":
    main()

"""Where a GPU step's time goes: torch.profiler over the LA (MLM) and SE (MNRL) steps of a
LaBSE-sized random model, bf16 autocast and fused AdamW, as mlm_throughput.py and
pair_throughput.py run them (with modsent.training.fastpath's forwards, as modsent trains;
--peft: PEFT's own LoRA forward).

    python -m benchmarks.profile_steps --device cuda

Every batch shape the profiled steps meet is run once before the profiler starts: a new shape is
slow once (PyTorch's cuDNN attention builds an execution plan per shape), and the first SE profile
(profile_steps_fast_h200.txt) met one width unwarmed, which put ~1 ms of host time on each of its
attention calls against ~0.05 ms in the LA's one-shape step. Prints, per stage, the wall time per
step, the GPU's busy time per step (the sum of its kernels' times: their share of the wall time
says whether the step is bound by the GPU or by the Python and launch overhead that feeds it),
the number of kernel launches per step, and the kernels that take the most GPU time.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def profile(name: str, step, steps: int, cuda: bool, top: int, warm: tuple[int, ...] = ()) -> None:
    """Profile ``step(1)`` .. ``step(steps)`` after three untimed ``step(0)`` and one untimed
    ``step(i)`` for each ``i`` in ``warm`` (a step of each batch shape the profiled steps meet:
    a new shape is slow once, while cuDNN's attention builds its plan for it, and would be
    profiled as the step's cost)."""
    from torch.profiler import ProfilerActivity, profile as torch_profile

    for i in (0, 0, 0, *warm):
        step(i)
    if cuda:
        torch.cuda.synchronize()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with torch_profile(activities=activities) as prof:
        start = time.perf_counter()
        for i in range(steps):
            step(i + 1)
        if cuda:
            torch.cuda.synchronize()
        wall = (time.perf_counter() - start) / steps
    events = prof.key_averages()
    device_attr = "self_device_time_total" if cuda else "self_cpu_time_total"
    kernels = [e for e in events if getattr(e, device_attr, 0) > 0 and (not cuda or e.device_type.name == "CUDA")]
    busy = sum(getattr(e, device_attr) for e in kernels) / 1e6 / steps if cuda else None
    launches = sum(e.count for e in kernels) / steps if cuda else None
    print(f"\n== {name}: {wall * 1e3:.1f} ms per step (wall, under the profiler)", end="")
    if cuda:
        print(f"; GPU busy {busy * 1e3:.1f} ms ({busy / wall:.0%} of the wall time); "
              f"{launches:.0f} kernels per step")
    else:
        print()
    for sort in (["self_device_time_total", "self_cuda_time_total"] if cuda else ["self_cpu_time_total"]):
        try:
            print(events.table(sort_by=sort, row_limit=top, max_name_column_width=60))
            break
        except (KeyError, AttributeError):
            continue


def main() -> None:
    from modsent.training import fastpath

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--la-batch", type=int, default=128)
    parser.add_argument("--la-seq-len", type=int, default=256)
    parser.add_argument("--se-batch", type=int, default=128)
    parser.add_argument("--peft", action="store_true", help="PEFT's LoRA forward, not modsent's fast path")
    parser.add_argument("--bf16-residual", action="store_true",
                        help="profile the LA step again with its residual stream in bf16 "
                             "(language_adapter.residual_stream: bf16; fastpath.bf16_residual_stream)")
    parser.add_argument("--compile", nargs="+", choices=("whole", "attention-outside"), default=None,
                        help="profile the LA step again with the encoder compiled (language_adapter.compile): "
                             "whole, and/or with the attention outside the graphs (fastpath.attention_outside_graph)")
    parser.add_argument("--fused", action="store_true",
                        help="profile the LA step again with fastpath.fuse_projections (one product for query, "
                             "key and value) and fastpath.fuse_residual_norms (dropout, residual add and "
                             "LayerNorm compiled into one kernel each way)")
    parser.add_argument("--triton", action="store_true",
                        help="profile the LA step again with its Triton kernels (fastpath.use_triton_kernels, "
                             "language_adapter.kernels: triton): each LoRA layer's dropout drawn inside its products, "
                             "dropout + residual add + LayerNorm as one kernel each way, the MLM loss's cross-entropy")
    parser.add_argument("--stages", nargs="+", choices=("LA", "SE"), default=["LA", "SE"])
    args = parser.parse_args()
    if args.triton and not args.device.startswith("cuda"):
        os.environ.setdefault("TRITON_INTERPRET", "1")  # the CPU: Triton's interpreter, before Triton is imported
    speed_up = (lambda model: None) if args.peft else fastpath.speed_up
    cuda = args.device.startswith("cuda")
    autocast = (lambda: torch.autocast("cuda", dtype=torch.bfloat16)) if cuda else (
        lambda: torch.autocast("cpu", enabled=False))

    if "LA" in args.stages:
        profile_la(args, speed_up, cuda, autocast)
    if "SE" in args.stages:
        profile_se(args, speed_up, cuda, autocast)


def profile_la(args, speed_up, cuda: bool, autocast) -> None:
    from benchmarks import mlm_throughput
    from modsent.losses import mlm_parts
    from modsent.modular.language_adapter import mlm_loss
    from modsent.training import fastpath
    from modsent.training.loop import optimizer_step, to_device
    from modsent.training.optim import step_options

    # LA: packed sequences of exactly seq_len, 15% masked, LoRA on q/k/v + trainable embeddings
    la_args = argparse.Namespace(labse_random=True, device=args.device)
    model, vocab = mlm_throughput.build(la_args)
    speed_up(model)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-4, **step_options(params))
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(5, vocab, (args.la_batch, args.la_seq_len), generator=generator)
    chosen = torch.rand(ids.shape, generator=generator) < 0.15
    labels = torch.where(chosen, ids, torch.full_like(ids, -100))  # on the CPU, as the LA keeps them
    inputs = torch.where(chosen, torch.full_like(ids, 4), ids)

    def la_step(_):
        with autocast():
            loss = mlm_loss(model, to_device(inputs, args.device), labels)
        loss.backward()
        optimizer_step(optimizer, params, 1.0)

    profile(f"LA step, {args.la_batch} x {args.la_seq_len} tokens", la_step, args.steps, cuda, args.top)
    if args.bf16_residual:  # what is left of the element-wise traffic once the stream is bf16
        fastpath.bf16_residual_stream(model)
        profile(f"LA step, {args.la_batch} x {args.la_seq_len} tokens, bf16 residual stream", la_step, args.steps,
                cuda, args.top)
    stream = ", bf16 residual stream" if args.bf16_residual else ""
    if args.fused:  # the element-wise steps and products left after the bf16 stream, fewer and fuller
        fastpath.fuse_projections(model)
        fastpath.fuse_residual_norms(model, args.device, "--fused")
        profile(f"LA step, {args.la_batch} x {args.la_seq_len} tokens{stream}, fused norms and projections",
                la_step, args.steps, cuda, args.top)
        fastpath.fuse_projections(model, on=False)
        fastpath.fuse_residual_norms(model, args.device, "--fused", on=False)
    if args.triton:  # the LoRA branches, the residual norms and the MLM loss as Triton kernels
        fastpath.use_triton_kernels(model, mlm_head=mlm_parts(model)[1])
        profile(f"LA step, {args.la_batch} x {args.la_seq_len} tokens{stream}, Triton LoRA, norms and cross-entropy",
                la_step, args.steps, cuda, args.top)
        fastpath.use_triton_kernels(model, on=False, mlm_head=mlm_parts(model)[1])
    for how in args.compile or ():  # Inductor's kernels: which attention, what is left unfused
        torch._dynamo.reset()
        fastpath.attention_outside_graph(mlm_parts(model)[0], how == "attention-outside")
        fastpath.compile_in_place(mlm_parts(model)[0], args.device, "--compile")
        profile(f"LA step, {args.la_batch} x {args.la_seq_len} tokens{stream}, compiled ({how})", la_step,
                args.steps, cuda, args.top)
    if args.compile:  # the compiled graphs and their memory, gone before the SE's model
        import gc

        torch._dynamo.reset()
        model = optimizer = None
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()


def profile_se(args, speed_up, cuda: bool, autocast) -> None:
    from benchmarks import pair_throughput
    from modsent.losses import MultipleNegativesRankingLoss
    from modsent.modular.sentence_adapter import pass_loss
    from modsent.training.loop import optimizer_step
    from modsent.training.optim import step_options

    generator = torch.Generator().manual_seed(0)

    # SE: anchors, positives and the paper's share of hard negatives, sentences of real lengths,
    # padded to the longest with the stage's mask, MNRL
    encoder, config = pair_throughput.build("labse", args.device)
    speed_up(encoder)
    trainable = [p for p in encoder.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=2e-5, **step_options(trainable))
    lengths = pair_throughput.sentence_lengths(128)
    batches = pair_throughput.make_batches(lengths, (args.steps + 4) * args.se_batch, args.se_batch, 1, seed=1,
                                           negative_share=pair_throughput.PAPER_NEGATIVE_SHARE)
    prepared = [pair_throughput.padded(pair_throughput.sentences(batch, "SE"), config, args.device, generator, 1)
                for batch in batches]
    loss_fn = MultipleNegativesRankingLoss(20.0)

    def se_step(i):
        ids, mask, attention = prepared[i]
        with autocast(), pair_throughput.attention_kernels(cudnn=False):  # as the stage: no cuDNN attention
            hidden = encoder(input_ids=ids, attention_mask=attention).last_hidden_state
            emb = pair_throughput.mean_pool(hidden, mask)
            loss = pass_loss(loss_fn, emb, args.se_batch)
        loss.backward()
        optimizer_step(optimizer, trainable, 1.0)

    # step(0) warms the first batch's shape; the profiled steps' other shapes are warmed once each
    schedule, untimed = pair_throughput.warm_schedule([ids.shape for ids, _, _ in prepared[:args.steps + 1]], 1)
    profile(f"SE step, {args.se_batch} pairs", se_step, args.steps, cuda, args.top,
            warm=tuple(schedule[1:untimed]))


if __name__ == "__main__":
    main()

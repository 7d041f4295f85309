"""MEXMA training throughput (pairs/s, tokens/s, MFU, peak memory), measured side by side.

    python benchmarks/mexma_throughput.py                                  # small random model, CPU
    python benchmarks/mexma_throughput.py --size base --device cuda --seq-len 128 256

Compares, in one run and on the same batches, a training step as modsent runs it
(:class:`modsent.methods.mexma.model.MEXMAModel`: the four passes as two forward calls, clean and
masked of one side stacked; the vocabulary projection on the masked positions only,
``losses.CrossUnmaskingLoss``; the trainer's own ``Objective``, and its batches sent as it sends
them: ids from pinned memory without blocking, labels kept on the host, no attention mask where
nothing is padded) with the plain way (four forward calls; the projection over every
position, transformers' usual MLM loss), both with AdamW over every weight and the same loss
weights, and prints their ratio. On a GPU it runs under bf16 autocast and prints MFU against the
GPU's bf16 peak (--peak-tflops, default 989 for an H100 SXM), counting per pair 4 encoder passes
and 2 head passes of 6N + 12·L·d·s FLOPs per token (N: the non-embedding parameters, L layers,
width d, sequence s) plus the vocabulary projection (6·d·V per projected position), and the peak
memory. Random weights of the MEXMA-base (XLM-R base: 12 x 768, 250,002 tokens) or MEXMA (XLM-R
large: 24 x 1024) shape with a 6-layer, 8-head head; nothing is downloaded. Sentences are
random ids of exactly ``seq_len`` tokens (no padding), 40% masked. ``--compile`` adds a third
run, last: modsent's step with the encoder body compiled in place as ``methods.MEXMA.compile:
true`` compiles it (``fastpath.compile_in_place``), and its speed-up over the eager step.
``--triton`` adds modsent's step with the cross-unmasking loss's cross-entropy through Triton's
kernel (``methods.MEXMA.kernels: triton``, ``fastpath.fuse_cross_entropy``: the logits of the masked
positions over the 250,002 words read once each way, no fp32 copy kept), and its speed-up and
memory beside the eager loss's (on the CPU in Triton's interpreter: a check that it runs).
``--loss-chunk-rows R`` adds modsent's step with the cross-unmasking loss computed R masked
positions at a time, no logits kept (``methods.MEXMA.loss_chunk_rows: R``,
:mod:`modsent.training.vocab_loss`), and with ``--triton`` also both, each with its peak memory.
``--gradient-checkpointing`` adds modsent's step with every layer of the encoder and the head run
again in the backward (``methods.MEXMA.gradient_checkpointing``), and with ``--loss-chunk-rows``
also both: the least memory a step can take; with ``--compile`` also, last, the compiled body
checkpointed as the trainer compiles it then (its dropout by eager's kernels: ``eager_random``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from modsent.methods.mexma.model import checkpoint_activations
from modsent.training import fastpath

SIZES = {  # hidden, layers, heads, intermediate
    "small": (256, 4, 4, 1024),
    "base": (768, 12, 12, 3072),
    "large": (1024, 24, 16, 4096),
}
VOCAB = 250_002


def build(size: str, vocab: int, device: str):
    import transformers

    from modsent.methods.mexma.model import MEXMAModel, UnmaskingHead

    hidden, layers, heads, intermediate = SIZES[size]
    config = transformers.XLMRobertaConfig(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers,
                                           num_attention_heads=heads, intermediate_size=intermediate,
                                           max_position_embeddings=514)
    config._attn_implementation = "sdpa"
    body = transformers.XLMRobertaModel(config, add_pooling_layer=False)
    head = UnmaskingHead(config, 6, 8, 3072 if size != "small" else intermediate, body.get_input_embeddings())
    return MEXMAModel(body, head).to(device)


def batch(pairs: int, seq_len: int, vocab: int, generator: torch.Generator):
    """One side (ids, masked ids, labels, attention mask) on the host, as the trainer's data
    preparation leaves it (:func:`modsent.methods.mexma.training.step_batches`)."""
    ids = torch.randint(5, vocab, (pairs, seq_len), generator=generator)
    ids[:, 0], ids[:, -1] = 0, 2
    chosen = torch.rand(ids.shape, generator=generator) < 0.4
    chosen[:, 0] = chosen[:, -1] = False
    labels = torch.where(chosen, ids, torch.full_like(ids, -100))
    masked = torch.where(chosen, torch.full_like(ids, 3), ids)
    mask = torch.ones_like(ids)
    return [ids, masked, labels, mask]


def modsent_loss(model, a, b, loss_chunk_rows=None):
    """The trainer's own step: each side sent by ``_on_device`` (ids without blocking, labels left
    on the host, the attention mask decided from the host's copy: none when there is no padding)
    and the loss of its ``Objective`` with the default weights (and ``loss_chunk_rows``)."""
    from modsent.methods.mexma.training import MEXMAConfig, Objective, _on_device, _share

    device = next(model.parameters()).device
    config = model.body.config
    sides = []
    for side in (a, b):
        share = _share(side, slice(None), device)  # pinned for a GPU, as prepared ahead on a thread
        sides.append(_on_device(share, device, config))
    counts = (int((a[2] != -100).sum()), int((b[2] != -100).sum()))
    objective = Objective(MEXMAConfig(loss_chunk_rows=loss_chunk_rows))
    backward, _ = objective(model, sides[0], sides[1], counts, len(a[0]), 1)
    return backward


def plain_loss(model, a, b):
    """The plain way: every tensor copied to the device as it is, four forward calls, the
    projection over every position."""
    from modsent.losses import KoLeoLoss

    device = next(model.parameters()).device
    a, b = [t.to(device) for t in a], [t.to(device) for t in b]
    body = model.body
    s_a = body(input_ids=a[0], attention_mask=a[3]).last_hidden_state[:, 0]
    s_b = body(input_ids=b[0], attention_mask=b[3]).last_hidden_state[:, 0]
    h_a = body(input_ids=a[1], attention_mask=a[3]).last_hidden_state
    h_b = body(input_ids=b[1], attention_mask=b[3]).last_hidden_state
    head_a = model.head(torch.cat([s_b.unsqueeze(1), h_a[:, 1:]], 1), a[3])
    head_b = model.head(torch.cat([s_a.unsqueeze(1), h_b[:, 1:]], 1), b[3])
    vocab = model.head.bias.shape[0]
    mlm = sum(torch.nn.functional.cross_entropy(model.head.logits(h).float().reshape(-1, vocab), lab.reshape(-1))
              for h, lab in ((head_a, a[2]), (head_b, b[2])))
    s_a, s_b = s_a.float(), s_b.float()
    return torch.nn.functional.mse_loss(s_a, s_b) + 0.5 * mlm + 0.005 * (KoLeoLoss()(s_a) + KoLeoLoss()(s_b))


def flops_per_pair(model, seq_len: int, masked: float) -> float:
    def non_embedding(module):
        return sum(p.numel() for n, p in module.named_parameters() if "embeddings" not in n)

    cfg = model.body.config
    hidden, layers = cfg.hidden_size, cfg.num_hidden_layers
    encoder = 4 * seq_len * (6 * non_embedding(model.body) + 12 * layers * hidden * seq_len)
    head_layers = model.head.config.num_hidden_layers
    head = 2 * seq_len * (6 * non_embedding(model.head.encoder) + 12 * head_layers * hidden * seq_len)
    projection = 2 * masked * seq_len * 6 * hidden * model.head.bias.shape[0]
    return encoder + head + projection


def measure(model, loss_fn, batches, device: str, steps: int) -> tuple[float, float]:
    """(median seconds per step, peak GiB) over ``steps`` steps after one warm-up step."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=device.startswith("cuda"))
    times = []
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    for i in range(steps + 1):
        a, b = batches[i % len(batches)]
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        start = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=device.startswith("cuda")):
            loss = loss_fn(model, a, b)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.2)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        if i:
            times.append(time.perf_counter() - start)
    peak = torch.cuda.max_memory_allocated() / 2**30 if device.startswith("cuda") else float("nan")
    del optimizer
    return statistics.median(times), peak


def check_options(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """What the options' types cannot check (tests/test_gpu_blocks.py runs it on gpu.sh's lines)."""
    if args.loss_chunk_rows is not None and args.loss_chunk_rows < 1:
        parser.error(f"--loss-chunk-rows: {args.loss_chunk_rows}; expected a positive number of positions")
    if args.compile and len(args.seq_len) > 1:
        parser.error("--compile compiles the body in place: give one --seq-len (the eager runs of a "
                     "second length would be compiled)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", choices=list(SIZES), default="small")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--seq-len", type=int, nargs="+", default=[32])
    parser.add_argument("--pairs", type=int, default=None, help="pairs per step (default: 8 on the CPU, 64 on a GPU)")
    parser.add_argument("--vocab", type=int, default=None, help="vocabulary (default: 250,002; 32,000 for small)")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--peak-tflops", type=float, default=989.0)
    parser.add_argument("--compile", action="store_true",
                        help="also time modsent's step with the encoder body compiled as methods.MEXMA.compile: true "
                             "compiles it (fastpath.compile_in_place, dynamic sizes; needs Triton or a C++ compiler)")
    parser.add_argument("--triton", action="store_true",
                        help="also time modsent's step with the unmasking loss's cross-entropy as a Triton kernel "
                             "(methods.MEXMA.kernels: triton; on the CPU in Triton's interpreter, no speed there)")
    parser.add_argument("--gradient-checkpointing", action="store_true",
                        help="also time modsent's step with each layer run again in the backward "
                             "(methods.MEXMA.gradient_checkpointing), and with --loss-chunk-rows both, "
                             "with --compile compiled too")
    parser.add_argument("--loss-chunk-rows", type=int, default=None, metavar="R",
                        help="also time modsent's step with the unmasking loss R masked positions at a time, no "
                             "logits kept (methods.MEXMA.loss_chunk_rows: R), and with --triton both")
    args = parser.parse_args()
    check_options(parser, args)
    device = args.device
    if args.triton:
        if not device.startswith("cuda"):
            os.environ.setdefault("TRITON_INTERPRET", "1")  # the CPU: Triton's interpreter, before Triton is imported
        from modsent.training import kernels

        if not kernels.runs_on(device):
            parser.error(f"--triton: Triton's kernels cannot run on {device} here (Triton installed?)")
    pairs = args.pairs or (64 if device.startswith("cuda") else 8)
    vocab = args.vocab or (32_000 if args.size == "small" else VOCAB)
    torch.manual_seed(0)
    model = build(args.size, vocab, device)
    compiled = False
    n = sum(p.numel() for p in model.parameters())
    name = torch.cuda.get_device_name() if device.startswith("cuda") else "CPU"
    print(f"MEXMA step, random {args.size} encoder ({n / 1e6:.0f}M parameters with the head), {pairs} pairs, "
          f"{device} ({name}), torch {torch.__version__}")
    for seq_len in args.seq_len:
        generator = torch.Generator().manual_seed(seq_len)
        batches = [(batch(pairs, seq_len, vocab, generator), batch(pairs, seq_len, vocab, generator))
                   for _ in range(3)]
        results = {}
        chunks = args.loss_chunk_rows

        def chunked(model, a, b):
            return modsent_loss(model, a, b, chunks)

        runs = ([("modsent", modsent_loss), ("plain", plain_loss)] + ([("triton", modsent_loss)] if args.triton else [])
                + ([("chunked", chunked)] if chunks else [])
                + ([("tri+chunk", chunked)] if chunks and args.triton else [])
                + ([("ckpt", modsent_loss)] if args.gradient_checkpointing else [])
                + ([("ckpt+chunk", chunked)] if args.gradient_checkpointing and chunks else [])
                + ([("compiled", modsent_loss)] if args.compile else [])
                + ([("ckpt+compiled", modsent_loss)] if args.compile and args.gradient_checkpointing else []))
        for label, loss_fn in runs:
            if label == "compiled" and not compiled:  # last: the eager runs above use the same model
                fastpath.compile_in_place(model.body, device, "--compile", dynamic=None)
                compiled = True
            if label == "ckpt+compiled":  # compiled again as the trainers compile a checkpointed body
                fastpath.compile_in_place(model.body, device, "--compile", dynamic=None, eager_random=True)
            fastpath.fuse_cross_entropy(model.head, label in ("triton", "tri+chunk"))  # as kernels: triton does
            checkpoint_activations(model, label.startswith("ckpt"))  # as gradient_checkpointing: true does
            try:
                results[label] = measure(model, loss_fn, batches, device, args.steps)
            except torch.OutOfMemoryError:  # (nan: the lines below print it so)
                results[label] = (float("nan"), float("nan"))
                model.zero_grad(set_to_none=True)  # the failed step's gradients: not in the next run's peak
                torch.cuda.empty_cache()
        flops = flops_per_pair(model, seq_len, 0.4 * (seq_len - 2) / seq_len) * pairs
        for label, (seconds, peak) in results.items():
            line = (f"seq {seq_len:4d} {label:13s} {seconds * 1000:9.1f} ms/step  {pairs / seconds:8.1f} pairs/s  "
                    f"{4 * pairs * seq_len / seconds:10.0f} tokens/s")
            if device.startswith("cuda"):
                line += f"  MFU {100 * flops / seconds / (args.peak_tflops * 1e12):5.1f}%  peak {peak:5.1f} GiB"
            print(line)
        print(f"seq {seq_len:4d} speed-up of modsent's step over the plain one: "
              f"{results['plain'][0] / results['modsent'][0]:.2f}x")
        if "triton" in results:
            print(f"seq {seq_len:4d} speed-up of the Triton cross-entropy (methods.MEXMA.kernels: triton) over "
                  f"modsent's eager step: {results['modsent'][0] / results['triton'][0]:.2f}x")
        for label, what in (("ckpt", "every layer run again in the backward, methods.MEXMA.gradient_checkpointing"),
                            ("ckpt+chunk", "that and the loss in chunks")):
            if label in results:
                memory = (f", peak {results[label][1]:.1f} GiB against {results['modsent'][1]:.1f}"
                          if device.startswith("cuda") else "")
                print(f"seq {seq_len:4d} {what}: {results['modsent'][0] / results[label][0]:.2f}x the speed of "
                      f"modsent's step{memory}")
        for label, what in (("chunked", "eager"), ("tri+chunk", "Triton")):
            whole = results["modsent" if label == "chunked" else "triton"] if label in results else None
            if whole:
                memory = (f", peak {results[label][1]:.1f} GiB against {whole[1]:.1f}" if device.startswith("cuda")
                          else "")
                print(f"seq {seq_len:4d} the unmasking loss in chunks of {chunks} positions ({what} cross-entropy, "
                      f"methods.MEXMA.loss_chunk_rows): {whole[0] / results[label][0]:.2f}x the speed of the whole "
                      f"loss's step{memory}")
        if "compiled" in results:
            print(f"seq {seq_len:4d} speed-up of the compiled body (methods.MEXMA.compile) over modsent's eager step: "
                  f"{results['modsent'][0] / results['compiled'][0]:.2f}x (first step of a size, compiling, not timed)")
        if "ckpt+compiled" in results:
            memory = (f", peak {results['ckpt+compiled'][1]:.1f} GiB against {results['ckpt'][1]:.1f}"
                      if device.startswith("cuda") else "")
            print(f"seq {seq_len:4d} the compiled body with every layer run again in the backward (compile and "
                  f"gradient_checkpointing; its dropout by eager's kernels): "
                  f"{results['ckpt'][0] / results['ckpt+compiled'][0]:.2f}x the speed of the eager checkpointed "
                  f"step{memory}")


if __name__ == "__main__":
    main()

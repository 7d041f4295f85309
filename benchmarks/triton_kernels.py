"""modsent's Triton kernels (modsent.training.kernels) against the eager layers they replace, as
the LA runs them, forward and backward, measured side by side.

    python benchmarks/triton_kernels.py --device cuda            # 128 x 256 tokens, LaBSE's width
    python benchmarks/triton_kernels.py --device cuda --tiles 64x8x8/32x8x8 128x8x8/64x8x4 --norm-tiles 4x8 2x4
    python benchmarks/triton_kernels.py --device cuda --parts lora --qkv-tiles 32x8x8/16x8x8 64x4x4/16x8x4
    python benchmarks/triton_kernels.py --tokens 512 --width 96 --steps 2   # the CPU: Triton's interpreter,
                                                                           # a check that it runs, no speed
    python benchmarks/triton_kernels.py --ptxas --tiles 64x32x4/64x16x8 --norm-tiles 8x4   # no GPU needed

Three parts (--parts):

- lora: three LoRA layers (r 8, alpha 16, dropout 0.1: the LA's query, key and value) read one
  input of --tokens x --width, as the attention's projections do; the input needs a gradient (the
  embeddings below it train). PEFT's layers, modsent's fast forward (the LA's step), the fast
  forward with fastpath.fuse_lora_dropout's kernels for each layer alone (kernels.lora_linear),
  and for the three together (kernels.lora_linears, what the LA runs: one read of the input
  forward, one pass over its gradient backward); --tiles tries other tiles for the kernels of
  one layer, --qkv-tiles for those of the three (DOWN/UP, each ROWSxGROUPSxWARPS: rows of a tile,
  groups of 8 columns, warps; UP may add xPROGRAMS, the backward's programs per multiprocessor,
  2 by default).
- norm: one attention output module (BertSelfOutput: its frozen dense product, dropout 0.1,
  residual add, frozen LayerNorm) with the LA's bf16 residual stream: the module's own ops and
  fastpath.fuse_residual_norms(kernel="triton") (kernels.dropout_add_norm); --norm-tiles tries
  other tiles (ROWSxWARPS).
- ce: the MLM loss of --ce-rows masked positions (15% of 128 x 256 tokens) over a --vocab word
  vocabulary from bf16 logits (the tied decoder's output under autocast), averaged: eager's
  F.cross_entropy of the logits in fp32 (modsent's step) and kernels.cross_entropy (what
  fastpath.fuse_cross_entropy runs); --ce-tiles tries other tiles (COLUMNSxWARPS).

Inputs are bf16 under bf16 autocast on a GPU (fp32 on the CPU). Each step runs the forward and the
backward from fixed output gradients; the time is per step, the median of --repeats runs of
--steps steps with one wait at the end. "kept MiB" is what the forward saves for the backward
(autograd's saved tensors, each storage once, besides the parameters and their cached casts; an
input counts where it is saved). Before the timing, each kernel's outputs and gradients are
checked against the eager computation with the dropout masks the kernel drew.

--ptxas compiles the kernels for a Hopper GPU (compute capability 9.0) with Triton's compiler and
the ptxas in Triton's wheel, and prints each tile's registers, spilled bytes and shared memory
(kernels.hopper_report): what a GPU's occupancy will be, without a GPU.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def tiles(spec: str) -> tuple[tuple[int, int, int], tuple[int, int, int, int]]:
    try:
        down, up = (tuple(int(n) for n in part.split("x")) for part in spec.split("/"))
        if len(down) != 3 or len(up) not in (3, 4):
            raise ValueError
    except ValueError:
        raise argparse.ArgumentTypeError(f"{spec!r}: expected DOWN/UP, ROWSxGROUPSxWARPS each, UP with "
                                         f"xPROGRAMS per multiprocessor if not 2 (64x8x8/32x8x8x4)")
    return down, up + (2,) * (4 - len(up))


def two_numbers(spec: str, expected: str, power_of_two: bool = False) -> tuple[int, int]:
    """``AxB`` as (A, B) (A a power of 2 where asked), else an argparse error saying ``expected``."""
    try:
        first, second = (int(n) for n in spec.split("x"))
        if power_of_two and first & (first - 1):
            raise ValueError
    except ValueError:
        raise argparse.ArgumentTypeError(f"{spec!r}: expected {expected}")
    return first, second


def norm_tiles(spec: str) -> tuple[int, int]:
    return two_numbers(spec, "ROWSxWARPS (4x8)")


def ce_tiles(spec: str) -> tuple[int, int]:
    return two_numbers(spec, "COLUMNSxWARPS, COLUMNS a power of 2 (2048x8)", power_of_two=True)


def label(tile) -> str:
    return "x".join(map(str, tile))


def ptxas_report(args) -> None:
    os.environ["TRITON_INTERPRET"] = "0"  # compiled kernels, before Triton is imported
    from modsent.training import kernels

    default = dict(kernels.TILES)
    print(f"the kernels compiled for compute capability 9.0, width {args.width}, rank {args.rank}, bf16: "
          f"registers / spilled bytes per thread, shared KiB per program")
    lora = [(default["down"], default["up"])] + args.tiles
    qkv = [(default["down_qkv"], default["up_qkv"])] + args.qkv_tiles
    norm = [default["norm"]] + args.norm_tiles
    ce = [default["ce"]] + args.ce_tiles
    for index in range(max(len(lora), len(qkv), len(norm), len(ce))):
        down, up = lora[min(index, len(lora) - 1)]
        down_qkv, up_qkv = qkv[min(index, len(qkv) - 1)]
        kernels.TILES.update(down=down, up=up, down_qkv=down_qkv, up_qkv=up_qkv, norm=norm[min(index, len(norm) - 1)],
                             ce=ce[min(index, len(ce) - 1)])
        report = kernels.hopper_report(args.width, args.rank, vocab=args.vocab)
        cells = [f"{name} {label(tile):>8s}: {report[name]['registers']:3d} / {report[name]['spill_bytes']:4d} / "
                 f"{report[name]['shared_bytes'] / 1024:5.1f}"
                 for name, tile in (("down", down), ("up", up), ("down_qkv", down_qkv), ("up_qkv", up_qkv),
                                    ("norm_forward", kernels.TILES["norm"]), ("norm_backward", kernels.TILES["norm"]),
                                    ("ce_forward", kernels.TILES["ce"]), ("ce_backward", kernels.TILES["ce"]))]
        print("   ".join(cells) + ("   (the default tiles)" if index == 0 else ""), flush=True)


def relative_errors(got, want, dtype) -> list[float]:
    """Each pair's largest difference over the largest value; the run stops (before timing) where
    one is larger than the dtype's rounding explains."""
    import torch

    errors = [float((g.detach().float() - w.detach().float()).abs().max() / w.detach().float().abs().max())
              for g, w in zip(got, want)]
    bound = 1e-4 if dtype == torch.float32 else 5e-2
    if not all(error < bound for error in errors):  # also a NaN
        raise SystemExit(f"the kernels differ from the eager computation: relative errors {errors}, more than {bound}")
    return errors


def kept_mib(model, run) -> float:
    """MiB of the tensors ``run()`` (a forward) saves for its backward, counted once each, besides
    the parameters and their cached casts (which live on anyway). An input counts where it is
    saved: in the LA the LoRA layers' input is a LayerNorm's output, which nothing else keeps."""
    from benchmarks.la_graphs import saved_storage

    alive = {p.untyped_storage().data_ptr() for p in model.parameters()}
    for module in model.modules():
        for cast in (module.__dict__.get("_modsent_cast") or (None, ()))[1]:
            if cast is not None:
                alive.add(cast.untyped_storage().data_ptr())
    return sum(saved_storage(run, frozenset(alive)).values()) / 2**20


def timed(args, step, cuda: bool) -> float:
    """ms per ``step()``: two warm-up steps (Triton compiles), then the median of --repeats runs."""
    import torch

    for _ in range(2):
        step()
    times = []
    for _ in range(args.repeats):
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(args.steps):
            step()
        if cuda:
            torch.cuda.synchronize()
        times.append((time.perf_counter() - start) / args.steps)
    return statistics.median(times) * 1e3


def tile_table(args, cuda: bool, step, forward, owner, key: str, variants: dict, switch) -> None:
    """Time ``step`` for each of ``variants`` ({name: the kernel's tile, or None: eager}) and print
    ms per step, the ratio to the first and what ``forward`` keeps for the backward (besides
    ``owner``'s parameters): ``switch(on)`` turns the kernel on or off, ``kernels.TILES[key]`` takes
    the tile (the defaults back afterwards)."""
    from modsent.training import kernels

    print(f"{'variant':56s} {'ms/step':>8s} {'ratio':>6s} {'kept MiB':>9s}")
    base = None
    default = dict(kernels.TILES)
    for name, tile in variants.items():
        switch(tile is not None)
        kernels.TILES[key] = tile or default[key]
        ms = timed(args, step, cuda)
        kept = kept_mib(owner, forward)
        base = base or ms
        print(f"{name:56s} {ms:8.3f} {base / ms:6.2f} {kept:9.2f}", flush=True)
    kernels.TILES.update(default)


def lora_part(args, cuda: bool, dtype, autocast) -> None:
    import torch
    from peft import LoraConfig, get_peft_model
    from torch import nn

    from modsent.training import fastpath, kernels

    names = ("query", "key", "value")[:args.layers]

    class Projections(nn.Module):  # an attention's (fuse_lora_dropout groups the LoRA layers named so)
        def __init__(self):
            super().__init__()
            for name in names:
                setattr(self, name, nn.Linear(args.width, args.width))

        def forward(self, x):
            return [getattr(self, name)(x) for name in names]

    torch.manual_seed(0)
    model = get_peft_model(Projections(), LoraConfig(r=args.rank, lora_alpha=2 * args.rank, lora_dropout=args.dropout,
                                                     target_modules=list(names)))
    for name, param in model.named_parameters():
        if "lora_B" in name:
            nn.init.normal_(param, std=0.02)
    model = model.to(args.device).train()
    x = torch.randn(args.tokens, args.width, device=args.device, dtype=dtype, requires_grad=True)
    grads = [torch.randn(args.tokens, args.width, device=args.device, dtype=dtype) for _ in range(args.layers)]
    params = [x] + [p for p in model.parameters() if p.requires_grad]

    def forward():
        with autocast:
            return model(x)

    def step():
        torch.autograd.backward(forward(), grads)
        for p in params:
            p.grad = None

    print(f"\n== lora: {args.layers} LoRA layers (r {args.rank}, dropout {args.dropout}) on one {args.tokens} x "
          f"{args.width} input")
    layer = next(module for module in model.modules() if hasattr(module, "lora_dropout"))
    weight, bias = (t.to(dtype) for t in (layer.base_layer.weight, layer.base_layer.bias))
    lora_a, lora_b = layer.lora_A["default"].weight, layer.lora_B["default"].weight
    scaling = layer.scaling["default"]
    xs = x.detach().clone().requires_grad_(True)
    out = kernels.lora_linear(xs, lora_a, lora_b, weight, bias, scaling, args.dropout, seed=5)
    got = (out, *torch.autograd.grad(out, (xs, lora_a, lora_b), grads[0]))
    keep = kernels.dropout_mask(tuple(x.shape), args.dropout, 5, args.device)
    xr = x.detach().clone().requires_grad_(True)
    ref = kernels.reference(xr, lora_a, lora_b, weight, bias, scaling, args.dropout, keep)
    want = (ref, *torch.autograd.grad(ref, (xr, lora_a, lora_b), grads[0]))
    print("the kernels against PEFT's layer with their masks, max relative error: output {:.1e}, input gradient "
          "{:.1e}, A {:.1e}, B {:.1e}; dropped {:.4f}".format(*relative_errors(got, want, dtype), float((~keep).float().mean())))
    layers = [module for module in model.modules() if hasattr(module, "lora_dropout")]
    specs = [(m.lora_A["default"].weight, m.lora_B["default"].weight, *(t.to(dtype) for t in
              (m.base_layer.weight, m.base_layer.bias)), m.scaling["default"]) for m in layers]
    outs = kernels.lora_linears(xs, specs, args.dropout, seeds=[5 + i for i in range(len(specs))])
    adapters = [t for spec in specs for t in spec[:2]]
    got = (*outs, *torch.autograd.grad(outs, (xs, *adapters), grads[:len(outs)]))
    refs = [kernels.reference(xr, *spec[:4], spec[4], args.dropout,
                              kernels.dropout_mask(tuple(x.shape), args.dropout, 5 + i, args.device))
            for i, spec in enumerate(specs)]
    want = (*refs, *torch.autograd.grad(refs, (xr, *adapters), grads[:len(refs)]))
    errors = relative_errors(got, want, dtype)
    print(f"the {len(specs)} layers through one kernel each way against PEFT's layers with their masks, max relative "
          f"error: outputs {max(errors[:len(specs)]):.1e}, input gradient {errors[len(specs)]:.1e}, adapters "
          f"{max(errors[len(specs) + 1:]):.1e}")

    variants = {"PEFT": (False, False, False, None), "fast (modsent's step)": (True, False, False, None),
                "fast, Triton LoRA, each layer alone": (True, True, False, None),
                "fast, Triton LoRA, the layers together (the LA's)": (True, True, True, None)}
    for down, up in args.tiles:
        variants[f"fast, Triton LoRA, alone, tiles {label(down)}/{label(up)}"] = (True, True, False, {"down": down,
                                                                                                      "up": up})
    if args.layers == 1:  # nothing to group
        del variants["fast, Triton LoRA, the layers together (the LA's)"]
    for down, up in args.qkv_tiles if args.layers > 1 else ():
        variants[f"fast, Triton LoRA, together, tiles {label(down)}/{label(up)}"] = (True, True, True, {
            "down_qkv": down, "up_qkv": up})
    print(f"{'variant':56s} {'ms/step':>8s} {'ratio':>6s} {'kept MiB':>9s}")
    base = None
    default = dict(kernels.TILES)
    for name, (fast, fused, shared, tile) in variants.items():
        (fastpath.speed_up if fast else fastpath.restore)(model)
        fastpath.fuse_lora_dropout(model, False)
        fastpath.fuse_lora_dropout(model, fused, shared_input=shared)
        kernels.TILES.update(default if tile is None else tile)
        ms = timed(args, step, cuda)
        kept = kept_mib(model, forward)
        base = base or ms
        print(f"{name:56s} {ms:8.3f} {base / ms:6.2f} {kept:9.2f}", flush=True)
    kernels.TILES.update(default)


def norm_part(args, cuda: bool, dtype, autocast) -> None:
    import torch
    import transformers

    from modsent.training import fastpath, kernels

    config = transformers.BertConfig(hidden_size=args.width, num_attention_heads=max(1, args.width // 64),
                                     hidden_dropout_prob=args.dropout)
    torch.manual_seed(0)
    module = transformers.models.bert.modeling_bert.BertSelfOutput(config).to(args.device).train()
    module.requires_grad_(False)  # the LA's: the attention output's dense and LayerNorm are frozen
    if cuda:
        fastpath.bf16_residual_stream(module)  # the LA's bf16 stream: the LayerNorm returns bf16
    fastpath.speed_up(module)
    hidden = torch.randn(args.tokens, args.width, device=args.device, dtype=dtype, requires_grad=True)
    residual = torch.randn(args.tokens, args.width, device=args.device, dtype=dtype, requires_grad=True)
    grad = torch.randn(args.tokens, args.width, device=args.device, dtype=dtype)

    def forward():
        with autocast:
            return module(hidden, residual)

    def step():
        forward().backward(grad)
        hidden.grad = residual.grad = None

    print(f"\n== norm: dropout {args.dropout} + residual add + LayerNorm after a frozen {args.width} x {args.width} "
          f"product, {args.tokens} rows{', the bf16 stream' if cuda else ''}")
    with torch.no_grad(), autocast:
        dense = module.dense(hidden)
    out_dtype = dtype
    norm = module.LayerNorm
    weight, bias = (t.to(out_dtype) for t in (norm.weight, norm.bias))
    inputs = [t.detach().clone().requires_grad_(True) for t in (dense, residual)]
    out = kernels.dropout_add_norm(*inputs, weight, bias, norm.eps, args.dropout, out_dtype, seed=5)
    got = (out, *torch.autograd.grad(out, inputs, grad))
    keep = kernels.dropout_mask(tuple(dense.shape), args.dropout, 5, args.device)
    refs = [t.detach().clone().requires_grad_(True) for t in (dense, residual)]
    ref = kernels.norm_reference(*refs, weight, bias, norm.eps, args.dropout, out_dtype, keep)
    want = (ref, *torch.autograd.grad(ref, refs, grad))
    print("the kernel against the three steps with its mask, max relative error: output {:.1e}, dropout's input "
          "gradient {:.1e}, residual's {:.1e}".format(*relative_errors(got, want, dtype)))

    variants = {"the module's ops (modsent's step)": None, "Triton norm": kernels.TILES["norm"]}
    for tile in args.norm_tiles:
        variants[f"Triton norm, tiles {label(tile)}"] = tile
    tile_table(args, cuda, step, forward, module, "norm", variants,
               lambda on: fastpath.fuse_residual_norms(module, args.device, "--parts norm", on, kernel="triton"))


def ce_part(args, cuda: bool, dtype) -> None:
    import torch
    from torch import nn

    from modsent.training import fastpath, kernels

    generator = torch.Generator().manual_seed(0)
    logits = (torch.randn(args.ce_rows, args.vocab, generator=generator) * 2).to(args.device, dtype)
    logits.requires_grad_(True)
    targets = torch.randint(0, args.vocab, (args.ce_rows,), generator=generator).to(args.device)
    head = nn.Module()  # what fuse_cross_entropy marks: an MLM head

    def forward():
        return fastpath.mlm_cross_entropy(head, logits, targets, "mean")

    def step():
        forward().backward()
        logits.grad = None

    print(f"\n== ce: the MLM loss of {args.ce_rows} masked positions over {args.vocab} words, "
          f"{str(dtype).replace('torch.', '')} logits, averaged")
    loss = kernels.cross_entropy(logits, targets).mean()
    got = (loss, *torch.autograd.grad(loss, logits))
    ref = nn.functional.cross_entropy(logits.float(), targets)
    want = (ref, *torch.autograd.grad(ref, logits))
    print("the kernels against F.cross_entropy, max relative error: loss {:.1e}, logits' gradient {:.1e}".format(
        *relative_errors(got, want, dtype)))
    variants = {"F.cross_entropy in fp32 (modsent's step)": None, "Triton cross-entropy": kernels.TILES["ce"]}
    for tile in args.ce_tiles:
        variants[f"Triton cross-entropy, tiles {label(tile)}"] = tile
    tile_table(args, cuda, step, forward, head, "ce", variants,
               lambda on: fastpath.fuse_cross_entropy(head, on))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--parts", nargs="+", choices=("lora", "norm", "ce"), default=["lora", "norm", "ce"])
    parser.add_argument("--tokens", type=int, default=128 * 256)
    parser.add_argument("--width", type=int, default=768)
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--dropout", type=float, default=0.1)
    parser.add_argument("--layers", type=int, default=3, choices=(1, 2, 3),
                        help="LoRA layers reading the one input (query, key, value)")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tiles", type=tiles, nargs="+", default=[], metavar="DOWN/UP")
    parser.add_argument("--qkv-tiles", type=tiles, nargs="+", default=[], metavar="DOWN/UP",
                        help="tiles of the kernels for the layers together")
    parser.add_argument("--norm-tiles", type=norm_tiles, nargs="+", default=[], metavar="ROWSxWARPS")
    parser.add_argument("--ce-rows", type=int, default=4915, help="masked positions (15%% of 128 x 256 tokens)")
    parser.add_argument("--vocab", type=int, default=50_000, help="the MLM head's words")
    parser.add_argument("--ce-tiles", type=ce_tiles, nargs="+", default=[], metavar="COLUMNSxWARPS")
    parser.add_argument("--ptxas", action="store_true", help="compile for a Hopper GPU and report, run nothing")
    args = parser.parse_args()
    if args.ptxas:
        return ptxas_report(args)
    cuda = args.device.startswith("cuda")
    if not cuda:
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before Triton is imported

    import torch

    dtype = torch.bfloat16 if cuda else torch.float32
    autocast = torch.autocast(args.device.split(":")[0], dtype=torch.bfloat16, enabled=cuda)
    name = torch.cuda.get_device_name() if cuda else "CPU (Triton's interpreter: no speed)"
    print(f"device {args.device} ({name}); torch {torch.__version__}; {str(dtype).replace('torch.', '')} inputs")
    if "lora" in args.parts:
        lora_part(args, cuda, dtype, autocast)
    if "norm" in args.parts:
        norm_part(args, cuda, dtype, autocast)
    if "ce" in args.parts:
        ce_part(args, cuda, dtype)


if __name__ == "__main__":
    main()

"""LoRA layers with dropout, forward and backward, as the LA runs them: PEFT's, modsent's fast
forward, and the Triton kernels of modsent.training.lora_kernels, measured side by side.

    python benchmarks/lora_kernels.py --device cuda                  # the LA's q/k/v at 128 x 256 tokens
    python benchmarks/lora_kernels.py --device cuda --tiles 64x32x4/64x16x8 128x32x8/32x16x4
    python benchmarks/lora_kernels.py --tokens 512 --width 96 --steps 2   # the CPU: Triton's interpreter,
                                                                          # a check that it runs, no speed
    python benchmarks/lora_kernels.py --ptxas --tiles 64x8x8/32x8x8 64x32x4/64x16x8   # no GPU needed

--ptxas compiles the kernels for a Hopper GPU (compute capability 9.0) with Triton's compiler and
the ptxas in Triton's wheel, and prints each tile's registers, spilled bytes and shared memory
(lora_kernels.hopper_report): what a GPU's occupancy will be, without a GPU.

Three LoRA layers (r 8, alpha 16, dropout 0.1: the LA's query, key and value) read one input of
--tokens x --width in bf16 under autocast (fp32 on the CPU), as the attention's projections
do; the input needs a gradient (the embeddings below it train). Each step runs their forward and
their backward from fixed output gradients; the time is per step of the three layers, the median
of --repeats runs of --steps steps with one wait at the end. "kept MiB" is what the forward
saves for the backward (autograd's saved tensors, each storage once, besides the parameters
and their cached casts; the input counts where it is saved). Before the timing, the kernels' outputs and
gradients are checked against PEFT's layer computed with the masks the kernels drew
(lora_kernels.reference). --tiles tries other tiles for the fused variant (down/up, each
ROWSxGROUPSxWARPS: rows of a tile, groups of 8 columns, warps; lora_kernels.TILES).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def tiles(spec: str) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    try:
        down, up = (tuple(int(n) for n in part.split("x")) for part in spec.split("/"))
        if len(down) != 3 or len(up) != 3:
            raise ValueError
    except ValueError:
        raise argparse.ArgumentTypeError(f"{spec!r}: expected DOWN/UP, each ROWSxGROUPSxWARPS (64x32x4/64x16x8)")
    return down, up


def kept_mib(model, x, autocast) -> float:
    """MiB of the tensors a forward saves for its backward, counted once each, besides the
    parameters and their cached casts (which live on anyway). The input counts where it is saved:
    in the LA it is a LayerNorm's output, which nothing else keeps."""
    import torch

    alive = {p.untyped_storage().data_ptr() for p in model.parameters()}
    for module in model.modules():
        for cast in (module.__dict__.get("_modsent_cast") or (None, ()))[1]:
            if cast is not None:
                alive.add(cast.untyped_storage().data_ptr())
    saved = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in alive:
            saved[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor), autocast:
        model(x)
    return sum(saved.values()) / 2**20


def ptxas_report(args) -> None:
    os.environ["TRITON_INTERPRET"] = "0"  # compiled kernels, before Triton is imported
    from modsent.training import lora_kernels

    default = dict(lora_kernels.TILES)
    print(f"the kernels compiled for compute capability 9.0, width {args.width}, rank {args.rank}, bf16: "
          f"registers / spilled bytes per thread, shared KiB per program")
    for down, up in [(default["down"], default["up"])] + args.tiles:
        lora_kernels.TILES.update(down=down, up=up)
        report = lora_kernels.hopper_report(args.width, args.rank)
        print(f"down {'x'.join(map(str, down)):>8s}: {report['down']['registers']:3d} / {report['down']['spill_bytes']:4d} / "
              f"{report['down']['shared_bytes'] / 1024:5.1f}   up {'x'.join(map(str, up)):>8s}: "
              f"{report['up']['registers']:3d} / {report['up']['spill_bytes']:4d} / {report['up']['shared_bytes'] / 1024:5.1f}"
              + ("   (the default tiles)" if (down, up) == (default["down"], default["up"]) else ""), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--tokens", type=int, default=128 * 256)
    parser.add_argument("--width", type=int, default=768)
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--dropout", type=float, default=0.1)
    parser.add_argument("--layers", type=int, default=3, help="LoRA layers reading the one input")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tiles", type=tiles, nargs="+", default=[], metavar="DOWN/UP")
    parser.add_argument("--ptxas", action="store_true", help="compile for a Hopper GPU and report, run nothing")
    args = parser.parse_args()
    if args.ptxas:
        return ptxas_report(args)
    cuda = args.device.startswith("cuda")
    if not cuda:
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before Triton is imported

    import torch
    from peft import LoraConfig, get_peft_model
    from torch import nn

    from modsent.training import fastpath, lora_kernels

    class Projections(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = nn.ModuleList(nn.Linear(args.width, args.width) for _ in range(args.layers))

        def forward(self, x):
            return [layer(x) for layer in self.proj]

    torch.manual_seed(0)
    model = get_peft_model(Projections(), LoraConfig(r=args.rank, lora_alpha=2 * args.rank, lora_dropout=args.dropout,
                                                     target_modules=[f"proj.{i}" for i in range(args.layers)]))
    for name, param in model.named_parameters():
        if "lora_B" in name:
            nn.init.normal_(param, std=0.02)
    model = model.to(args.device).train()
    dtype = torch.bfloat16 if cuda else torch.float32
    x = torch.randn(args.tokens, args.width, device=args.device, dtype=dtype, requires_grad=True)
    grads = [torch.randn(args.tokens, args.width, device=args.device, dtype=dtype) for _ in range(args.layers)]
    params = [x] + [p for p in model.parameters() if p.requires_grad]
    autocast = torch.autocast(args.device.split(":")[0], dtype=torch.bfloat16, enabled=cuda)

    def step():
        with autocast:
            outs = model(x)
        torch.autograd.backward(outs, grads)
        for p in params:
            p.grad = None

    layers = [module for module in model.modules() if hasattr(module, "lora_dropout")]
    name = torch.cuda.get_device_name() if cuda else "CPU (Triton's interpreter: no speed)"
    print(f"{args.layers} LoRA layers (r {args.rank}, dropout {args.dropout}) on one {args.tokens} x {args.width} "
          f"{str(dtype).replace('torch.', '')} input; device {args.device} ({name}); torch {torch.__version__}")

    # the kernels against PEFT's layer with the masks they drew
    layer = layers[0]
    weight, bias = (t.to(dtype) for t in (layer.base_layer.weight, layer.base_layer.bias))
    lora_a, lora_b = layer.lora_A["default"].weight, layer.lora_B["default"].weight
    xs = x.detach().clone().requires_grad_(True)
    out = lora_kernels.lora_linear(xs, lora_a, lora_b, weight, bias, layer.scaling["default"], args.dropout, seed=5)
    got = (out, *torch.autograd.grad(out, (xs, lora_a, lora_b), grads[0]))
    keep = lora_kernels.dropout_mask(tuple(x.shape), args.dropout, 5, args.device)
    xr = x.detach().clone().requires_grad_(True)
    ref = lora_kernels.reference(xr, lora_a, lora_b, weight, bias, layer.scaling["default"], args.dropout, keep)
    want = (ref, *torch.autograd.grad(ref, (xr, lora_a, lora_b), grads[0]))
    errors = [float((g.detach().float() - w.detach().float()).abs().max() / w.detach().float().abs().max())
              for g, w in zip(got, want)]
    print("kernels against PEFT's layer with their masks, max relative error: output {:.1e}, "
          "input gradient {:.1e}, A {:.1e}, B {:.1e}; dropped {:.4f}".format(*errors, float((~keep).float().mean())))

    variants = {"PEFT": (False, False, None), "fast (modsent's step)": (True, False, None),
                "fast, fused LoRA dropout": (True, True, None)}
    for down, up in args.tiles:
        variants[f"fast, fused LoRA dropout, tiles {'x'.join(map(str, down))}/{'x'.join(map(str, up))}"] = (True, True, (down, up))
    print(f"{'variant':56s} {'ms/step':>8s} {'ratio':>6s} {'kept MiB':>9s}")
    base = None
    default_tiles = dict(lora_kernels.TILES)
    for label, (fast, fused, tile) in variants.items():
        (fastpath.speed_up if fast else fastpath.restore)(model)
        fastpath.fuse_lora_dropout(model, fused)
        lora_kernels.TILES.update(default_tiles if tile is None else {"down": tile[0], "up": tile[1]})
        for _ in range(2):
            step()
        if cuda:
            torch.cuda.synchronize()
        kept = kept_mib(model, x, autocast)
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            for _ in range(args.steps):
                step()
            if cuda:
                torch.cuda.synchronize()
            times.append((time.perf_counter() - start) / args.steps)
        ms = statistics.median(times) * 1e3
        base = base or ms
        print(f"{label:56s} {ms:8.3f} {base / ms:6.2f} {kept:9.2f}", flush=True)
    lora_kernels.TILES.update(default_tiles)


if __name__ == "__main__":
    main()

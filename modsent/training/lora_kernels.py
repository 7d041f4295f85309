"""A LoRA ``Linear`` with dropout as one autograd function with two Triton kernels (GPU).

PEFT's LoRA ``Linear`` computes ``base(x) + s · lora_B(lora_A(dropout(x)))``. With the
fast forward of :mod:`modsent.training.fastpath`, a training step still makes, for each such
layer, the dropout's mask and its output (a pass over the layer's input, and an input-sized
tensor and mask kept for the backward), the rank-r product of that output, then in the backward
the input-sized gradient of the dropout's output (a rank-r product), its masking (another pass)
and its sum into the input's gradient (another). The LA trains LoRA on the query, key and value
of every layer: 36 such layers, 5-6 full passes over a 32,768 x 768 tensor each per step, in a
step that is bound by such passes on a GPU (benchmarks/results/README.md).

:func:`lora_linear` computes the same layer with:

- forward: the base product (cuBLAS), one Triton kernel that draws the dropout mask in registers
  and computes ``h = dropout(x) @ A^T`` (a single read of ``x``; nothing input-sized written),
  and ``out += s · h @ B^T`` (cuBLAS, into the base product's output). Saved: ``x`` itself
  (shared by the query, key and value), ``h`` (rank r) and the random seed;
- backward: ``grad_x = g @ W`` (cuBLAS), ``u = s · g @ B`` and ``grad_B`` (rank-r products), and
  one Triton kernel that draws the same mask again and, per tile, adds ``mask · (u @ A) / (1 - p)``
  to ``grad_x`` in place and accumulates ``grad_A = u^T @ dropout(x)`` (per-block partial sums,
  added in a fixed order: deterministic).

The mask is drawn from a seed taken from PyTorch's CPU generator at each call (so a seeded run
and a resumed one, whose checkpoint holds that generator, draw the same masks) by Triton's
Philox generator: eight 16-bit draws per Philox call (one call per 8 elements instead of one
per element, as PyTorch's own dropout kernel shares its draws), so ``p`` is rounded to a
multiple of 1/65,536 (0.1 drops 6,554/65,536 = 0.1000061 of the elements) and the kept values
are scaled by the inverse of that kept share: the same distribution as ``nn.Dropout``, up to that
rounding, not the same draws. :func:`dropout_mask` returns the mask a call draws (the tests
compute the layer with it in plain PyTorch and compare outputs and gradients).

Kernels run on CUDA tensors, or on CPU tensors under Triton's interpreter (``TRITON_INTERPRET=1``
set before Triton is imported, as the tests do off a GPU; its products are computed in fp32
there: numpy has no bf16).
:func:`supported` says whether a call can use them; :func:`modsent.training.fastpath.fuse_lora_dropout`
routes LoRA layers here. Triton ships with PyTorch's CUDA wheels; the CPU install has none.
"""

from __future__ import annotations

import functools
import importlib
import os

import torch

# each kernel's tile: (rows, groups of 8 columns, warps); one Philox call draws a group's 8 masks.
# The masks do not depend on the tiles (an element's draw is fixed by its row and column), so
# benchmarks/lora_kernels.py can try other tiles on a GPU.
# The defaults keep every kernel's registers within what lets two or more programs share a
# multiprocessor without spilling, as ptxas reports for a Hopper GPU (hopper_report).
TILES = {"down": (64, 8, 8), "up": (32, 8, 8), "mask": (64, 8, 4)}
_RANK_PAD_MIN = 16  # tl.dot's smallest dimension


def interpreting() -> bool:
    """Whether Triton runs its kernels in its interpreter (on the CPU), as the tests set it off a GPU."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


@functools.cache
def triton_available() -> bool:
    try:
        importlib.import_module("triton.language")
    except ImportError:
        return False
    return True


def supported(x: torch.Tensor) -> bool:
    """Whether :func:`lora_linear` can run on ``x``'s device: a CUDA tensor with Triton
    installed, or a CPU tensor under Triton's interpreter."""
    if not triton_available():
        return False
    if x.is_cuda:
        return not interpreting()
    return x.device.type == "cpu" and interpreting()


def _kernels():
    """The module of jitted kernels (imported on first use: it imports Triton)."""
    from modsent.training import _lora_triton

    return _lora_triton


def _threshold(p: float) -> tuple[int, float]:
    """(the 16-bit draw below which an element is dropped, the kept elements' scale)."""
    if not 0.0 <= p < 1.0:
        raise ValueError(f"dropout probability {p}: expected 0 <= p < 1")
    threshold = round(p * 65536)
    return threshold, 65536.0 / (65536 - threshold)


def _groups_per_row(k: int) -> int:
    """Philox offsets a row takes: one per 8 columns (an element's draw: the call at offset
    row · this + column // 8, half column % 8 of its four 32-bit outputs, in a fixed order)."""
    return -(-k // 8)


def _rank_pad(r: int) -> int:
    return max(_RANK_PAD_MIN, 1 << (r - 1).bit_length())


def _precision(dtype: torch.dtype) -> str:
    return "ieee" if dtype == torch.float32 else "tf32"  # bf16 and fp16 products ignore it


def dropout_mask(shape: tuple[int, int], p: float, seed: int, device: torch.device | str) -> torch.Tensor:
    """The keep mask (bool, ``shape`` = (rows, columns)) that :func:`lora_linear` draws for an
    input of that shape with dropout ``p`` and ``seed``."""
    m, k = shape
    threshold, _ = _threshold(p)
    out = torch.empty(m, k, dtype=torch.int8, device=device)
    rows, groups, warps = TILES["mask"]
    if m and k:
        _kernels().mask_kernel[(-(-m // rows),)](out, m, seed, _groups_per_row(k), threshold, K=k,
                                                 G=groups, BM=rows, num_warps=warps)
    return out.bool()


def _programs(blocks: int, device: torch.device) -> int:
    """How many programs share the backward's row blocks: two per multiprocessor (each writes a
    partial sum of A's gradient, so fewer programs write fewer of them)."""
    if device.type == "cuda":
        target = 2 * torch.cuda.get_device_properties(device).multi_processor_count
    else:
        target = 4
    return max(1, min(blocks, target))


class _LoRALinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, lora_a, lora_b, weight, bias, scaling, p, seed):
        k = x.shape[-1]
        x2 = x.reshape(-1, k)
        if x2.stride(-1) != 1:
            x2 = x2.contiguous()
        m, dtype = x2.shape[0], x2.dtype
        a, b = lora_a.to(dtype).contiguous(), lora_b.to(dtype)
        r = a.shape[0]
        threshold, scale = _threshold(p)
        h = torch.empty(m, r, dtype=dtype, device=x.device)
        if m:
            rows, groups, warps = TILES["down"]
            _kernels().down_kernel[(-(-m // rows),)](
                x2, a, h, m, r, x2.stride(0), seed, _groups_per_row(k), threshold, scale, K=k,
                G=groups, BM=rows, RP=_rank_pad(r), UPCAST=interpreting(), PRECISION=_precision(dtype),
                num_warps=warps)
        out = torch.addmm(bias, x2, weight.t()) if bias is not None else x2 @ weight.t()
        out = torch.addmm(out, h, b.t(), alpha=scaling)
        ctx.save_for_backward(x2, h, a, b)
        ctx.weight, ctx.scaling, ctx.seed, ctx.p = weight, scaling, seed, p
        ctx.input_shape, ctx.lora_dtypes = x.shape, (lora_a.dtype, lora_b.dtype)
        return out.view(*x.shape[:-1], out.shape[-1])

    @staticmethod
    def backward(ctx, grad):
        x2, h, a, b = ctx.saved_tensors
        m, k = x2.shape
        r = a.shape[0]
        g = grad.reshape(-1, grad.shape[-1])
        if g.dtype != x2.dtype:
            g = g.to(x2.dtype)
        need_x, need_a, need_b = ctx.needs_input_grad[:3]
        grad_x = grad_a = grad_b = None
        if need_b:
            grad_b = (g.t() @ h).to(ctx.lora_dtypes[1]).mul_(ctx.scaling)
        if need_x or need_a:
            u = (g @ b).mul_(ctx.scaling)  # (M, r): the gradient of h, scaled
            if need_x:
                grad_x = g @ ctx.weight
                if grad_x.stride(-1) != 1:
                    grad_x = grad_x.contiguous()
            threshold, scale = _threshold(ctx.p)
            rows, groups, warps = TILES["up"]
            blocks = -(-m // rows)
            programs = _programs(blocks, x2.device)
            per_program = -(-blocks // programs)
            programs = -(-blocks // per_program) if blocks else 0
            rank_pad = _rank_pad(r)
            parts = torch.empty(programs, r, k, dtype=torch.float32, device=x2.device)
            if programs:
                target = grad_x if need_x else x2  # not written without UPDATE
                _kernels().up_kernel[(programs,)](
                    target, x2, u, a, parts, m, r, x2.stride(0), target.stride(0), ctx.seed,
                    _groups_per_row(k), threshold, scale, K=k, BLOCKS=per_program, UPDATE=need_x, G=groups,
                    BM=rows, RP=rank_pad, UPCAST=interpreting(), PRECISION=_precision(x2.dtype), num_warps=warps)
            if need_a:
                grad_a = parts.sum(0).to(ctx.lora_dtypes[0])
            if need_x:
                grad_x = grad_x.view(ctx.input_shape)
        return grad_x, grad_a, grad_b, None, None, None, None, None


def lora_linear(x: torch.Tensor, lora_a: torch.Tensor, lora_b: torch.Tensor, weight: torch.Tensor,
                bias: torch.Tensor | None, scaling: float, p: float, seed: int | None = None) -> torch.Tensor:
    """``x @ weight^T + bias + scaling · dropout(x, p) @ lora_a^T @ lora_b^T`` in ``x``'s dtype,
    with gradients for ``x``, ``lora_a`` and ``lora_b`` (``weight`` and ``bias``: frozen, already in
    ``x``'s dtype; ``lora_a`` (r, in) and ``lora_b`` (out, r) in any float dtype, their gradients
    in it). ``seed``: the dropout's (by default drawn from PyTorch's CPU generator)."""
    if weight.requires_grad or (bias is not None and bias.requires_grad):
        raise ValueError("lora_linear: the base weight and bias must be frozen (no gradient)")
    if seed is None:
        seed = int(torch.randint(0, 2**31 - 1, ()).item())
    with torch.autocast(x.device.type, enabled=False):
        return _LoRALinear.apply(x, lora_a, lora_b, weight, bias, float(scaling), float(p), seed)


def hopper_report(k: int = 768, r: int = 8, arch: int = 90) -> dict[str, dict]:
    """What Triton's compiler and ``ptxas`` (both in Triton's wheel) make of each kernel with
    :data:`TILES`, for bf16 inputs of width ``k``, rank ``r`` and a GPU of compute capability
    ``arch`` (90: H100, H200), without a GPU: {kernel: {"registers", "spill_bytes",
    "shared_bytes"}} per thread, per thread, per program. The arguments are specialised as Triton
    specialises them at run time (pointers and the multiples of 16 among the strides)."""
    import re
    import subprocess
    import tempfile

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.backends.nvidia.compiler import get_ptxas
    from triton.compiler import ASTSource

    kernels = _kernels()
    groups = _groups_per_row(k)
    types = {"X": "*bf16", "A": "*bf16", "H": "*bf16", "GX": "*bf16", "U": "*bf16", "PART": "*fp32", "OUT": "*i8",
             "M": "i32", "R": "i32", "seed": "i32", "threshold": "i32", "scale": "fp32",
             "stride_x": "i32", "stride_gx": "i32", "groups_per_row": "i32"}
    multiples = {"stride_x": k, "stride_gx": k, "groups_per_row": groups}
    common = {"K": k, "RP": _rank_pad(r), "UPCAST": False, "PRECISION": "tf32"}
    plans = {"down": (kernels.down_kernel, common), "up": (kernels.up_kernel, {**common, "BLOCKS": 4, "UPDATE": True}),
             "mask": (kernels.mask_kernel, {"K": k})}
    report = {}
    for name, (kernel, constants) in plans.items():
        rows, group, warps = TILES[name]
        constants = {**constants, "G": group, "BM": rows}
        names = kernel.arg_names
        signature = {n: "constexpr" if n in constants else types[n] for n in names}
        aligned = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names) if n not in constants
                   and (types[n].startswith("*") or multiples.get(n, 1) % 16 == 0)}
        source = ASTSource(fn=kernel, signature=signature, attrs=aligned,
                           constexprs={(names.index(n),): v for n, v in constants.items()})
        compiled = triton.compile(source, target=GPUTarget("cuda", arch, 32), options={"num_warps": warps})
        with tempfile.NamedTemporaryFile("w", suffix=".ptx") as ptx:
            ptx.write(compiled.asm["ptx"])
            ptx.flush()
            log = subprocess.run([get_ptxas(arch).path, "-v", f"--gpu-name=sm_{arch}a", ptx.name, "-o", os.devnull],
                                 capture_output=True, text=True, check=True).stderr
        report[name] = {"registers": int(re.search(r"Used (\d+) registers", log).group(1)),
                        "spill_bytes": int(re.search(r"(\d+) bytes spill stores", log).group(1)),
                        "shared_bytes": int(compiled.metadata.shared)}
    return report


def reference(x: torch.Tensor, lora_a: torch.Tensor, lora_b: torch.Tensor, weight: torch.Tensor,
              bias: torch.Tensor | None, scaling: float, p: float, keep: torch.Tensor) -> torch.Tensor:
    """:func:`lora_linear` in plain PyTorch with the mask ``keep`` (bool, x's shape flattened to
    rows): the tests' reference, and what PEFT's LoRA layer computes with that dropout mask."""
    _, scale = _threshold(p)
    dropped = (x.reshape(keep.shape) * keep * scale).view(x.shape)
    out = torch.nn.functional.linear(x, weight, bias)
    return out + scaling * torch.nn.functional.linear(torch.nn.functional.linear(dropped, lora_a.to(x.dtype)),
                                                      lora_b.to(x.dtype))

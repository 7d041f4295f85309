"""Triton kernels for the element-wise work of a LoRA training step on a GPU, each with its own
autograd function: the dropout's mask drawn in registers, never written or kept.

On a GPU the LA step is bound by passes over its activations, not by its matrix products
(benchmarks/results/README.md). Two places make most of those passes around the frozen body:

**A LoRA ``Linear`` with dropout.** PEFT's layer computes ``base(x) + s · lora_B(lora_A(dropout(x)))``.
With the fast forward of :mod:`modsent.training.fastpath`, a training step still makes, for each
such layer, the dropout's mask and its output (a pass over the layer's input, and an input-sized
tensor and mask kept for the backward), the rank-r product of that output, then in the backward
the input-sized gradient of the dropout's output (a rank-r product), its masking (another pass)
and its sum into the input's gradient (another). The LA trains LoRA on the query, key and value
of every layer: 36 such layers. :func:`lora_linear` computes the same layer with:

- forward: the base product (cuBLAS), one Triton kernel that draws the dropout mask in registers
  and computes ``h = dropout(x) @ A^T`` (a single read of ``x``; nothing input-sized written),
  and ``out += s · h @ B^T`` (cuBLAS, into the base product's output). Saved: ``x`` itself
  (one tensor for the query, key and value under the bf16 stream), ``h`` (rank r) and the seed;
- backward: ``grad_x = g @ W`` (cuBLAS), ``u = s · g @ B`` and ``grad_B`` (rank-r products), and
  one Triton kernel that draws the same mask again and, per tile, adds ``mask · (u @ A) / (1 - p)``
  to ``grad_x`` in place and accumulates ``grad_A = u^T @ dropout(x)`` (per-program partial sums,
  added in a fixed order: deterministic).

**Dropout, residual add and LayerNorm** after each attention output and feed-forward output
(24 a step in the LA): three kernels forward (the mask and the dropped copy, the sum, the norm)
and two to three backward. :func:`dropout_add_norm` is one kernel each way, a program per few
whole rows: the forward writes the output, the sum and each row's mean and 1/std (what the
backward needs), the backward the two inputs' gradients, drawing the mask again. It rounds as the
eager steps do (the dropout's output in its input's dtype, the sum in the promoted dtype, the
norm in fp32 from it) and takes a frozen norm's weights (the LA's).

The masks are drawn from a seed taken from PyTorch's CPU generator at each call (so a seeded run
and a resumed one, whose checkpoint holds that generator, draw the same masks) by Triton's
Philox generator: eight 16-bit draws per Philox call (one call per 8 elements instead of one
per element, as PyTorch's own dropout kernel shares its draws), so ``p`` is rounded to a
multiple of 1/65,536 (0.1 drops 6,554/65,536 = 0.1000061 of the elements) and the kept values
are scaled by the inverse of that kept share: the same distribution as ``nn.Dropout``, up to that
rounding, not the same draws. An element's draw depends on its row and column only, not on the
kernels' tiles. :func:`dropout_mask` returns the mask a call draws (the tests compute each
function with it in plain PyTorch, :func:`reference` and :func:`norm_reference`, and compare
outputs and gradients).

Kernels run on CUDA tensors, or on CPU tensors under Triton's interpreter (``TRITON_INTERPRET=1``
set before Triton is imported, as the tests do off a GPU; its products are computed in fp32
there, numpy has no bf16, and it rounds to bf16 by truncation, where a GPU rounds to nearest).
:func:`supported` says whether a call can use them; :func:`modsent.training.fastpath.fuse_lora_dropout`
and :func:`modsent.training.fastpath.fuse_residual_norms` (``kernel="triton"``) route a model's
layers here. :func:`hopper_report` compiles them for an H100/H200 without one. Triton ships with
PyTorch's CUDA wheels; the CPU install has none.
"""

from __future__ import annotations

import functools
import importlib
import os

import torch
from torch.autograd.function import once_differentiable

# Each kernel's tile: the LoRA kernels' (rows, groups of 8 columns, warps), one Philox call
# drawing a group's 8 masks, and for the backward's also the programs per multiprocessor that share
# its row blocks; the norm's (rows, warps), whole rows. The masks do not depend on the
# tiles (an element's draw is fixed by its row and column), so benchmarks/triton_kernels.py can
# try others on a GPU. The defaults keep every kernel's registers within what lets two or more
# programs share a multiprocessor without spilling, as ptxas reports for a Hopper GPU
# (hopper_report; the tests hold them there).
TILES = {"down": (64, 8, 8), "up": (32, 8, 8, 2), "mask": (64, 8, 4), "norm": (4, 8)}  # up: + programs per SM
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


def runs_on(device: str | torch.device) -> bool:
    """Whether the kernels can run on ``device``: CUDA with Triton installed, or the CPU under
    Triton's interpreter."""
    if not triton_available():
        return False
    kind = torch.device(device).type
    if kind == "cuda":
        return not interpreting()
    return kind == "cpu" and interpreting()


def supported(x: torch.Tensor) -> bool:
    """Whether the kernels can run on ``x``'s device (:func:`runs_on`)."""
    return runs_on(x.device)


def _kernels():
    """The module of jitted kernels (imported on first use: it imports Triton)."""
    from modsent.training import _triton_kernels

    return _triton_kernels


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
    """The keep mask (bool, ``shape`` = (rows, columns)) that :func:`lora_linear` and
    :func:`dropout_add_norm` draw for an input of that shape with dropout ``p`` and ``seed``."""
    m, k = shape
    threshold, _ = _threshold(p)
    out = torch.empty(m, k, dtype=torch.int8, device=device)
    rows, groups, warps = TILES["mask"]
    if m and k:
        _kernels().mask_kernel[(-(-m // rows),)](out, m, seed, _groups_per_row(k), threshold, K=k,
                                                 G=groups, BM=rows, num_warps=warps)
    return out.bool()


def _programs(blocks: int, device: torch.device, per_multiprocessor: int) -> int:
    """How many programs share the backward's row blocks (each writes a partial sum of A's
    gradient, so fewer programs write fewer of them); 4 in the interpreter."""
    if device.type == "cuda":
        target = per_multiprocessor * torch.cuda.get_device_properties(device).multi_processor_count
    else:
        target = 4
    return max(1, min(blocks, target))


def _seed(seed: int | None) -> int:
    """``seed``, or one drawn from PyTorch's CPU generator (seeded per step by the loops)."""
    return int(torch.randint(0, 2**31 - 1, ()).item()) if seed is None else seed


def _rows(t: torch.Tensor) -> torch.Tensor:
    """``t`` as rows of its last dimension, each contiguous (a view where the layout allows)."""
    rows = t.reshape(-1, t.shape[-1])
    return rows if rows.stride(-1) == 1 else rows.contiguous()


class _LoRALinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, lora_a, lora_b, weight, bias, scaling, p, seed):
        x2 = _rows(x)
        (m, k), dtype = x2.shape, x2.dtype
        a, b = lora_a.to(dtype).contiguous(), lora_b.to(dtype)
        r = a.shape[0]
        threshold, scale = _threshold(p)
        h = torch.empty(m, r, dtype=dtype, device=x.device)
        if m:
            rows, groups, warps = TILES["down"]
            _kernels().down_kernel[(-(-m // rows),)](
                x2, a, h, m, x2.stride(0), seed, _groups_per_row(k), threshold, scale, K=k, R=r,
                G=groups, BM=rows, RP=_rank_pad(r), UPCAST=interpreting(), PRECISION=_precision(dtype),
                num_warps=warps)
        out = torch.addmm(bias, x2, weight.t()) if bias is not None else x2 @ weight.t()
        out = torch.addmm(out, h, b.t(), alpha=scaling)
        ctx.save_for_backward(x2, h, a, b)
        ctx.weight, ctx.scaling, ctx.seed, ctx.p = weight, scaling, seed, p
        ctx.input_shape, ctx.lora_dtypes = x.shape, (lora_a.dtype, lora_b.dtype)
        return out.view(*x.shape[:-1], out.shape[-1])

    @staticmethod
    @once_differentiable  # it writes the input's gradient in place
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
                grad_x = _rows(g @ ctx.weight)
            threshold, scale = _threshold(ctx.p)
            rows, groups, warps, per_multiprocessor = TILES["up"]
            blocks = -(-m // rows)
            programs = _programs(blocks, x2.device, per_multiprocessor)
            per_program = -(-blocks // programs)
            programs = -(-blocks // per_program) if blocks else 0
            rank_pad = _rank_pad(r)
            parts = torch.empty(programs if need_a else 0, r, k, dtype=torch.float32, device=x2.device)
            if programs:
                target = grad_x if need_x else x2  # not written without UPDATE
                _kernels().up_kernel[(programs,)](
                    target, x2, u, a, parts, m, x2.stride(0), target.stride(0), ctx.seed,
                    _groups_per_row(k), threshold, scale, K=k, R=r, BLOCKS=per_program, UPDATE=need_x,
                    WANT_A=need_a, G=groups,
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
    with torch.autocast(x.device.type, enabled=False):
        return _LoRALinear.apply(x, lora_a, lora_b, weight, bias, float(scaling), float(p), _seed(seed))


class _DropoutAddNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, residual, weight, bias, eps, p, seed, out_dtype):
        h2, r2 = _rows(hidden), _rows(residual)
        m, d = h2.shape
        y = torch.empty(m, d, dtype=out_dtype, device=hidden.device)
        s = torch.empty(m, d, dtype=torch.promote_types(hidden.dtype, residual.dtype), device=hidden.device)
        mean = torch.empty(m, dtype=torch.float32, device=hidden.device)
        rstd = torch.empty_like(mean)
        threshold, scale = _threshold(p)
        rows, warps = TILES["norm"]
        if m:
            _kernels().norm_forward_kernel[(-(-m // rows),)](
                h2, r2, h2 if weight is None else weight, h2 if bias is None else bias, y, s, mean, rstd, m,
                h2.stride(0), r2.stride(0), seed, _groups_per_row(d), threshold, scale, eps, D=d, BD=_row_width(d),
                BM=rows, HAS_W=weight is not None, HAS_B=bias is not None, DROP=p > 0, num_warps=warps)
        ctx.save_for_backward(s, mean, rstd, weight)
        ctx.seed, ctx.p, ctx.dtypes = seed, p, (hidden.dtype, residual.dtype)
        ctx.shapes = (hidden.shape, residual.shape)
        return y.view(hidden.shape)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        s, mean, rstd, weight = ctx.saved_tensors
        want_h, want_r = ctx.needs_input_grad[:2]
        m, d = s.shape
        g = _rows(grad)
        dh = torch.empty(m, d, dtype=ctx.dtypes[0], device=s.device) if want_h else None
        dr = torch.empty(m, d, dtype=ctx.dtypes[1], device=s.device) if want_r else None
        threshold, scale = _threshold(ctx.p)
        rows, warps = TILES["norm"]
        if m and (want_h or want_r):
            _kernels().norm_backward_kernel[(-(-m // rows),)](
                g, s, s if weight is None else weight, mean, rstd, s if dh is None else dh, s if dr is None else dr,
                m, g.stride(0), ctx.seed, _groups_per_row(d), threshold, scale, D=d, BD=_row_width(d), BM=rows,
                HAS_W=weight is not None, DROP=ctx.p > 0, WANT_H=want_h, WANT_R=want_r, num_warps=warps)
        return (None if dh is None else dh.view(ctx.shapes[0]), None if dr is None else dr.view(ctx.shapes[1]),
                None, None, None, None, None, None)


def _row_width(d: int) -> int:
    """A row's tile: its width rounded up to a power of 2, at least 8 (one Philox group)."""
    return max(8, 1 << (d - 1).bit_length())


def dropout_add_norm(hidden: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor | None,
                     bias: torch.Tensor | None, eps: float, p: float, out_dtype: torch.dtype,
                     seed: int | None = None) -> torch.Tensor:
    """``LayerNorm(dropout(hidden, p) + residual)`` over the last dimension, as ``out_dtype``, with
    gradients for ``hidden`` and ``residual`` (``weight`` and ``bias``: the norm's, frozen, in the
    dtype the norm computes with). Rounded as eager PyTorch rounds the three steps: the dropout's
    output in ``hidden``'s dtype, the sum in the inputs' promoted dtype, the norm in fp32 from
    it. One kernel each way: the forward keeps the sum and each row's mean and 1/std, the
    backward draws the dropout's mask again (:func:`dropout_mask` of the rows, seed and ``p``)."""
    if (weight is not None and weight.requires_grad) or (bias is not None and bias.requires_grad):
        raise ValueError("dropout_add_norm: the norm's weight and bias must be frozen (no gradient)")
    if hidden.shape != residual.shape:
        raise ValueError(f"dropout_add_norm: hidden {tuple(hidden.shape)} and residual {tuple(residual.shape)} differ")
    with torch.autocast(hidden.device.type, enabled=False):
        return _DropoutAddNorm.apply(hidden, residual, weight, bias, float(eps), float(p), _seed(seed), out_dtype)


def norm_reference(hidden: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor | None,
                   bias: torch.Tensor | None, eps: float, p: float, out_dtype: torch.dtype,
                   keep: torch.Tensor) -> torch.Tensor:
    """:func:`dropout_add_norm` in plain PyTorch with the mask ``keep`` (bool, rows x width): what
    BERT's output modules compute under autocast with that dropout mask (the tests' reference)."""
    _, scale = _threshold(p)
    dropped = hidden * keep.view(hidden.shape) * scale
    total = dropped + residual
    return torch.nn.functional.layer_norm(total.float(), (hidden.shape[-1],),
                                          None if weight is None else weight.float(),
                                          None if bias is None else bias.float(), eps).to(out_dtype)


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
    lora_types = {"X": "*bf16", "A": "*bf16", "H": "*bf16", "GX": "*bf16", "U": "*bf16", "PART": "*fp32", "OUT": "*i8",
                  "M": "i32", "seed": "i32", "threshold": "i32", "scale": "fp32",
                  "stride_x": "i32", "stride_gx": "i32", "groups_per_row": "i32"}
    # the norm's with the bf16 stream: bf16 in and out, fp32 row statistics
    norm_types = {**{name: "*bf16" for name in ("H", "R", "W", "B", "Y", "S", "DY", "DH", "DR")},
                  "MEAN": "*fp32", "RSTD": "*fp32", "M": "i32", "seed": "i32", "threshold": "i32", "scale": "fp32",
                  "eps": "fp32", "stride_h": "i32", "stride_r": "i32", "stride_dy": "i32", "groups_per_row": "i32"}
    multiples = {"stride_x": k, "stride_gx": k, "stride_h": k, "stride_r": k, "stride_dy": k, "groups_per_row": groups}
    common = {"K": k, "R": r, "RP": _rank_pad(r), "UPCAST": False, "PRECISION": "tf32"}
    norm = {"D": k, "BD": _row_width(k), "HAS_W": True, "DROP": True}
    plans = {"down": (kernels.down_kernel, common, lora_types),
             "up": (kernels.up_kernel, {**common, "BLOCKS": 4, "UPDATE": True, "WANT_A": True}, lora_types),
             "mask": (kernels.mask_kernel, {"K": k}, lora_types),
             "norm_forward": (kernels.norm_forward_kernel, {**norm, "HAS_B": True}, norm_types),
             "norm_backward": (kernels.norm_backward_kernel, {**norm, "WANT_H": True, "WANT_R": True}, norm_types)}
    report = {}
    for name, (kernel, constants, types) in plans.items():
        if name.startswith("norm"):
            (rows, warps), group = TILES["norm"], None
        else:
            rows, group, warps = TILES[name][:3]
        constants = {**constants, "BM": rows, **({} if group is None else {"G": group})}
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

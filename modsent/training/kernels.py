"""Triton kernels for the element-wise work of a LoRA training step on a GPU, each with its own
autograd function: the dropout's mask drawn in registers, never written or kept.

On a GPU the LA step is bound by passes over its activations, not by its matrix products
(benchmarks/results/README.md). Two places make most of those passes around the frozen body,
and a third is the MLM loss:

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

The query, key and value read one input: :func:`lora_linears` computes up to three such layers
with the same two kernels for several adapters (each with its own seed and mask): one read of
``x`` forward for every branch, and backward the base products' input gradients summed by cuBLAS
into one tensor and one pass adding every masked branch into it (the layers alone: three reads
of ``x`` each way, three input-sized gradients written, and autograd's two sums of them).

**Dropout, residual add and LayerNorm** after each attention output and feed-forward output
(24 a step in the LA): three kernels forward (the mask and the dropped copy, the sum, the norm)
and two to three backward. :func:`dropout_add_norm` is one kernel each way, a program per few
whole rows: the forward writes the output, the sum and each row's mean and 1/std (what the
backward needs), the backward the two inputs' gradients, drawing the mask again. It rounds as the
eager steps do (the dropout's output in its input's dtype, the sum in the promoted dtype, the
norm in fp32 from it) and takes a frozen norm's weights (the LA's).

**The MLM loss's cross-entropy** over the tied decoder's bf16 logits (masked positions x
vocabulary: 4,915 x 50,000 a step in the LA). Eager computes it as a fp32 copy of the logits, their
log-softmax (kept for the backward), the loss's gradient as a dense fp32 tensor, the log-softmax's
backward and a cast back to bf16: about 36 bytes an element read or written where
:func:`cross_entropy` takes 6, one kernel each way, a program per row: the forward reads the row
once (each lane keeps a running maximum and its rescaled sum of exponentials) and keeps the row's
log-sum-exp, the backward reads the row again and writes ``g · (softmax - onehot)`` in the
logits' dtype. About 7 GB less traffic a step, and the bf16 logits kept instead of their fp32
log-softmax.

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
:func:`supported` says whether a call can use them; :func:`modsent.training.fastpath.fuse_lora_dropout`,
:func:`modsent.training.fastpath.fuse_residual_norms` (``kernel="triton"``) and
:func:`modsent.training.fastpath.fuse_cross_entropy` route a model's layers and MLM loss here.
:func:`hopper_report` compiles them for an H100/H200 without one. Triton ships with PyTorch's CUDA
wheels; the CPU install has none.
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
TILES = {"down": (64, 8, 8), "up": (32, 8, 8, 2), "mask": (64, 8, 4), "norm": (4, 8),  # up: + programs per SM
         "down_qkv": (64, 4, 8), "up_qkv": (16, 8, 8, 2),  # the kernels for 2-3 adapters reading one input
         "ce": (2048, 8)}  # the cross-entropy's: (columns a pass, warps), a program per row
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


def _down(x2: torch.Tensor, adapters: list[torch.Tensor], seeds: list[int], p: float) -> list[torch.Tensor]:
    """``h_j = dropout_j(x2) @ A_j^T`` for the (at most 3) adapters ``A_j`` (r, k) reading ``x2``
    (rows, k), each with the mask of its seed, in one kernel: one read of ``x2``."""
    (m, k), dtype = x2.shape, x2.dtype
    r = adapters[0].shape[0]
    threshold, scale = _threshold(p)
    hs = [torch.empty(m, r, dtype=dtype, device=x2.device) for _ in adapters]
    if m:
        rows, groups, warps = TILES["down" if len(adapters) == 1 else "down_qkv"]
        a, h = adapters + adapters[:1] * (3 - len(adapters)), hs + hs[:1] * (3 - len(hs))
        s = seeds + seeds[:1] * (3 - len(seeds))
        _kernels().down_kernel[(-(-m // rows),)](
            x2, a[0], h[0], m, x2.stride(0), s[0], _groups_per_row(k), threshold, scale, a[1], h[1], s[1], a[2], h[2],
            s[2], K=k, R=r, N=len(adapters), G=groups, BM=rows, RP=_rank_pad(r), UPCAST=interpreting(),
            PRECISION=_precision(dtype), num_warps=warps)
    return hs


def _up(grad_x: torch.Tensor | None, x2: torch.Tensor, us: list[torch.Tensor], adapters: list[torch.Tensor],
        seeds: list[int], p: float, want_a: bool) -> list[torch.Tensor] | None:
    """Add ``Σ_j mask_j · (u_j @ A_j) · scale`` to ``grad_x`` in place (unless None) and return
    each ``A_j``'s gradient ``u_j^T @ dropout_j(x2)`` in fp32 (if ``want_a``), in one kernel: one
    read of ``x2`` and one of ``grad_x``. The sums over rows go to per-program partial sums,
    added in a fixed order: deterministic."""
    m, k = x2.shape
    r = adapters[0].shape[0]
    threshold, scale = _threshold(p)
    rows, groups, warps, per_multiprocessor = TILES["up" if len(adapters) == 1 else "up_qkv"]
    blocks = -(-m // rows)
    programs = _programs(blocks, x2.device, per_multiprocessor)
    per_program = -(-blocks // programs)
    programs = -(-blocks // per_program) if blocks else 0
    parts = [torch.empty(programs if want_a else 0, r, k, dtype=torch.float32, device=x2.device) for _ in adapters]
    if programs:
        target = grad_x if grad_x is not None else x2  # not written without UPDATE
        u, a, part = (t + t[:1] * (3 - len(t)) for t in (us, adapters, parts))
        s = seeds + seeds[:1] * (3 - len(seeds))
        _kernels().up_kernel[(programs,)](
            target, x2, u[0], a[0], part[0], m, x2.stride(0), target.stride(0), s[0], _groups_per_row(k), threshold,
            scale, u[1], a[1], part[1], s[1], u[2], a[2], part[2], s[2], K=k, R=r, N=len(adapters),
            BLOCKS=per_program, UPDATE=grad_x is not None, WANT_A=want_a, G=groups, BM=rows, RP=_rank_pad(r),
            UPCAST=interpreting(), PRECISION=_precision(x2.dtype), num_warps=warps)
    return [part.sum(0) for part in parts] if want_a else None


def lora_linear(x: torch.Tensor, lora_a: torch.Tensor, lora_b: torch.Tensor, weight: torch.Tensor,
                bias: torch.Tensor | None, scaling: float, p: float, seed: int | None = None) -> torch.Tensor:
    """``x @ weight^T + bias + scaling · dropout(x, p) @ lora_a^T @ lora_b^T`` in ``x``'s dtype,
    with gradients for ``x``, ``lora_a`` and ``lora_b`` (``weight`` and ``bias``: frozen, already in
    ``x``'s dtype; ``lora_a`` (r, in) and ``lora_b`` (out, r) in any float dtype, their gradients
    in it). ``seed``: the dropout's (by default drawn from PyTorch's CPU generator)."""
    if weight.requires_grad or (bias is not None and bias.requires_grad):
        raise ValueError("lora_linear: the base weight and bias must be frozen (no gradient)")
    with torch.autocast(x.device.type, enabled=False):
        return _LoRALinears.apply(x, (float(scaling),), float(p), (_seed(seed),), lora_a, lora_b, weight, bias)[0]


class _LoRALinears(torch.autograd.Function):
    """1 to 3 LoRA layers reading one input (:func:`lora_linear`, :func:`lora_linears`): ``flat``
    holds each layer's (A, B, weight, bias); their dropouts share ``p`` and their adapters a rank.
    Forward, the down kernel draws each mask and computes each ``h = dropout(x) @ A^T``; backward,
    B's gradient is a product with ``h``, and the up kernel adds each masked branch's gradient to
    the input's in place and computes A's."""

    @staticmethod
    def forward(ctx, x, scalings, p, seeds, *flat):
        ctx.set_materialize_grads(False)  # a layer whose output is not used gets no gradient (None)
        x2 = _rows(x)
        dtype, n = x2.dtype, len(scalings)
        layers = [flat[4 * j:4 * j + 4] for j in range(n)]
        a_s = [a.to(dtype).contiguous() for a, _, _, _ in layers]
        b_s = [b.to(dtype) for _, b, _, _ in layers]
        hs = _down(x2, a_s, list(seeds), p)
        outs = []
        for (_, _, weight, bias), h, b, scaling in zip(layers, hs, b_s, scalings):
            out = torch.addmm(bias, x2, weight.t()) if bias is not None else x2 @ weight.t()
            outs.append(torch.addmm(out, h, b.t(), alpha=scaling).view(*x.shape[:-1], weight.shape[0]))
        ctx.save_for_backward(x2, *hs, *a_s, *b_s)
        ctx.weights = [weight for _, _, weight, _ in layers]
        ctx.scalings, ctx.seeds, ctx.p, ctx.input_shape = scalings, list(seeds), p, x.shape
        ctx.lora_dtypes = [(a.dtype, b.dtype) for a, b, _, _ in layers]
        return tuple(outs)

    @staticmethod
    @once_differentiable  # it writes the input's gradient in place
    def backward(ctx, *grads):
        n = len(ctx.scalings)
        saved = ctx.saved_tensors
        x2, hs, a_s, b_s = saved[0], saved[1:1 + n], saved[1 + n:1 + 2 * n], saved[1 + 2 * n:]
        need = ctx.needs_input_grad
        need_x = need[0]
        used = [j for j, grad in enumerate(grads) if grad is not None]  # an unused output: no gradient
        want_a = any(need[4 + 4 * j] for j in used)
        flat = [None] * (4 * n)
        grad_x, us = None, []
        for j in used:
            grad = grads[j]
            g = grad.reshape(-1, grad.shape[-1])
            if g.dtype != x2.dtype:
                g = g.to(x2.dtype)
            if need[5 + 4 * j]:
                flat[4 * j + 1] = (g.t() @ hs[j]).to(ctx.lora_dtypes[j][1]).mul_(ctx.scalings[j])
            if need_x or want_a:
                us.append((g @ b_s[j]).mul_(ctx.scalings[j]))  # (M, r): the gradient of h, scaled
            if need_x:  # the base products' gradients summed by cuBLAS into one tensor
                grad_x = _rows(g @ ctx.weights[j]) if grad_x is None else grad_x.addmm_(g, ctx.weights[j])
        if not used or not (need_x or want_a):
            return (None, None, None, None, *flat)
        parts = _up(grad_x if need_x else None, x2, us, [a_s[j] for j in used], [ctx.seeds[j] for j in used], ctx.p,
                    want_a)
        for position, j in enumerate(used):
            if need[4 + 4 * j]:
                flat[4 * j] = parts[position].to(ctx.lora_dtypes[j][0])
        return (grad_x.view(ctx.input_shape) if need_x else None, None, None, None, *flat)


def lora_linears(x: torch.Tensor, layers, p: float, seeds=None) -> tuple[torch.Tensor, ...]:
    """:func:`lora_linear` of up to 3 layers reading the one input ``x`` (an attention's query,
    key and value), each with its own dropout mask: ``layers`` is a sequence of (lora_a, lora_b,
    weight, bias, scaling), the adapters of one rank; ``p`` their dropout; ``seeds`` one per
    layer (by default drawn from PyTorch's CPU generator in the layers' order, as their own calls
    in that order would draw them). One kernel reads ``x`` for all the branches forward, and one reads it
    and writes the input's gradient once backward, with the base products' input gradients
    summed into it by cuBLAS, where the layers' own calls read ``x`` and write or add an
    input-sized gradient once each. The same outputs and gradients as the layers' calls with
    those seeds (a layer whose output takes no part in the backward gets none)."""
    layers = list(layers)
    if not 1 <= len(layers) <= 3:
        raise ValueError(f"lora_linears: {len(layers)} layers; expected 1 to 3")
    ranks = {tuple(lora_a.shape) for lora_a, _, _, _, _ in layers}
    if len(ranks) != 1 or next(iter(ranks))[1] != x.shape[-1]:
        raise ValueError(f"lora_linears: adapters of shapes {sorted(ranks)} for an input of width {x.shape[-1]}; "
                         "expected one rank, and the input's width")
    for _, _, weight, bias, _ in layers:
        if weight.requires_grad or (bias is not None and bias.requires_grad):
            raise ValueError("lora_linears: the base weights and biases must be frozen (no gradient)")
    seeds = [_seed(None) for _ in layers] if seeds is None else [int(seed) for seed in seeds]
    if len(seeds) != len(layers):
        raise ValueError(f"lora_linears: {len(seeds)} seeds for {len(layers)} layers")
    flat = [t for lora_a, lora_b, weight, bias, _ in layers for t in (lora_a, lora_b, weight, bias)]
    with torch.autocast(x.device.type, enabled=False):
        return _LoRALinears.apply(x, tuple(float(layer[4]) for layer in layers), float(p), tuple(seeds), *flat)


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


def cross_entropy_rows(x2: torch.Tensor, targets: torch.Tensor, ignore_index: int = -100
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """(each row's loss, each row's log-sum-exp), both fp32, of the 2-d logits ``x2`` (rows with a
    unit column stride) against the 1-d contiguous ``targets``: :func:`cross_entropy`'s forward
    kernel, without autograd (the chunked loss of :mod:`modsent.training.vocab_loss` calls it
    chunk by chunk)."""
    m, v = x2.shape
    lse = torch.empty(m, dtype=torch.float32, device=x2.device)
    loss = torch.empty(m, dtype=torch.float32, device=x2.device)
    columns, warps = TILES["ce"]
    if m:
        _kernels().ce_forward_kernel[(m,)](x2, targets, lse, loss, x2.stride(0), ignore_index, V=v, BV=columns,
                                           num_warps=warps)
    return loss, lse


def cross_entropy_rows_grad(x2: torch.Tensor, targets: torch.Tensor, lse: torch.Tensor, g: torch.Tensor,
                            ignore_index: int, out: torch.Tensor) -> torch.Tensor:
    """``out`` (rows with a unit column stride, ``x2``'s shape) = ``g[row]`` · (softmax(x2[row]) -
    onehot(target)) in ``out``'s dtype, from :func:`cross_entropy_rows`' log-sum-exp: its
    backward kernel. ``g`` is 1-d with any stride (0: one value for every row); ``out`` may be
    ``x2`` itself (each element is read before it is written, by the same program)."""
    m, v = x2.shape
    columns, warps = TILES["ce"]
    if m:
        _kernels().ce_backward_kernel[(m,)](x2, targets, lse, g, out, x2.stride(0), out.stride(0), g.stride(0),
                                            ignore_index, V=v, BV=columns, num_warps=warps)
    return out


class _CrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, targets, ignore_index):
        x2 = _rows(logits)
        t = targets.reshape(-1).contiguous()
        loss, lse = cross_entropy_rows(x2, t, ignore_index)
        ctx.save_for_backward(x2, t, lse)
        ctx.ignore_index, ctx.shape = ignore_index, logits.shape
        return loss.view(logits.shape[:-1])

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        x2, t, lse = ctx.saved_tensors
        if not ctx.needs_input_grad[0]:
            return None, None, None
        # a sum's or a mean's gradient is one value expanded: stride 0, no copy
        dx = cross_entropy_rows_grad(x2, t, lse, grad.reshape(-1), ctx.ignore_index, torch.empty_like(x2))
        return dx.view(ctx.shape), None, None


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor, ignore_index: int = -100) -> torch.Tensor:
    """Each row's cross-entropy ``logsumexp(logits) - logits[target]`` (``reduction="none"``), in
    fp32 for logits of any float dtype, with their gradient in the logits' dtype: what
    ``F.cross_entropy(logits.float(), targets, reduction="none", ignore_index=...)`` computes (0 and
    no gradient where a target is ``ignore_index``; NaN, not an error, for a target outside the
    vocabulary). One kernel each way, a program per row: the forward reads the logits once and keeps
    each row's log-sum-exp, the backward reads them once more and writes their gradient (6 bytes an
    element for bf16 logits). Eager's way (a fp32 copy of the logits, log-softmax, the loss's
    gradient as a dense fp32 tensor, its log-softmax backward and the cast back) reads and writes at
    least 36: at the LA's 4,915 masked positions a step and a 50,000-word vocabulary, some 7 GB a
    step more. Classes along the last dimension (``F.cross_entropy`` takes dimension 1 of >2-d
    logits); int32 targets too; no double backward (``create_graph`` gives a gradient without
    one)."""
    if logits.dim() < 1 or targets.shape != logits.shape[:-1]:
        raise ValueError(f"cross_entropy: targets of shape {tuple(targets.shape)} for logits of shape "
                         f"{tuple(logits.shape)}; expected one target per row of logits")
    if targets.dtype not in (torch.int64, torch.int32) or not logits.is_floating_point():
        raise ValueError(f"cross_entropy: logits of {logits.dtype} and targets of {targets.dtype}; expected float "
                         "logits and integer targets")
    with torch.autocast(logits.device.type, enabled=False):
        return _CrossEntropy.apply(logits, targets, int(ignore_index))


def hopper_report(k: int = 768, r: int = 8, arch: int = 90, vocab: int = 50_000) -> dict[str, dict]:
    """What Triton's compiler and ``ptxas`` (both in Triton's wheel) make of each kernel with
    :data:`TILES`, for bf16 inputs of width ``k``, rank ``r``, logits of ``vocab`` words and a GPU
    of compute capability ``arch`` (90: H100, H200), without a GPU: {kernel: {"registers", "spill_bytes",
    "shared_bytes"}} per thread, per thread, per program; ``down_qkv`` and ``up_qkv`` are the
    LoRA kernels for three adapters reading one input (:func:`lora_linears`). The arguments are specialised as Triton
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
    lora_types = {**{name: "*bf16" for name in ("X", "A", "A1", "A2", "H", "H1", "H2", "GX", "U", "U1", "U2")},
                  "PART": "*fp32", "PART1": "*fp32", "PART2": "*fp32", "OUT": "*i8", "M": "i32", "seed": "i32",
                  "seed1": "i32", "seed2": "i32", "threshold": "i32", "scale": "fp32",
                  "stride_x": "i32", "stride_gx": "i32", "groups_per_row": "i32"}
    # the norm's with the bf16 stream: bf16 in and out, fp32 row statistics
    norm_types = {**{name: "*bf16" for name in ("H", "R", "W", "B", "Y", "S", "DY", "DH", "DR")},
                  "MEAN": "*fp32", "RSTD": "*fp32", "M": "i32", "seed": "i32", "threshold": "i32", "scale": "fp32",
                  "eps": "fp32", "stride_h": "i32", "stride_r": "i32", "stride_dy": "i32", "groups_per_row": "i32"}
    # the cross-entropy's: bf16 logits and their gradient, int64 targets, fp32 row sums, a sum's gradient (stride 0)
    ce_types = {"X": "*bf16", "DX": "*bf16", "T": "*i64", "LSE": "*fp32", "LOSS": "*fp32", "G": "*fp32",
                "stride_x": "i32", "stride_dx": "i32", "stride_g": "i32", "ignore_index": "i32"}
    multiples = {"stride_x": k, "stride_gx": k, "stride_h": k, "stride_r": k, "stride_dy": k, "groups_per_row": groups}
    ce_multiples = {"stride_x": vocab, "stride_dx": vocab, "stride_g": 0, "ignore_index": -100}
    common = {"K": k, "R": r, "RP": _rank_pad(r), "UPCAST": False, "PRECISION": "tf32"}
    norm = {"D": k, "BD": _row_width(k), "HAS_W": True, "DROP": True}
    up = {**common, "BLOCKS": 4, "UPDATE": True, "WANT_A": True}
    plans = {"down": (kernels.down_kernel, {**common, "N": 1}, lora_types),
             "up": (kernels.up_kernel, {**up, "N": 1}, lora_types),
             # an attention's query, key and value through one kernel each way (lora_linears)
             "down_qkv": (kernels.down_kernel, {**common, "N": 3}, lora_types),
             "up_qkv": (kernels.up_kernel, {**up, "N": 3}, lora_types),
             "mask": (kernels.mask_kernel, {"K": k}, lora_types),
             "norm_forward": (kernels.norm_forward_kernel, {**norm, "HAS_B": True}, norm_types),
             "norm_backward": (kernels.norm_backward_kernel, {**norm, "WANT_H": True, "WANT_R": True}, norm_types),
             "ce_forward": (kernels.ce_forward_kernel, {"V": vocab}, ce_types),
             "ce_backward": (kernels.ce_backward_kernel, {"V": vocab}, ce_types)}
    report = {}
    for name, (kernel, constants, types) in plans.items():
        sizes = multiples
        if name.startswith("ce"):
            (columns, warps), sizes = TILES["ce"], ce_multiples
            constants = {**constants, "BV": columns}
        elif name.startswith("norm"):
            rows, warps = TILES["norm"]
            constants = {**constants, "BM": rows}
        else:
            rows, group, warps = TILES[name][:3]
            constants = {**constants, "BM": rows, "G": group}
        names = kernel.arg_names
        signature = {n: "constexpr" if n in constants else types[n] for n in names}
        aligned = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names) if n not in constants
                   and (types[n].startswith("*") or sizes.get(n, 1) % 16 == 0)}
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
